package caddyfairqueue

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

// Request headers a client may use to ask for less than its tenant gets.
const (
	headerWaitBudget = "X-Wait-Budget"
	headerClass      = "X-Fair-Queue-Class"
)

// admit resolves tenant, class and budget, reads and parses the body, and
// estimates its cost. The checks that need no body come first, so a
// request refused anyway costs no read, and a client that sent "Expect:
// 100-continue" is refused before it uploads.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) (*admission, *apiError) {
	a := &admission{arrived: time.Now(), path: r.URL.Path, promptReported: -1}
	a.tenant = h.tenantOf(r, repl)
	// Known from here on, so the inner proxy can use it (header_up).
	repl.Map(a.placeholder)
	known, aerr := h.identify(a)
	if aerr != nil {
		return a, aerr
	}
	if aerr := h.classAndBudget(r, a); aerr != nil {
		return a, aerr
	}
	if r.ContentLength > h.MaxBody {
		return a, h.tooLarge()
	}
	if rej := h.shared.q.PrecheckRequest(fairqueue.Request{Tenant: a.tenant, Class: a.class,
		Bytes: max(r.ContentLength, 0)}); rej != nil {
		return a, rejectionError(rej)
	}
	if aerr := h.receive(w, r, a); aerr != nil {
		return a, aerr
	}
	return a, h.estimate(a, known)
}

// identify checks the request's tenant ID and finds the tenant's settings
// and metrics; known reports whether the tenant is declared.
func (h *Handler) identify(a *admission) (known bool, aerr *apiError) {
	if err := fairqueue.CheckTenantID(a.tenant); err != nil {
		// The answer does not echo the ID (it may be a credential).
		a.tenant, a.label = a.tenant[:min(len(a.tenant), fairqueue.MaxTenantIDLen)], unknownTenantLabel
		a.m = h.metrics.of(a.label)
		return false, badRequest(fmt.Sprintf("%s is not a valid tenant ID: it has %v. A tenant ID is printable "+
			"UTF-8 text of at most %d bytes, without control or invisible characters.",
			h.tenantSource(), err, fairqueue.MaxTenantIDLen))
	}
	a.tc, known = h.qcfg.Tenant(a.tenant)
	a.label = a.tenant
	if !known {
		a.label = unknownTenantLabel
	}
	a.m = h.metrics.of(a.label)
	if !known && h.RejectUnknownTenants {
		msg := fmt.Sprintf("Tenant %q is not known to this gateway; ask its operator to add it.", a.tenant)
		if a.tenant == "" {
			msg = "The request names no tenant; this gateway requires one."
		}
		return false, &apiError{status: http.StatusForbidden, code: outcomeUnknown, message: msg}
	}
	return known, nil
}

// receive reads the body within body_timeout, and starts the wait budget
// once it is complete: a slow upload is the client's time.
func (h *Handler) receive(w http.ResponseWriter, r *http.Request, a *admission) *apiError {
	// Bodies being received count against max_queue_bytes too, as their
	// buffers grow.
	var held int64
	reserve := func(n int64) bool {
		if !h.shared.reserveReading(n, h.MaxQueueBytes) {
			return false
		}
		held += n
		return true
	}
	var deadline time.Time
	if h.BodyTimeout > 0 {
		deadline = a.arrived.Add(time.Duration(h.BodyTimeout))
	}
	body, err := readBody(w, r, h.MaxBody, deadline, &a.watch, reserve)
	h.shared.reading.Add(-held)
	if err != nil {
		if r.Context().Err() != nil && !errors.Is(err, errBodyTimeout) {
			return &apiError{status: statusClientClosed, code: outcomeClientGone, message: "The client went away."}
		}
		return h.bodyError(err)
	}
	a.arrived = time.Now()
	if a.budget > 0 {
		a.deadline = a.arrived.Add(a.budget)
	}
	a.body = body
	return nil
}

// estimate parses the body and estimates the request's cost (light mode
// may rewrite it first), and refuses a request over its token limit.
func (h *Handler) estimate(a *admission, known bool) *apiError {
	body := a.body // as received
	if err := llmapi.ParseTo(&a.req0, a.path, body); err != nil {
		return badRequest(err.Error())
	}
	req := &a.req0
	a.req = req
	a.cost = llmapi.Estimate(req, h.estimator, h.DefaultMaxTokens)
	h.applyDegrade(a)
	limit, what := h.requestTokenLimit(a.tenant, known)
	if int64(a.cost.Total())+int64(len(body)) <= limit {
		return nil
	}
	// A text token is at least one byte, so the estimate is off by at most
	// the body's size: near the limit, decide on the exact count.
	if !a.light {
		a.cost = llmapi.Estimate(req, h.counter, h.DefaultMaxTokens)
	}
	if int64(a.cost.Total()) <= limit {
		return nil
	}
	return &apiError{status: http.StatusBadRequest, code: codeContextLength,
		message: fmt.Sprintf("This request needs up to %d tokens (about %d of prompt and an output cap of %d), "+
			"more than the %d tokens per request this gateway allows (%s). Lower max_tokens or shorten the prompt.",
			a.cost.Total(), a.cost.Prompt, a.cost.Total()-a.cost.Prompt, limit, what)}
}

// tenantOf evaluates tenant_key. The usual key, one request-header
// placeholder, is read from the header directly: what ReplaceAll returns
// for it (the values joined by commas), without its cost.
func (h *Handler) tenantOf(r *http.Request, repl *caddy.Replacer) string {
	if h.tenantHeader != "" {
		switch v := r.Header[h.tenantHeader]; len(v) {
		case 0:
			return ""
		case 1:
			return v[0]
		default:
			return strings.Join(v, ",")
		}
	}
	return repl.ReplaceAll(h.TenantKey, "")
}

// tenantSource names where the request's tenant ID came from, for an
// error message: the header when tenant_key is one, else the key.
func (h *Handler) tenantSource() string {
	if h.tenantHeader != "" {
		// As the config spells it (X-Tenant-ID), not canonical (X-Tenant-Id).
		name := strings.TrimSuffix(strings.TrimPrefix(h.TenantKey, "{http.request.header."), "}")
		return "The " + name + " header"
	}
	return "The value of tenant_key " + h.TenantKey
}

// classAndBudget applies the request's class and wait-budget headers, which
// may only lower what its tenant gets.
func (h *Handler) classAndBudget(r *http.Request, a *admission) *apiError {
	tc := a.tc
	a.class = tc.Class
	if c := headerValue(r.Header, headerClass); c != "" {
		cb, ok := h.classIdx[c]
		if !ok {
			return badRequest(fmt.Sprintf("%s: unknown class %q.", headerClass, c))
		}
		if shorterBudget(cb, h.classIdx[tc.Class]) {
			return badRequest(fmt.Sprintf("%s: class %q has a shorter wait budget than the tenant's class %q; a request may only lower its class.", headerClass, c, tc.Class))
		}
		a.class = c
	}
	var requested time.Duration
	if v := headerValue(r.Header, headerWaitBudget); v != "" {
		d, err := caddy.ParseDuration(v)
		if err != nil || d <= 0 {
			return badRequest(fmt.Sprintf("%s: %q is not a positive duration such as 2s or 500ms.", headerWaitBudget, v))
		}
		requested = d
	}
	a.budget = h.qcfg.Budget(tc, a.class, requested)
	return nil
}

// requestTokenLimit is the largest cost one request of a tenant may have,
// and the setting that sets it; a request above max_inflight_tokens or
// max_queue_tokens could never be dispatched or queued.
func (h *Handler) requestTokenLimit(tenant string, known bool) (int64, string) {
	limit, what := h.MaxRequestTokens, "max_request_tokens"
	t := h.DefaultTenant
	if known {
		t = h.Tenants[tenant]
	}
	if t != nil && t.MaxRequestTokens > 0 {
		limit, what = t.MaxRequestTokens, "the tenant's max_request_tokens"
	}
	if h.MaxInflightTokens > 0 && h.MaxInflightTokens < limit {
		limit, what = h.MaxInflightTokens, "max_inflight_tokens of one model server"
	}
	if h.MaxQueueTokens > 0 && h.MaxQueueTokens < limit {
		limit, what = h.MaxQueueTokens, "max_queue_tokens"
	}
	return limit, what
}

// shorterBudget reports whether wait budget a is shorter than b, where 0
// (a class without a budget) is the longest of all.
func shorterBudget(a, b time.Duration) bool {
	return a > 0 && (b == 0 || a < b)
}

func badRequest(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: outcomeInvalid, message: msg}
}
