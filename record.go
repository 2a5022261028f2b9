package caddyfairqueue

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage; larger bodies pass through and fall back to the estimate.
const maxUsageBody = 4 << 20

// usageRecorder passes the upstream's response through untouched — every
// Write goes straight to the client and Flush reaches the client through
// Unwrap — while it reads the usage the model server reports, from the
// JSON body or from the server-sent events of a stream.
type usageRecorder struct {
	caddyhttp.ResponseWriterWrapper
	counter llmapi.Counter

	status int
	// quota, when set, is the tenant's quota standing after this request
	// was charged: its x-ratelimit-* headers replace the upstream's.
	quota  *quota.Status
	stream *llmapi.StreamScanner
	body   bytes.Buffer
	tooBig bool
}

func newUsageRecorder(w http.ResponseWriter, c llmapi.Counter) *usageRecorder {
	return &usageRecorder{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, counter: c}
}

func (u *usageRecorder) WriteHeader(status int) {
	if u.status == 0 && status >= 200 {
		u.status = status
		if u.quota != nil {
			setRateLimitHeaders(u.Header(), *u.quota)
		}
		if isEventStream(u.Header().Get("Content-Type")) {
			u.stream = llmapi.NewStreamScanner(u.counter)
		}
	}
	u.ResponseWriterWrapper.WriteHeader(status)
}

// isEventStream reports whether a Content-Type is text/event-stream, with
// or without parameters, without mime.ParseMediaType's allocations on every
// response.
func isEventStream(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

func (u *usageRecorder) Write(p []byte) (int, error) {
	if u.status == 0 {
		u.WriteHeader(http.StatusOK)
	}
	n, err := u.ResponseWriterWrapper.Write(p)
	switch {
	case u.stream != nil:
		_, _ = u.stream.Write(p[:n])
	case !u.tooBig && u.body.Len()+n <= maxUsageBody:
		u.body.Write(p[:n])
	default:
		u.tooBig = true
		u.body = bytes.Buffer{}
	}
	return n, err
}

// ReadFrom keeps io.Copy from bypassing Write (the embedded wrapper would
// hand the reader to the client connection directly).
func (u *usageRecorder) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{u}, r)
}

type writerOnly struct{ io.Writer }

// usage returns what the model server reported, or the completion counted
// from the streamed text when a stream carried no usage.
func (u *usageRecorder) usage() (llmapi.Usage, bool) {
	if u.status < 200 || u.status >= 300 {
		return llmapi.Usage{}, false
	}
	if u.stream != nil {
		return u.stream.Result()
	}
	if u.tooBig || u.body.Len() == 0 {
		return llmapi.Usage{}, false
	}
	return llmapi.ParseUsage(u.body.Bytes())
}
