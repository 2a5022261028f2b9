package caddyfairqueue

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/history"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
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
	// outcomeBodyTimeout: the body did not arrive within body_timeout.
	outcomeBodyTimeout = "request_timeout"
	// codeContextLength is OpenAI's code for a request over the context
	// window; here, over the tokens one request may have.
	codeContextLength = "context_length_exceeded"
)

// admission is one request's state: what admit learned of it, then what
// its dispatch and attempts did.
type admission struct {
	tenant   string
	label    string // metrics label: the tenant, or one label for unknowns
	tc       fairqueue.TenantConfig
	class    string
	budget   time.Duration
	body     []byte
	req      *llmapi.Request
	cost     llmapi.Cost
	path     string
	arrived  time.Time
	deadline time.Time
	// The placeholders' wait_ms and outcome, once known (phWaitKnown).
	phWait    time.Duration
	phOutcome string
	// A served response's usage, once known (usageKnown), for the cost
	// model.
	usedPrompt, usedCompletion int
	// promptReported is the prompt tokens the upstream reported, -1 until
	// it did.
	promptReported int64
	// used is the tokens the history counts as served: the usage, or the
	// estimate of an answer that reported none.
	used int64
	// The first dispatch's promised wait and whether it was boosted, for
	// the history.
	eta time.Duration
	// light: light mode rewrote the body.
	light, phWaitKnown, usageKnown, boosted bool

	m *tenantMetrics
	// The first attempt's recorder, body reader and parsed body, so one
	// attempt allocates none of them (req: req0, or light mode's reparse).
	rec0  usageRecorder
	body0 bytes.Reader
	req0  llmapi.Request
	watch bodyRead // bounds the time to receive the body

	// Once queued: actual is the cost the slot is released with
	// (UnknownCost: the estimate stands), charged the quota the request
	// was charged to (nil: none), info its latest dispatch and rec the
	// latest attempt's response recorder.
	actual  int64
	charged *quota.Limits
	info    fairqueue.DispatchInfo
	rec     *usageRecorder
}

// ServeHTTP queues the request fairly, proxies it when dispatched, and
// back-fills its actual cost. Every request gets exactly one answer: the
// upstream's, or one of the errors of the HTTP contract.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.committed.Load() {
		// A request reaching this handler proves its config is live, in
		// case the "started" event did not come (see sharedQueue.adopt).
		h.shared.commit(h)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	a, aerr := h.admit(w, r, repl)
	if aerr != nil {
		return h.refuse(w, r, repl, a, aerr)
	}
	tk, err := h.shared.q.Enqueue(fairqueue.Request{Tenant: a.tenant, Class: a.class,
		Cost: int64(a.cost.Total()), Prompt: int64(a.cost.Prompt), Deadline: a.deadline, Bytes: int64(len(a.body))})
	if err != nil {
		var rej *fairqueue.Rejection
		if errors.As(err, &rej) {
			return h.answer(w, repl, a, h.refusal(a, rej))
		}
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	h.shared.slotsQueued()
	// Whatever happens from here on, the slot is freed exactly once.
	a.actual = fairqueue.UnknownCost
	defer h.release(tk, a)
	if err := tk.Wait(r.Context()); err != nil {
		return h.notDispatched(w, repl, a, err)
	}
	// Counted once dispatched: one refused while it waited for its quota
	// counts as refused only.
	h.observeQuotaDelay(a.label, tk)
	// The body's length is known (set per attempt): not chunked upstream.
	r.TransferEncoding = nil
	defer h.recordAbort(r, a)
	for attempt := 1; ; attempt++ {
		perr := h.proxyAttempt(w, r, next, tk, a, attempt)
		if !a.rec.provider429 {
			return h.finish(w, r, a, perr)
		}
		if answered, err := h.requeue(w, r, repl, tk, a, attempt); answered {
			return err
		}
	}
}

// refuse answers a request refused at admission.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, a *admission, aerr *apiError) error {
	// Refused before an HTTP/1 body was read whole: closing the connection
	// stops net/http from reading up to 256 KiB of an unwanted body.
	unread := a.body == nil && r.ProtoMajor == 1 && r.ContentLength != 0
	if unread {
		w.Header().Set("Connection", "close")
	}
	// Let the client finish sending, so it reads the answer rather than a
	// reset (not after a body timeout: that client is the slow one).
	drain := unread && aerr.code != outcomeBodyTimeout
	if h.HandleErrors && drain {
		// Caddy writes the error page after we return: drain first.
		linger(w, r, false)
	}
	if err := h.answer(w, repl, a, aerr); err != nil {
		return err // handle_errors renders it
	}
	if drain {
		linger(w, r, true)
	}
	return nil
}

// release frees the request's slot with the cost it turned out to have
// (a.actual) and counts what it drew of its tenant's quota, once however
// the request ends.
func (h *Handler) release(tk *fairqueue.Ticket, a *admission) {
	// The prompt the upstream reported corrects a provider account's draw
	// (providers count prompt + output cap).
	tk.ReleaseUsage(a.actual, a.promptReported)
	h.shared.slotsReleased()
	if a.charged == nil {
		return
	}
	used := a.actual
	if used < 0 {
		used = int64(a.cost.Total())
	}
	a.m.observeQuotaUse(a.charged, used)
	h.history().QuotaCharged(a.label, used)
}

// recordAbort accounts for a response that reverse_proxy aborted
// mid-body with panic(http.ErrAbortHandler): what was streamed is counted
// and the outcome recorded, then the abort goes on.
func (h *Handler) recordAbort(r *http.Request, a *admission) {
	v := recover()
	if v == nil {
		return
	}
	outcome := outcomeProxyError
	if r.Context().Err() != nil {
		outcome = outcomeClientGone
	}
	a.actual = h.actualCost(a.rec, a, true)
	h.record(a, outcome, a.info.Wait)
	panic(v)
}

// proxyAttempt sends the request upstream once, through the channel its
// latest dispatch chose. The response streams to the client through
// a.rec, except a provider's 429 (a.rec.provider429), which is kept from
// the client. What the provider's answer says of its account goes to the
// queue.
func (h *Handler) proxyAttempt(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, tk *fairqueue.Ticket, a *admission, attempt int) error {
	info := tk.Info()
	a.info = info
	if attempt == 1 {
		// Dispatched once, however often a provider refuses it.
		a.m.observeDispatch(info.Boosted, info.ETA, info.Wait)
		a.boosted, a.eta = info.Boosted, info.ETA
	}
	// Known now: set before proxying, so the inner proxy can use them.
	a.phWaitKnown, a.phWait = true, info.Wait
	setServedHeaders(w.Header(), info.Wait, a.cost.Total(), a.light)
	proxy, body := h.channelProxy(a, info.Fallback, w.Header())
	rec := h.prepareAttempt(w, r, a, body, attempt)
	if info.Quota {
		st, _ := tk.QuotaStatus()
		rec.quota, a.charged = &st, a.tc.Quota
	}
	var saved http.Header
	if rec.provider {
		saved = w.Header().Clone()
	}
	preq := r
	if info.Fallback && h.Fallback != nil {
		preq = h.Fallback.fallbackRequest(r)
	}
	if h.placed != nil && !info.Fallback {
		var pl *placement
		preq, pl = withPlacement(preq, h.placed)
		defer pl.release()
	}
	perr := proxy.ServeHTTP(rec, preq, next)
	if rec.provider429 {
		// The refusal's headers are not the client's answer.
		clear(w.Header())
		maps.Copy(w.Header(), saved)
	}
	if rec.reported {
		tk.ProviderLevel(rec.report)
	}
	if rec.providerWait > 0 {
		tk.AccountExhausted(time.Now().Add(rec.providerWait))
	}
	return perr
}

// prepareAttempt gives r the body of one attempt and a.rec the attempt's
// response recorder. A later attempt gets new ones, since the transport
// may still be reading the last attempt's body.
func (h *Handler) prepareAttempt(w http.ResponseWriter, r *http.Request, a *admission, body []byte, attempt int) *usageRecorder {
	if attempt == 1 {
		a.body0.Reset(body)
		r.Body = io.NopCloser(&a.body0)
		a.rec0.ResponseWriterWrapper.ResponseWriter, a.rec0.counter = w, h.counter
		a.rec = &a.rec0
	} else {
		r.Body = io.NopCloser(bytes.NewReader(body))
		a.rec = newUsageRecorder(w, h.counter)
	}
	r.ContentLength = int64(len(body))
	setContentLength(r.Header, len(body))
	a.rec.provider = h.UpstreamQuota != nil || h.Fallback != nil
	return a.rec
}

// requeue handles a provider's refusal for want of quota: the request goes
// back to the head of its tenant's queue, uncharged, to be sent again when
// the account has room. answered reports that it was answered instead,
// err being ServeHTTP's result.
func (h *Handler) requeue(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, tk *fairqueue.Ticket, a *admission, attempt int) (answered bool, err error) {
	accountWait := a.rec.providerWait
	providerRefusals.WithLabelValues(h.Name, a.label).Inc()
	h.logger.Debug("provider out of quota; request requeued", zap.String("tenant", a.tenant),
		zap.Int("attempt", attempt), zap.Duration("account_wait", accountWait))
	// Nothing was served: the tenant is charged nothing.
	a.charged = nil
	if attempt >= maxProviderAttempts || !tk.Requeue() {
		a.actual = 0
		return true, h.answer(w, repl, a, &apiError{status: http.StatusServiceUnavailable, code: "server_busy",
			message:    "The model provider is out of quota for this gateway's account. The request was not served; retry after the time in Retry-After.",
			retryAfter: max(accountWait, time.Second)})
	}
	refusedUntil := time.Now().Add(accountWait)
	if err := tk.Wait(r.Context()); err != nil {
		// The answer is the gateway's own: not the refused attempt's.
		for _, k := range []string{headerWaitMs, headerCost, headerMode, headerChannel} {
			w.Header().Del(k)
		}
		var rej *fairqueue.Rejection
		if errors.As(err, &rej) {
			wait := max(time.Until(refusedUntil), h.shared.q.AccountWait(a.info.Fallback))
			return true, h.answerRequeuedRejection(w, repl, a, rej, wait)
		}
		return true, h.notDispatched(w, repl, a, err)
	}
	return false, nil
}

// finish accounts for a proxied request (its actual cost, the cost model,
// the outcome recorded once) and answers an upstream that failed before a
// byte reached the client.
func (h *Handler) finish(w http.ResponseWriter, r *http.Request, a *admission, perr error) error {
	rec := a.rec
	outcome := outcomeServed
	if perr != nil {
		outcome = outcomeProxyError
	}
	a.actual = h.actualCost(rec, a, perr != nil)
	if perr == nil && rec.status >= 200 && rec.status < 300 {
		h.observeCost(a, a.info)
	}
	switch {
	case perr == nil && rec.status == statusClientClosed:
		// reverse_proxy answers a client that left mid-request with a nil
		// error and a 499 for the access log.
		outcome = outcomeClientGone
	case perr == nil:
	case r.Context().Err() != nil:
		outcome = outcomeClientGone
		perr = nil // nobody is left to answer
	case rec.status == 0:
		perr = h.upstreamFailed(w, a, perr)
	}
	h.record(a, outcome, a.info.Wait)
	return perr
}

// upstreamFailed answers a request whose upstream failed before a byte
// reached the client: in the API's error shape rather than Caddy's plain
// error page, or, with handle_errors, as a 502 for the site to render.
func (h *Handler) upstreamFailed(w http.ResponseWriter, a *admission, perr error) error {
	h.logger.Warn("upstream failed", zap.String("tenant", a.tenant), zap.Error(perr))
	if h.HandleErrors {
		return caddyhttp.Error(http.StatusBadGateway, perr)
	}
	(&apiError{status: http.StatusBadGateway, code: outcomeProxyError,
		message:    "The model server failed to answer; the request may be retried.",
		retryAfter: time.Second, quota: a.rec.quota}).write(w, shapeFor(a.path))
	return nil
}

// setContentLength sets the Content-Length header to n, without an
// allocation when it already says n.
func setContentLength(h http.Header, n int) {
	var buf [20]byte
	v := strconv.AppendInt(buf[:0], int64(n), 10)
	if cur := h["Content-Length"]; len(cur) == 1 && cur[0] == string(v) {
		return
	}
	h["Content-Length"] = []string{string(v)}
}

// setServedHeaders sets the headers of a dispatched request's answer:
// wait, cost and, in light mode, the mode; canonical keys, the values in
// one allocation.
func setServedHeaders(hdr http.Header, wait time.Duration, cost int, light bool) {
	vals := []string{strconv.FormatInt(wait.Milliseconds(), 10), strconv.Itoa(cost), "light"}
	hdr[headerWaitMs], hdr[headerCost] = vals[0:1:1], vals[1:2:2]
	if light {
		hdr[headerMode] = vals[2:3:3]
	}
}

// maxProviderAttempts bounds how often one request is sent to a provider
// that answers 429: past it the client gets 503 server_busy, so a provider
// that refuses everything cannot keep a request cycling.
const maxProviderAttempts = 4

// notDispatched answers a request whose ticket ended without a dispatch:
// a refusal while queued, or a client that went away.
func (h *Handler) notDispatched(w http.ResponseWriter, repl *caddy.Replacer, a *admission, err error) error {
	var rej *fairqueue.Rejection
	if errors.As(err, &rej) {
		return h.answer(w, repl, a, h.refusal(a, rej))
	}
	// The client went away while queued: 499 is for the access log.
	w.WriteHeader(statusClientClosed)
	h.record(a, outcomeClientGone, time.Since(a.arrived))
	return nil
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
		} else if !failed {
			a.promptReported = int64(prompt)
		}
		prompt, completion := h.boundUsage(a, prompt, u.Completion)
		a.usageKnown, a.usedPrompt, a.usedCompletion = !failed, prompt, completion
		actual := int64(prompt + completion)
		a.m.observeActual(float64(actual))
		a.used = actual
		return actual
	}
	if failed || rec.status >= 400 {
		return 0
	}
	a.used = int64(a.cost.Total())
	return fairqueue.UnknownCost
}

// outcomeValue is outcome as a placeholder value, the common ones boxed
// once rather than on every request.
func outcomeValue(outcome string) any {
	switch outcome {
	case outcomeServed:
		return outcomeServed
	case outcomeClientGone:
		return outcomeClientGone
	case outcomeProxyError:
		return outcomeProxyError
	}
	return outcome
}

// answer records a gateway error and writes it in the shape of the
// request's API; with handle_errors it returns it to Caddy instead, for
// the site's handle_errors routes to render.
func (h *Handler) answer(w http.ResponseWriter, repl *caddy.Replacer, a *admission, e *apiError) error {
	h.record(a, e.code, time.Since(a.arrived))
	h.quotaStanding(a, e)
	if !h.HandleErrors {
		e.write(w, shapeFor(a.path))
		return nil
	}
	if e.quota != nil {
		setRateLimitHeaders(w.Header(), *e.quota)
	}
	repl.Set("http.fair_queue.error_code", e.code)
	repl.Set("http.fair_queue.error_message", e.message)
	if e.retryAfter > 0 {
		setRetryAfter(w.Header(), e.retryAfter)
		repl.Set("http.fair_queue.retry_after", budget.RetryAfterSeconds(e.retryAfter))
	}
	return caddyhttp.Error(e.status, errors.New(e.code+": "+e.message))
}

// record gives the access-log placeholders their values, logs and counts
// the outcome.
func (h *Handler) record(a *admission, outcome string, wait time.Duration) {
	a.phWaitKnown, a.phWait, a.phOutcome = true, wait, outcome
	a.m.observeOutcome(outcome, wait, float64(a.cost.Total()))
	h.history().Outcome(a.label, history.Answer{Code: outcome, Wait: wait, Tokens: a.used,
		Boosted: a.boosted, ETA: a.eta})
	if outcome != outcomeServed {
		if c := h.logger.Check(zap.DebugLevel, "request not served"); c != nil {
			c.Write(zap.String("tenant", a.tenant), zap.String("class", a.class),
				zap.String("outcome", outcome), zap.Duration("waited", wait),
				zap.Int("estimated_tokens", a.cost.Total()))
		}
	}
}
