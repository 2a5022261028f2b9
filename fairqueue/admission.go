package fairqueue

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
)

// BudgetConfig makes wait budgets promises: an ETA for every request with a
// deadline, a bounded boost for those that would miss it, and an immediate
// refusal for those that cannot make it even boosted.
type BudgetConfig struct {
	// FastFail refuses (ReasonBudgetExceeded) a request that cannot start
	// before its deadline even if boosted, at admission or while queued
	// (refuse.go). Off, such requests expire at their deadline.
	FastFail bool
	// BoostShareMax is the largest share of dispatch capacity boosted
	// requests may hold (budget.Boosts.Limit); 0 disables boosting.
	BoostShareMax float64
	// PerTenantBoostHourly caps one tenant's boosts in any rolling hour;
	// 0 means no per-tenant cap.
	PerTenantBoostHourly int
	// Margin is how long before its deadline a request must be dispatched
	// to count as on time: the tick period plus the proxy's own latency.
	Margin time.Duration
	// Throughput configures the rate estimator; zero fields take the
	// budget package's defaults.
	Throughput budget.ThroughputConfig
}

// admission is the queue's wait-budget state.
type admission struct {
	rate   *budget.Throughput
	boosts *budget.Boosts
	// boostCost is the estimated cost waiting in the boost lane.
	boostCost int64
	// stamp deduplicates tenants with several flows in one walk.
	stamp uint64
	// ahead is the work-ahead index (ahead.go).
	ahead aheadIndex
	// walkMax is aheadWalkMax (-1: always keep the index).
	walkMax int
	// cold bounds the rate before the estimator has a sample.
	cold budget.ColdRate
	// cursor is where the next early-refusal pass starts among the
	// backlogged flows, subCursor among the group's members.
	cursor, subCursor int
	// capTime is the healthy-upstream seconds elapsed up to capAt, the
	// clock of the flows' drain rates; peak is the largest healthy count
	// of the last peakHold, last seen at peakAt.
	capTime float64
	capAt   time.Time
	peak    int
	peakAt  time.Time
	// learnedAt is when the estimator was first seen warmed up.
	learnedAt time.Time
	// bwSum/bwW is the backlogged weight averaged over time up to bwAt
	// (Unix ns), when it was bwLast (refuse.go).
	bwSum, bwW, bwLast float64
	bwAt               int64
	// late is how late booked requests went past their booked times.
	late lateWindow
}

// newAdmission makes the wait-budget state, or updates old's: measurements
// and boost history outlive a reload.
func newAdmission(cfg *BudgetConfig, old *admission) *admission {
	if old != nil {
		old.boosts.Update(cfg.BoostShareMax, cfg.PerTenantBoostHourly)
		return old
	}
	return &admission{
		rate:    budget.NewThroughput(cfg.Throughput),
		boosts:  budget.NewBoosts(cfg.BoostShareMax, cfg.PerTenantBoostHourly),
		walkMax: aheadWalkMax,
	}
}

// Estimate is the queue's prediction for one request.
type Estimate struct {
	// ETA is the predicted time until dispatch in tag order.
	ETA time.Duration
	// Known is false while the queue has no throughput estimate (no
	// measurement, prior or rate learned before an idle spell): it then
	// promises nothing.
	Known bool
	// WorkAhead is the estimated cost dispatched before the request.
	WorkAhead float64
}

// etaLocked predicts when a request of tenant t, class cq and cost cost,
// with ownAhead of its tenant's cost queued before it, will be dispatched:
// the work that tag order puts ahead of it over the measured rate (without
// samples, the prior or the rate learned before an idle spell; 0: unknown).
func (q *Queue) etaLocked(now time.Time, t *tenant, cq *classQ, ownAhead, cost int64) Estimate {
	st := q.adm.rate.Stats(now, q.healthy)
	if st.Rate <= 0 {
		return Estimate{}
	}
	rate := st.Rate
	if q.up != nil {
		rate = min(rate, q.accountRateLocked(now))
	}
	ahead := q.workAheadLocked(now, t, cq, ownAhead, cost, true)
	return Estimate{ETA: budget.ETA(ahead, rate), Known: true, WorkAhead: ahead}
}

// workAheadLocked is the work dispatched before a request of tenant t,
// class cq and cost cost with ownAhead of its tenant's cost queued before
// it: its own queue ahead, the boost lane, the work that frees a slot and,
// with others, each other backlogged tenant's queued cost up to the same
// virtual finish by weight (O(log n) from ahead.go, or a walk over at most
// aheadWalkMax flows). Without others it is a lower bound in O(1).
func (q *Queue) workAheadLocked(now time.Time, t *tenant, cq *classQ, ownAhead, cost int64, others bool) float64 {
	ahead, finish := q.workAheadOwnLocked(now, t, ownAhead, cost)
	if !others {
		return ahead
	}
	own := float64(ownAhead) + float64(cost)
	if q.aheadWalkLocked() {
		return ahead + q.othersWalkLocked(t, cq, own, finish)
	}
	q.aheadSyncLocked()
	if t.group != nil {
		inner := q.aheadOthersLocked(levelMembers, t, finish, cq.paused)
		finish = q.groupFinishLocked(t.group, own, inner)
		ahead += inner
		t = t.group
	}
	return ahead + q.aheadOthersLocked(levelTop, t, finish, cq.paused)
}

// othersWalkLocked is the other tenants' part of workAheadLocked for a
// request of t in cq with own of its tenant's work (its cost included) and
// virtual finish tag finish, by a walk over every backlogged flow: O(F).
// A tenant counts once when one of its flows is in the heap of a class
// the request does not yield to (a paused class yields to an unpaused
// request; a paused request yields to all the work of the tenants first
// met in an unpaused class). It is the work-ahead index's definition.
func (q *Queue) othersWalkLocked(t *tenant, cq *classQ, own, finish float64) float64 {
	a := q.adm
	ahead := 0.0
	a.stamp++
	if t.group != nil {
		// The other members inside the group first, then the group as
		// one tenant at the top level.
		var inner float64
		for _, gf := range t.group.flows {
			inner = a.walkAhead(inner, gf.sub, gf.cq, cq, t, finish)
		}
		finish = q.groupFinishLocked(t.group, own, inner)
		ahead += inner
		t = t.group
	}
	for _, c := range q.classes {
		ahead = a.walkAhead(ahead, &c.flows, c, cq, t, finish)
	}
	return ahead
}

// walkAhead adds to sum the work of the owners of h's flows, in class c,
// other than t, that a request of cq with virtual finish tag finish has
// ahead of it, each owner counted once per stamp.
func (a *admission) walkAhead(sum float64, h *flowHeap, c, cq *classQ, t *tenant, finish float64) float64 {
	if c.paused && !cq.paused {
		return sum // a paused class yields to this request
	}
	for i := range h.e {
		u := h.flows[h.e[i].id].t
		if u == t || u.stamp == a.stamp {
			continue
		}
		u.stamp = a.stamp
		if cq.paused && !c.paused {
			sum += float64(u.queuedWork) // yields to all of it
			continue
		}
		if room := (finish - u.vt) * u.weight; room > 0 {
			sum += min(room, float64(u.queuedWork))
		}
	}
	return sum
}

// workAheadOwnLocked is the part of workAheadLocked that is not the other
// tenants' (the request's own tenant, the boost lane, a slot to free), and
// the request's virtual finish tag in its tenant's virtual time.
func (q *Queue) workAheadOwnLocked(now time.Time, t *tenant, ownAhead, cost int64) (ahead, finish float64) {
	a := q.adm
	ahead = float64(ownAhead + a.boostCost)
	if q.inflight >= q.capacity || q.queued > 0 {
		// Even first in line, a request waits for a slot to free.
		ahead += a.slotWork(now, cost)
	}
	w := t.weight
	start := t.vt
	if t.queued == 0 {
		start = max(start, q.virtualTimeLocked(t))
	}
	start += float64(ownAhead) / w
	return ahead, start + float64(cost)/w
}

// slotWork is the work whose completion frees the next slot, on average.
func (a *admission) slotWork(now time.Time, cost int64) float64 {
	if m := a.rate.MeanCost(now); m > 0 {
		return m / 2
	}
	return float64(cost) / 2
}

// boostETALocked predicts the dispatch time of a request promoted now.
func (q *Queue) boostETALocked(now time.Time, cost int64) time.Duration {
	a := q.adm
	r := a.rate.Rate(now, q.healthy)
	return budget.BoostETA(float64(a.boostCost), a.slotWork(now, cost), r)
}

// boostRoomLocked reports whether one more boosted request may start
// (always, without a boost budget).
func (q *Queue) boostRoomLocked() bool {
	if q.cfg.Admission.BoostShareMax <= 0 {
		return true
	}
	return q.boostedInflight < q.adm.boosts.Limit(q.capacity)
}

// startsAtOnceLocked reports whether a request admitted now is dispatched
// at once, whatever its tag: a slot is free and nothing waits.
func (q *Queue) startsAtOnceLocked() bool { return q.inflight < q.capacity && q.queued == 0 }

// decideLocked is the admission decision for a new request with a deadline
// that cannot start at once. Once the estimator has learned a rate, it is
// made at the promise rate, a low quantile. Before, a refusal needs the
// request to miss even at the refusal rate; one between the two is
// admitted, and refused from the queue once the measurement shows it late.
func (q *Queue) decideLocked(now time.Time, t *tenant, cq *classQ, cost int64, deadline time.Time) (budget.Decision, Estimate) {
	own := t.queuedWork
	est := q.etaLocked(now, t, cq, own, cost)
	if !est.Known {
		// No rate yet: refuse only what the cold bound shows to be late.
		if q.cfg.Admission.FastFail {
			work := q.workAheadLocked(now, t, cq, own, cost, true)
			if late, eta := q.surelyLateLocked(now, t, cq, cost, deadline, work); late {
				return budget.Reject, Estimate{ETA: eta, WorkAhead: work}
			}
		}
		return budget.Wait, est
	}
	in := budget.Input{Now: now, Deadline: deadline, ETA: est.ETA, Margin: q.cfg.Admission.Margin}
	later := false
	if q.cfg.Admission.BoostShareMax > 0 && !q.accountBindsLocked(now) {
		in.BoostETA, in.BoostAllowed, later = q.boostPlanLocked(now, t, cq, cost, deadline, q.adm.rate.Rate(now, q.healthy))
	}
	d := budget.Decide(in)
	switch {
	case d == budget.Boost && later:
		// The boost it needs comes later: the re-check gives it.
		d = budget.Wait
	case d == budget.Reject && !q.cfg.Admission.FastFail:
		d = budget.Wait
	case d == budget.Reject && !q.warmLocked(now):
		late, eta := q.surelyLateLocked(now, t, cq, cost, deadline, est.WorkAhead)
		if !late {
			d = budget.Wait
		} else {
			est.ETA = eta
		}
	}
	return d, est
}

// surelyLateLocked reports whether a new request with work ahead of it
// misses deadline even at the refusal rate, boosted or not, and its ETA at
// that rate.
func (q *Queue) surelyLateLocked(now time.Time, t *tenant, cq *classQ, cost int64, deadline time.Time, work float64) (bool, time.Duration) {
	r := q.refusalRateLocked(now, q.healthy)
	if r <= 0 {
		return false, 0
	}
	eta := budget.ETA(work, r)
	in := budget.Input{Now: now, Deadline: deadline, ETA: eta, Margin: q.cfg.Admission.Margin}
	if q.cfg.Admission.BoostShareMax > 0 && !q.accountBindsLocked(now) {
		in.BoostETA, in.BoostAllowed, _ = q.boostPlanLocked(now, t, cq, cost, deadline, r)
	}
	return budget.Decide(in) == budget.Reject, eta
}

// boostPlanLocked predicts the dispatch time of a new request if boosted,
// at rate r, whether a boost is possible at all (ok), and whether only
// later, by the re-check (later), so that admission waits for it rather
// than refusing a request a boost will save. Its own flow may hold a
// request due no sooner (ownDueFirst): that work is dispatched first, so
// it is added to the boosted ETA.
func (q *Queue) boostPlanLocked(now time.Time, t *tenant, cq *classQ, cost int64, deadline time.Time, r float64) (eta time.Duration, ok, later bool) {
	own := 0.0
	for _, f := range t.flows {
		if f.cq == cq && ownDueFirst(f, nil, deadline) {
			own += float64(f.queuedWork())
			later = true
		}
	}
	eta, full, ok := q.boostedETALocked(now, t.name, cost, own, r)
	if !ok {
		return 0, false, false
	}
	return eta, true, later || full
}

// boostedETALocked is when a request of tenant name and cost, with own
// work of its tenant dispatched before it, would be dispatched boosted at
// rate r. When the boost share is used up (full), the lane opens when one
// of the k boosted requests completes, about C/k times MeanCost/rate for C
// slots. ok is false when the tenant's hourly allowance is used up: no
// boost.
func (q *Queue) boostedETALocked(now time.Time, name string, cost int64, own, r float64) (eta time.Duration, full, ok bool) {
	a := q.adm
	k := q.boostedInflight + q.boost.n
	allowed, reason := a.boosts.Allow(now, name, k, q.capacity)
	if !allowed && reason != budget.ReasonShare {
		return 0, false, false
	}
	eta = budget.ETA(float64(a.boostCost)+a.slotWork(now, cost)+own, r)
	if !allowed {
		if m := a.rate.MeanCost(now); m > 0 && eta < budget.Never {
			eta += budget.ETA(float64(q.capacity)/float64(max(k, 1))*m, r)
		}
	}
	return eta, !allowed, true
}

// budgetRejection is the fast-fail answer, with Retry-After from the ETA.
func budgetRejection(est Estimate, budgetLeft time.Duration) *Rejection {
	return &Rejection{Reason: ReasonBudgetExceeded, RetryAfter: budget.RetryAfter(est.ETA), BudgetLeft: 1,
		Detail: fmt.Sprintf("estimated wait %s, budget %s", est.ETA.Round(100*time.Millisecond),
			budgetLeft.Round(100*time.Millisecond))}
}

// promoteLocked moves a queued ticket into the boost lane and counts the
// boost against its tenant's hourly allowance.
func (q *Queue) promoteLocked(now time.Time, tk *Ticket) {
	// The boost lane counts as queued: only the links move.
	q.unlinkTicketLocked(tk, true)
	tk.state = stateBoosted
	q.boost.insertAfter(tk, q.boost.tail)
	if !tk.deadline.IsZero() {
		heap.Push(&q.deadlines, tk) // so that Tick still expires it
	}
	q.adm.boostCost += tk.cost
	q.adm.boosts.Record(now, tk.t.name)
}

// recheckLocked re-decides queued requests whose deadline is near: one that
// would now miss its deadline in tag order is boosted when the boost budget
// allows and a boost would make it. At most maxRecheck are visited per
// tick, in deadline order: O(maxRecheck x log n).
func (q *Queue) recheckLocked(now time.Time) {
	if q.cfg.Admission.BoostShareMax <= 0 || len(q.deadlines) == 0 {
		return
	}
	// Behind a provider account that binds, a boost makes no room: the
	// lane only keeps the promises made at the decision point (commit.go).
	if q.accountBindsLocked(now) {
		q.keepCommitmentsLocked(now)
		return
	}
	horizon := now.Add(q.boostETALocked(now, 0)*4 + q.cfg.Admission.Margin + time.Second)
	var near []*Ticket
	q.deadlines.visitBefore(horizon.UnixNano(), maxRecheck, func(tk *Ticket) { near = append(near, tk) })
	for _, tk := range near {
		if tk.state != stateQueued {
			continue
		}
		est := q.etaLocked(now, tk.t, tk.f.cq, q.aheadInFlow(tk), tk.cost)
		if est.Known {
			tk.eta = q.promiseLocked(now, tk, est.ETA)
		}
		if !est.Known || !now.Add(est.ETA).After(tk.deadline.Add(-q.cfg.Admission.Margin)) || ownDueFirst(tk.f, tk, tk.deadline) {
			continue
		}
		if ok, _ := q.adm.boosts.Allow(now, tk.t.name, q.boostedInflight+q.boost.n, q.capacity); !ok {
			continue
		}
		if now.Add(q.boostETALocked(now, tk.cost)).After(tk.deadline.Add(-q.cfg.Admission.Margin)) {
			continue // too late even boosted: it will expire with queue_timeout
		}
		q.promoteLocked(now, tk)
	}
}

// promiseLocked is the wait a re-check at now promises the queued tk,
// whose place in tag order is eta away: counted from admission, and no
// shorter than its tenant's quota holds it.
func (q *Queue) promiseLocked(now time.Time, tk *Ticket, eta time.Duration) time.Duration {
	waited := time.Duration(q.since(now) - tk.enqueued)
	if d := tk.delay; d != nil {
		eta = max(eta, d.wait-waited)
	}
	if t := tk.t; t.heldIdx >= 0 {
		eta = max(eta, time.Duration(t.heldUntil-now.UnixNano()))
	}
	return waited + eta
}

// ownDueFirst reports whether flow f (nil: none) holds, ahead of tk (nil: a
// request about to join its tail), a request due no later than deadline:
// its head. Boosting past it would only reorder the tenant's own requests;
// the boost is for a request tag order puts behind other tenants' work.
func ownDueFirst(f *flow, tk *Ticket, deadline time.Time) bool {
	if f == nil {
		return false
	}
	h := f.q.head
	return h != nil && h != tk && !h.deadline.IsZero() && !h.deadline.After(deadline)
}

// maxRecheck bounds the requests re-decided per tick.
const maxRecheck = 64

// aheadInFlow is the cost queued ahead of tk in its own tenant: what its
// flow took in before it and has not yet let out, plus its tenant's other
// flows as a whole (they interleave with it). A request cancelled behind
// tk counts as if it had left ahead of it: the ETA is a little short.
func (q *Queue) aheadInFlow(tk *Ticket) int64 {
	f := tk.f
	ahead := max(0, tk.mark-f.out)
	return ahead + tk.t.queuedWork - f.queuedWork()
}
