package caddyfairqueue

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// Bounds on reading a request body: what one slow or lying client can pin
// is bounded by configuration, not by what the client announces.
const (
	// bodyPrealloc is the most allocated for a body before its bytes
	// arrive.
	bodyPrealloc = 64 << 10

	// lingerBytes and lingerTime bound the read-and-discard after a refusal
	// of a body that is still arriving. Closing a connection with unread
	// bytes makes the kernel send a reset, which many clients report
	// instead of the answer already sent; draining lets them read it.
	lingerBytes = 128 << 20
	lingerTime  = 10 * time.Second
)

// errBodyTimeout is the read error when a body is not complete within
// body_timeout.
var errBodyTimeout = errors.New("request body not complete within body_timeout")

// errReceivingFull is the read error when the bodies being received
// already hold what the gateway allows (max_queue_bytes).
var errReceivingFull = errors.New("request bodies being received are at max_queue_bytes")

// readBody reads the whole body by deadline (none when zero) with
// readGrowing, stopping at maxBody (a *http.MaxBytesError). watch is the
// request's timer for it.
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64, deadline time.Time, watch *bodyRead, reserve func(int64) bool) ([]byte, error) {
	rd := r.Body
	if r.ProtoMajor != 1 || r.ContentLength < 0 || r.ContentLength > maxBody {
		// HTTP/1's body reader stops at an announced Content-Length;
		// everything else (chunked, h2, h3) is bounded here, and the
		// connection is closed after a body over the limit.
		rd = http.MaxBytesReader(w, r.Body, maxBody)
	}
	if !deadline.IsZero() {
		watch.watch(w, r, deadline)
		defer watch.done()
	}
	b, err := readGrowing(rd, r.ContentLength, maxBody, reserve)
	if err != nil && (isTimeout(err) || watch.timedOut()) {
		err = errBodyTimeout
	}
	return b, err
}

// readGrowing reads rd to EOF, asking reserve (may be nil) for each
// buffer before it is allocated (errReceivingFull when refused). The
// buffer starts at the announced length (at most bodyPrealloc) and grows
// fourfold as bytes arrive, up to the announced length or maxBody: a
// client pins at most eight times what it has sent, and a lying
// Content-Length costs nothing until it is backed by bytes.
func readGrowing(rd io.Reader, contentLength, maxBody int64, reserve func(int64) bool) ([]byte, error) {
	if reserve == nil {
		reserve = func(int64) bool { return true }
	}
	limit := maxBody + 1 // room to see EOF, or the byte past the limit
	if contentLength >= 0 && contentLength < maxBody {
		limit = contentLength + 1
	}
	first := min(limit, bodyPrealloc)
	if !reserve(first) {
		return nil, errReceivingFull
	}
	b := make([]byte, 0, first)
	// Made when first needed: a body that fits its announced length
	// never needs it.
	var probe []byte
	for {
		var n int
		var err error
		if len(b) < cap(b) {
			n, err = rd.Read(b[len(b):cap(b)])
			b = b[:len(b)+n]
		} else {
			if probe == nil {
				probe = make([]byte, 512)
			}
			if n, err = rd.Read(probe); n > 0 {
				// Full: a little was read first, so a body that ends
				// exactly here costs no bigger buffer.
				want := min(4*int64(cap(b)), limit)
				if 2*want >= limit {
					want = limit // close enough: no extra copy for the last bytes
				}
				want = max(want, int64(len(b)+n)) // more than announced: the reader decides
				if !reserve(want - int64(cap(b))) {
					return nil, errReceivingFull
				}
				nb := make([]byte, len(b), want)
				copy(nb, b)
				b = append(nb, probe[:n]...)
			}
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// bodyRead bounds the time to receive one request body: when the deadline
// passes before done, a timer sets the connection's read deadline to now
// (or, where the writer reaches no connection that takes one, closes the
// body), so a blocked read returns a timeout. The connection's deadline is
// touched only then, and stays, so net/http's drain of an unread body is
// bounded too.
type bodyRead struct {
	timer *time.Timer
	w     http.ResponseWriter
	body  io.Closer

	mu sync.Mutex
	// fired: the deadline passed while the body was read (a closed body's
	// error does not say so). ended: done ran; a late timer does nothing.
	fired, ended bool
}

// watch starts bounding r's body by deadline; done must follow.
func (b *bodyRead) watch(w http.ResponseWriter, r *http.Request, deadline time.Time) {
	b.w, b.body = w, r.Body
	b.timer = time.AfterFunc(time.Until(deadline), b.fire)
}

// done stops watching.
func (b *bodyRead) done() {
	b.timer.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
}

// timedOut reports whether the deadline passed while the body was read.
func (b *bodyRead) timedOut() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fired
}

// fire ends a read past its deadline.
func (b *bodyRead) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.fired = true
	if http.NewResponseController(b.w).SetReadDeadline(time.Now()) != nil {
		_ = b.body.Close()
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// bodyError maps a failed body read to the HTTP contract.
func (h *Handler) bodyError(err error) *apiError {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return h.tooLarge()
	case errors.Is(err, errReceivingFull):
		return &apiError{status: http.StatusServiceUnavailable, code: "server_busy", retryAfter: time.Second,
			message: fmt.Sprintf("The gateway is receiving as many request bytes as it holds (max_queue_bytes %d); retry after the time in Retry-After.", h.MaxQueueBytes)}
	case errors.Is(err, errBodyTimeout):
		return &apiError{status: http.StatusRequestTimeout, code: outcomeBodyTimeout,
			message: fmt.Sprintf("The request body did not arrive within %s; send it faster or in one piece.", time.Duration(h.BodyTimeout))}
	}
	return badRequest("The request body could not be read: " + err.Error())
}

func (h *Handler) tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: outcomeTooLarge,
		message: fmt.Sprintf("The request body is larger than this gateway accepts (%d bytes); send a shorter prompt.", h.MaxBody)}
}

// linger reads and discards what the client is still sending of a refused
// request, bounded in bytes and time, so the client reads the answer
// rather than a connection reset. With flush, the answer already written
// is sent first; without (handle_errors), the client is drained before
// Caddy answers. A client that asked "Expect: 100-continue" is not invited
// to upload.
func linger(w http.ResponseWriter, r *http.Request, flush bool) {
	if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Expect") != "" {
		return
	}
	if flush && http.NewResponseController(w).Flush() != nil {
		return
	}
	var watch bodyRead
	watch.watch(w, r, time.Now().Add(lingerTime))
	defer watch.done()
	_, _ = io.CopyN(io.Discard, r.Body, lingerBytes)
}
