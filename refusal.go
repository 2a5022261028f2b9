package caddyfairqueue

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// answerRejection answers a request the scheduler refused, at admission or
// while queued, and records wait-budget refusals by moment (metrics.go).
func (h *Handler) answerRejection(w http.ResponseWriter, repl *caddy.Replacer, a *admission, rej *fairqueue.Rejection) error {
	observeRefusal(h.Name, a.label, rej)
	h.historyRefusal(a.label, rej)
	return h.answer(w, repl, a, rejectionError(rej))
}
