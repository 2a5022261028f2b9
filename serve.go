package caddyfairqueue

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

// Request headers a client may use to ask for less than its tenant gets.
const (
	headerWaitBudget = "X-Wait-Budget"
	headerClass      = "X-Fair-Queue-Class"
)

// statusClientClosed is nginx's and Caddy's status for a client that left.
const statusClientClosed = 499

// Response headers on served requests.
const (
	headerWaitMs = "X-Fair-Queue-Wait-Ms"
	headerCost   = "X-Fair-Queue-Cost"
	headerMode   = "X-Fair-Queue-Mode"
)

// outcome names, as used by metrics and the {http.fair_queue.outcome}
// placeholder.
const (
	outcomeServed     = "served"
	outcomeClientGone = "client_gone"
	outcomeInvalid    = "invalid_request"
	outcomeTooLarge   = "request_too_large"
	outcomeUnknown    = "unknown_tenant"
	outcomeProxyError = "proxy_error"
)

// admission is everything known about a request before it is queued.
type admission struct {
	tenant   string
	label    string // metrics label: the tenant, or one label for unknowns
	tc       fairqueue.TenantConfig
	class    string
	budget   time.Duration
	body     []byte
	req      *llmapi.Request
	cost     llmapi.Cost
	light    bool
	path     string
	arrived  time.Time
	deadline time.Time
}

// ServeHTTP queues the request fairly, proxies it when dispatched, and
// back-fills its actual cost. Every request gets exactly one answer: the
// upstream's, or one of the errors of the HTTP contract.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	a, aerr := h.admit(w, r, repl)
	if aerr != nil {
		h.answer(w, repl, a, aerr)
		return nil
	}
	q := h.shared.q
	tk, err := q.Enqueue(fairqueue.Request{Tenant: a.tenant, Class: a.class,
		Cost: int64(a.cost.Total()), Deadline: a.deadline})
	if err != nil {
		var rej *fairqueue.Rejection
		if errors.As(err, &rej) {
			h.answerRejection(w, repl, a, rej)
			return nil
		}
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	// Whatever happens from here on, the slot is freed exactly once.
	actual := fairqueue.UnknownCost
	defer func() { tk.Release(actual) }()

	if err := tk.Wait(r.Context()); err != nil {
		var rej *fairqueue.Rejection
		if errors.As(err, &rej) {
			h.answerRejection(w, repl, a, rej)
			return nil
		}
		// The client went away while queued: nobody is left to answer, and
		// the upstream never saw the request. 499 (as reverse_proxy uses)
		// is for the access log.
		w.WriteHeader(statusClientClosed)
		h.record(repl, a, outcomeClientGone, time.Since(a.arrived))
		return nil
	}
	wait := tk.Dispatched().Sub(tk.Enqueued())
	observeDispatch(h.Name, a.label, tk.Boosted(), tk.ETA(), wait)
	hdr := w.Header()
	hdr.Set(headerWaitMs, strconv.FormatInt(wait.Milliseconds(), 10))
	hdr.Set(headerCost, strconv.Itoa(a.cost.Total()))
	if a.light {
		hdr.Set(headerMode, "light")
	}
	r.Body = io.NopCloser(bytes.NewReader(a.body))
	r.ContentLength = int64(len(a.body))
	r.Header.Set("Content-Length", strconv.Itoa(len(a.body)))
	// The body is now of known length: a chunked client request would
	// otherwise still go upstream chunked, without its Content-Length.
	r.TransferEncoding = nil

	rec := newUsageRecorder(w, h.counter)
	defer func() {
		// reverse_proxy aborts a response that breaks mid-body (client gone
		// mid-stream, upstream dying) with panic(http.ErrAbortHandler):
		// account for what was streamed, then let the abort go on.
		if v := recover(); v != nil {
			outcome := outcomeProxyError
			if r.Context().Err() != nil {
				outcome = outcomeClientGone
			}
			actual = h.actualCost(rec, a, true)
			h.record(repl, a, outcome, wait)
			panic(v)
		}
	}()
	perr := h.proxy.ServeHTTP(rec, r, next)
	outcome := outcomeServed
	if perr != nil {
		outcome = outcomeProxyError
	}
	actual = h.actualCost(rec, a, perr != nil)
	switch {
	case perr == nil && rec.status == statusClientClosed:
		// reverse_proxy answers a client that left mid-request with a
		// nil error and a 499 for the access log.
		outcome = outcomeClientGone
	case perr == nil:
	case r.Context().Err() != nil:
		outcome = outcomeClientGone
		perr = nil // nobody is left to answer
	case rec.status == 0:
		// The upstream failed before a byte reached the client: answer in
		// the API's error shape rather than Caddy's plain error page.
		(&apiError{status: http.StatusBadGateway, code: outcomeProxyError,
			message:    "The model server failed to answer; the request may be retried.",
			retryAfter: time.Second}).write(w)
		h.logger.Warn("upstream failed", zap.String("tenant", a.tenant), zap.Error(perr))
		perr = nil
	}
	h.record(repl, a, outcome, wait)
	return perr
}

// estimator picks the token counter for a new request. The estimate only
// orders the queue; the usage the upstream reports replaces it when the
// response ends. So while nothing waits and a slot is free — the request
// will be dispatched at once and its estimate orders nothing — the cheap
// approx counter keeps tiktoken (about 5 MB/s) off the request path; under
// load, when order matters, prompts are counted exactly.
func (h *Handler) estimator() llmapi.Counter {
	if h.approx != nil && h.shared.q.Idle() {
		return h.approx
	}
	return h.counter
}

// actualCost is what the request really cost: the usage the upstream
// reported or the streamed text counted; failing that, nothing when the
// upstream failed (the tenant is not charged for an error), else the
// estimate (UnknownCost).
func (h *Handler) actualCost(rec *usageRecorder, a *admission, failed bool) int64 {
	if u, ok := rec.usage(); ok {
		prompt := u.Prompt
		if !u.Reported || prompt == 0 {
			prompt = a.cost.Prompt
		}
		actual := int64(prompt + u.Completion)
		observeActual(h.Name, a.label, float64(actual))
		return actual
	}
	if failed || rec.status >= 400 {
		return 0
	}
	return fairqueue.UnknownCost
}

// admit resolves tenant, class, budget and body, and estimates cost.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) (*admission, *apiError) {
	a := &admission{arrived: time.Now(), path: r.URL.Path}
	a.tenant = repl.ReplaceAll(h.TenantKey, "")
	tc, known := h.qcfg.Tenant(a.tenant)
	a.tc, a.label = tc, a.tenant
	if !known {
		a.label = unknownTenantLabel
		if h.RejectUnknownTenants {
			msg := fmt.Sprintf("Tenant %q is not known to this gateway; ask its operator to add it.", a.tenant)
			if a.tenant == "" {
				msg = "The request names no tenant; this gateway requires one."
			}
			return a, &apiError{status: http.StatusForbidden, code: outcomeUnknown, message: msg}
		}
	}
	a.class = tc.Class
	if c := r.Header.Get(headerClass); c != "" {
		cb, ok := h.classIdx[c]
		if !ok {
			return a, badRequest(fmt.Sprintf("%s: unknown class %q.", headerClass, c))
		}
		if shorterBudget(cb, h.classIdx[tc.Class]) {
			return a, badRequest(fmt.Sprintf("%s: class %q has a shorter wait budget than the tenant's class %q; a request may only lower its class.", headerClass, c, tc.Class))
		}
		a.class = c
	}
	a.budget = h.qcfg.Budget(tc, a.class)
	if cb := h.classIdx[a.class]; a.class != tc.Class && shorterBudget(a.budget, cb) {
		// A request that lowered its class takes the lower class's
		// patience even when its tenant overrides its own class's budget.
		a.budget = cb
	}
	if v := r.Header.Get(headerWaitBudget); v != "" {
		d, err := caddy.ParseDuration(v)
		if err != nil || d <= 0 {
			return a, badRequest(fmt.Sprintf("%s: %q is not a positive duration such as 2s or 500ms.", headerWaitBudget, v))
		}
		if a.budget == 0 || d < a.budget {
			a.budget = d
		}
	}
	if a.budget > 0 {
		a.deadline = a.arrived.Add(a.budget)
	}

	body, err := readBody(http.MaxBytesReader(w, r.Body, h.MaxBody), r.ContentLength, h.MaxBody)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return a, &apiError{status: http.StatusRequestEntityTooLarge, code: outcomeTooLarge,
				message: fmt.Sprintf("The request body is larger than this gateway accepts (%d bytes).", h.MaxBody)}
		}
		return a, badRequest("The request body could not be read: " + err.Error())
	}
	a.body = body
	req, err := llmapi.Parse(r.URL.Path, body)
	if err != nil {
		return a, badRequest(err.Error())
	}
	a.req = req
	a.cost = llmapi.Estimate(req, h.estimator(), h.DefaultMaxTokens)
	if aerr := h.applyDegrade(a); aerr != nil {
		return a, aerr
	}
	return a, nil
}

// readBody reads the whole body, into a buffer sized from Content-Length
// when the client sent one: io.ReadAll grows from 512 bytes, which for a
// long prompt copies the body many times over.
func readBody(rd io.Reader, contentLength, maxBody int64) ([]byte, error) {
	if contentLength <= 0 || contentLength > maxBody {
		return io.ReadAll(rd)
	}
	b := make([]byte, 0, contentLength+1) // +1: room to see EOF
	for {
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			rest, err := io.ReadAll(rd)
			return append(b, rest...), err
		}
	}
}

// shorterBudget reports whether wait budget a is shorter than b, where 0
// (a class without a budget) is the longest of all.
func shorterBudget(a, b time.Duration) bool {
	return a > 0 && (b == 0 || a < b)
}

func badRequest(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: outcomeInvalid, message: msg}
}

// answer writes a gateway error and records it.
func (h *Handler) answer(w http.ResponseWriter, repl *caddy.Replacer, a *admission, e *apiError) {
	e.write(w)
	h.record(repl, a, e.code, time.Since(a.arrived))
}

// record sets the access-log placeholders, logs and counts the outcome.
func (h *Handler) record(repl *caddy.Replacer, a *admission, outcome string, wait time.Duration) {
	repl.Set("http.fair_queue.tenant", a.tenant)
	repl.Set("http.fair_queue.wait_ms", wait.Milliseconds())
	repl.Set("http.fair_queue.cost", a.cost.Total())
	repl.Set("http.fair_queue.outcome", outcome)
	observeOutcome(h.Name, a.label, outcome, wait, float64(a.cost.Total()))
	if outcome != outcomeServed {
		if c := h.logger.Check(zap.DebugLevel, "request not served"); c != nil {
			c.Write(zap.String("tenant", a.tenant), zap.String("class", a.class),
				zap.String("outcome", outcome), zap.Duration("waited", wait),
				zap.Int("estimated_tokens", a.cost.Total()))
		}
	}
}
