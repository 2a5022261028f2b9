package fairqueue

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
)

// Commitments behind a provider account: a queued request is decided once,
// at its decision point (refuse.go), on its tenant's share of the account.
// It is kept only if that share dispatches it commitLead before its
// deadline; once kept, it is refused only if it misses even at the refusal
// rate, and one due within rescueHorizon that now misses goes to the boost
// lane if the account can take it in time (keepCommitmentsLocked). Rescues
// count as boosts; with boosting off there is no rescue.

const (
	// commitLead is how much before its deadline a request behind an
	// account must be dispatched, by its tenant's share, to be kept: the
	// room for a rescue (a few ticks), the expiry margin and the share's
	// drift over the last seconds.
	commitLead = 500 * time.Millisecond
	// rescueHorizon is how close to its deadline a committed request is
	// looked at for a rescue.
	rescueHorizon = 2 * time.Second
)

// keepCommitmentsLocked moves to the boost lane every committed request
// (past its decision point) due within rescueHorizon whose ETA in tag
// order misses its deadline less the margin, if the lane dispatches it in
// time at the account's rate. Its flow's head goes first (visited first,
// in deadline order), so a tenant's requests stay in order.
func (q *Queue) keepCommitmentsLocked(now time.Time) {
	acct := q.accountRateLocked(now)
	var near []*Ticket
	q.deadlines.visitBefore(now.Add(rescueHorizon).UnixNano(), maxRecheck, func(tk *Ticket) { near = append(near, tk) })
	for _, tk := range near {
		if tk.state != stateQueued || q.beforeDecisionLocked(now, tk) || ownDueFirst(tk.f, tk, tk.deadline) {
			continue
		}
		due := tk.deadline.Add(-q.cfg.Admission.Margin)
		if est := q.etaLocked(now, tk.t, tk.f.cq, q.aheadInFlow(tk), tk.cost); est.Known && !now.Add(est.ETA).After(due) {
			continue
		}
		if now.Add(budget.ETA(float64(q.adm.boostCost+tk.cost), acct)).After(due) {
			continue // the lane cannot make it either: the refusal pass decides
		}
		q.promoteLocked(now, tk)
	}
}
