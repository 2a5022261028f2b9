package caddyfairqueue

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// refusal counts and records the scheduler's refusal, and returns its
// answer.
func (h *Handler) refusal(a *admission, rej *fairqueue.Rejection) *apiError {
	observeRefusal(h.Name, a.label, rej)
	if rej.Reason == fairqueue.ReasonQuotaExceeded {
		h.history().QuotaLimited(a.label, string(rej.Quota), true)
	}
	return rejectionError(rej)
}

// answerRequeuedRejection answers a request that a provider refused for
// want of quota and the queue then refused: the answer says it was sent
// upstream, and its Retry-After is at least accountWait, how long the
// provider still declares the account out of quota.
func (h *Handler) answerRequeuedRejection(w http.ResponseWriter, repl *caddy.Replacer, a *admission, rej *fairqueue.Rejection, accountWait time.Duration) error {
	e := h.refusal(a, rej)
	e.retryAfter = max(e.retryAfter, accountWait)
	then := "it could not be sent again within its wait budget"
	switch rej.Reason {
	case fairqueue.ReasonQueueTimeout:
		then = "its wait budget ran out before the account had room again"
	case fairqueue.ReasonQuotaExceeded:
		then = "your " + quotaWhat(rej.Quota) + " quota did not allow it again within its wait budget (" + rej.Detail + ")"
	case fairqueue.ReasonClosed:
		then = "the gateway's configuration changed and its queue is gone (" + rej.Detail + ")"
	}
	e.message = "The model provider refused this request for want of quota on the gateway's account, so it went back to the queue; " +
		then + ". It was not served; retry after the time in Retry-After."
	return h.answer(w, repl, a, e)
}
