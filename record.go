package caddyfairqueue

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage; larger bodies pass through and fall back to the estimate.
const maxUsageBody = 4 << 20

// usageRecorder passes the upstream's response through untouched while it
// reads the usage the model server reports, from the JSON body or from the
// server-sent events of a stream.
type usageRecorder struct {
	caddyhttp.ResponseWriterWrapper
	counter llmapi.Counter

	status int
	// quota, when set, is the tenant's quota standing after this request
	// was charged: its x-ratelimit-* headers replace the upstream's.
	quota *quota.Status
	// provider: the upstream is a provider account (upstream_quota). Its
	// 429 is kept from the client (provider429), and providerWait is how
	// long it says the account is out of quota.
	provider     bool
	provider429  bool
	providerWait time.Duration
	// report is what the provider's answer said is left of the account
	// (reported: it said something), for the queue's ProviderLevel.
	report   fairqueue.ProviderReport
	reported bool
	stream   *llmapi.StreamScanner
	body     bytes.Buffer
	tooBig   bool
	// want is the response's Content-Length when it is to be kept (0:
	// unknown). A body that arrives in one write of that length is read
	// for its usage in place (parsed), never copied.
	want   int
	parsed bool
	used   llmapi.Usage
	usedOK bool
}

func newUsageRecorder(w http.ResponseWriter, c llmapi.Counter) *usageRecorder {
	return &usageRecorder{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, counter: c}
}

func (u *usageRecorder) WriteHeader(status int) {
	if u.provider429 {
		return
	}
	if u.provider && u.status == 0 && status >= 200 {
		u.providerWait = providerWait(u.Header(), status)
		u.report, u.reported = providerReport(u.Header())
		if status == http.StatusTooManyRequests {
			u.provider429 = true
			return
		}
	}
	if u.status == 0 && status >= 200 {
		u.status = status
		if u.provider {
			// The provider account's limits are the gateway's, not the
			// caller's.
			for _, k := range rateLimitHeaders {
				u.Header().Del(k)
			}
		}
		if u.quota != nil {
			setRateLimitHeaders(u.Header(), *u.quota)
		}
		if isEventStream(headerValue(u.Header(), "Content-Type")) {
			u.stream = llmapi.NewStreamScanner(u.counter)
		} else if cl := headerValue(u.Header(), "Content-Length"); cl != "" {
			if n, err := strconv.Atoi(cl); err == nil && n > 0 && n <= maxUsageBody {
				u.want = n
			}
		}
	}
	u.ResponseWriterWrapper.WriteHeader(status)
}

// headerValue is h.Get(key) for a key already in canonical form, without
// canonicalizing it again.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// isEventStream reports whether a Content-Type is text/event-stream, with
// or without parameters, without mime.ParseMediaType's allocations.
func isEventStream(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

func (u *usageRecorder) Write(p []byte) (int, error) {
	if u.provider429 {
		return len(p), nil // the provider's refusal never reaches the client
	}
	if u.status == 0 {
		u.WriteHeader(http.StatusOK)
	}
	n, err := u.ResponseWriterWrapper.Write(p)
	switch {
	case u.stream != nil:
		_, _ = u.stream.Write(p[:n])
	case u.parsed:
		// More than the Content-Length announced: its usage is not to be
		// trusted.
		u.parsed, u.tooBig = false, true
	case n == u.want && u.body.Len() == 0 && !u.tooBig:
		// p is the proxy's copy buffer, reused after this returns.
		u.used, u.usedOK = llmapi.ParseUsage(p[:n])
		u.parsed = true
	case !u.tooBig && u.body.Len()+n <= maxUsageBody:
		if u.body.Cap() == 0 && u.want > 0 {
			u.body.Grow(u.want)
		}
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

// FlushError flushes to the client, except a provider's refusal being
// swallowed: flushing would send the client a header never written.
func (u *usageRecorder) FlushError() error {
	if u.provider429 {
		return nil
	}
	return http.NewResponseController(u.ResponseWriter).Flush()
}

// providerWait reads how long a provider's response says its account is
// out of quota: on a 429, Retry-After-Ms, Retry-After (seconds or a date)
// or the x-ratelimit-reset-* of an exhausted dimension, else 1 s; on any
// other response, the reset of a dimension whose x-ratelimit-remaining-*
// is 0, else 0.
func providerWait(h http.Header, status int) time.Duration {
	var d time.Duration
	for _, kind := range []string{"Requests", "Tokens"} {
		if h.Get("X-Ratelimit-Remaining-"+kind) == "0" {
			d = max(d, parseWait(h.Get("X-Ratelimit-Reset-"+kind)))
		}
	}
	if status != http.StatusTooManyRequests {
		return min(d, maxServedWait)
	}
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 {
		d = max(d, seconds(ms/1000))
	} else if ra := h.Get("Retry-After"); ra != "" {
		if s, err := strconv.ParseFloat(ra, 64); err == nil && s > 0 {
			d = max(d, seconds(s))
		} else if at, err := http.ParseTime(ra); err == nil {
			d = max(d, time.Until(at))
		}
	}
	if d <= 0 {
		d = time.Second
	}
	return min(d, maxProviderWait)
}

// providerReport reads what a provider's answer says is left of the
// account: x-ratelimit-remaining-tokens and -requests, each with its
// x-ratelimit-reset-* (the time until it is back at its limit), and
// whether it said anything. A value that is not a whole number >= 0 is
// not reported.
func providerReport(h http.Header) (fairqueue.ProviderReport, bool) {
	r := fairqueue.ProviderReport{RemainingTokens: -1, RemainingRequests: -1}
	read := func(kind string) (int64, time.Duration) {
		n, err := strconv.ParseInt(h.Get("X-Ratelimit-Remaining-"+kind), 10, 64)
		if err != nil || n < 0 {
			return -1, 0
		}
		return n, parseWait(h.Get("X-Ratelimit-Reset-" + kind))
	}
	r.RemainingTokens, r.ResetTokens = read("Tokens")
	r.RemainingRequests, r.ResetRequests = read("Requests")
	return r, r.RemainingTokens >= 0 || r.RemainingRequests >= 0
}

// maxProviderWait bounds what a provider's header can make the gateway
// believe: a garbled or hostile value must not stop dispatch for hours.
// maxServedWait bounds the pause a served answer with nothing remaining
// causes: not a whole quota window on one header's word.
const (
	maxProviderWait = 10 * time.Minute
	maxServedWait   = 10 * time.Second
)

// seconds converts a number of seconds to a Duration, clamped to
// maxProviderWait before the conversion can overflow.
func seconds(s float64) time.Duration {
	if !(s < maxProviderWait.Seconds()) {
		return maxProviderWait
	}
	return time.Duration(s * float64(time.Second))
}

// parseWait reads a reset time: a Go duration as OpenAI sends ("6m0s",
// "1s", "17ms") or plain seconds.
func parseWait(v string) time.Duration {
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return min(d, maxProviderWait)
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return seconds(s)
	}
	return 0
}

// usage returns what the model server reported, or the completion counted
// from the streamed text when a stream carried no usage.
func (u *usageRecorder) usage() (llmapi.Usage, bool) {
	if u.status < 200 || u.status >= 300 {
		return llmapi.Usage{}, false
	}
	if u.stream != nil {
		return u.stream.Result()
	}
	if u.parsed {
		return u.used, u.usedOK
	}
	if u.tooBig || u.body.Len() == 0 {
		return llmapi.Usage{}, false
	}
	return llmapi.ParseUsage(u.body.Bytes())
}
