package fairqueue

import (
	"fmt"
	"math"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Early refusal: a queued request whose ETA, even boosted, can no longer
// meet its deadline is refused (ReasonBudgetExceeded, WhileQueued) as soon
// as that is known with confidence, rather than left to expire. The ETA
// (refusalETALocked) is the work ahead at the refusal rate, except in one
// window before a quarter of its budget (decideAt), where its flow's own
// drain rate decides. Capacity counts at the largest healthy count of the
// last minute. A pass walks each flow from its tail and stops at the first
// request that makes it; it visits at most refuseFlows flows and refuses at
// most maxRefusals, so it never scans the queued requests. Above
// refuseExactFlows an ETA counts only its own tenant and the boost lane: a
// lower bound, so refusals stay right and only come later.

const (
	// refuseFlows is how many flows' tails one pass checks.
	refuseFlows = 64
	// refuseExactFlows is the most backlogged flows for which a refusal's
	// ETA counts the other tenants' work.
	refuseExactFlows = 64
	// maxRefusals bounds the refusals of one pass (one hold of the lock).
	maxRefusals = 1024
)

// refusalRateLocked is the rate a refusal is computed at, in cost units
// per second, with healthy upstreams; 0 means unknown (refuse nothing): the
// larger of the promise rate and the measured mean, and, while the estimate
// is cold, the cold bound budget.ColdRate (an upper bound, where the first
// samples of a flood are biased low). A provider account bounds it.
func (q *Queue) refusalRateLocked(now time.Time, healthy int) float64 {
	a := q.adm
	st := a.rate.Stats(now, healthy)
	r := max(st.Rate, st.Mean*float64(healthy))
	if st.Learned > 0 && a.learnedAt.IsZero() {
		a.learnedAt = now
	}
	if q.coldLocked(now) {
		r = max(r, a.cold.Rate(now, q.cfg.MaxInflight*healthy))
	}
	if q.up != nil {
		r = min(r, q.accountRateLocked(now))
	}
	return r
}

// coldLocked reports whether the rate estimate is still cold: not yet
// learned, or learned less than a window ago, while the cold start's
// samples are still in it.
func (q *Queue) coldLocked(now time.Time) bool {
	a := q.adm
	window := q.cfg.Admission.Throughput.Window
	if window <= 0 {
		window = budget.DefaultWindow
	}
	return a.learnedAt.IsZero() || now.Sub(a.learnedAt) < window
}

// accountSlack is the share by which a request behind an account must be
// on time to be kept: the tenant's share of the account is an average that
// moves by a few percent over a wait budget.
const accountSlack = 0.05

// accountShareLocked is the rate, in cost units per second, at which t's
// requests are dispatched from an account admitting acct while every
// tenant now backlogged stays so: its weight's share of the backlogged
// weight. 0 for an undeclared tenant.
func (q *Queue) accountShareLocked(t *tenant, acct float64) float64 {
	if t.group != nil || t == q.group || t.weight <= 0 {
		return 0
	}
	return acct * t.weight / max(q.adm.bwSum/max(q.adm.bwW, 1e-9), t.weight)
}

// backloggedTau is the time constant of the backlogged weight's average
// (noteBackloggedLocked): a tenant whose requests queue now and then
// weighs in proportion to how long they do.
const backloggedTau = 10 * time.Second

// noteBackloggedLocked moves the time-average of the backlogged weight to
// now. Divided by its total weight, its first seconds are not pulled
// towards 0.
func (q *Queue) noteBackloggedLocked(now time.Time) {
	a := q.adm
	bw := math.Float64frombits(q.backlogged.Load())
	ns := now.UnixNano()
	if a.bwAt != 0 && ns > a.bwAt {
		d := math.Exp(-float64(ns-a.bwAt) / float64(backloggedTau))
		a.bwSum = a.bwSum*d + a.bwLast*(1-d)
		a.bwW = a.bwW*d + (1 - d)
	}
	if a.bwW == 0 {
		a.bwSum, a.bwW = bw, 1
	}
	a.bwAt, a.bwLast = ns, bw
}

// accountRateLocked is the rate the provider account admits for what is
// queued, in cost units per second: its rates less what the reservations
// have been drawing, converted at the cost per token and per request of
// what is queued; +Inf when nothing is queued to convert with.
func (q *Queue) accountRateLocked(now time.Time) float64 {
	u := q.up
	rate := math.Inf(1)
	if q.queuedCost > 0 && u.tokensPerSec > 0 {
		tps := max(u.tokensPerSec-u.reservedRate(now), u.tokensPerSec/10)
		rate = tps * float64(q.queuedWork) / float64(q.queuedCost)
	}
	if q.queued > 0 && u.requestsPerSec > 0 {
		rate = min(rate, u.requestsPerSec*float64(q.queuedWork)/float64(q.queued))
	}
	return rate
}

// warmLocked reports whether the estimator has learned a rate from its own
// measurements, so that admission may refuse on its promise rate.
func (q *Queue) warmLocked(now time.Time) bool {
	return q.adm.rate.Stats(now, q.healthy).Learned > 0
}

// flowDrain measures how fast a flow lets out work per healthy-upstream
// second, between two marks that rotate every drainSpan. A flow becoming
// backlogged clears it, and its first span is not used: a flow just
// backlogged drains slower than it will.
type flowDrain struct {
	at0, at1   time.Time
	out0, out1 int64
	cap0, cap1 float64 // admission.capTime at the marks
	rotations  int
}

const (
	// decideAt: the decision point of a queued ticket is a 1/decideAt of
	// its budget after admission (less decideLead).
	decideAt = 4
	// decideWindow is how long before that point the drain rate applies,
	// and decideLead how much before it the window ends (at most a fifth
	// of the way), so that the answer comes within a quarter of the budget.
	decideWindow = time.Second
	decideLead   = 500 * time.Millisecond
	// drainSpan is how often a flow's drain marks rotate; the rate is
	// measured from the second rotation on, over one to two spans.
	drainSpan = 20 * time.Second
	// peakHold is how long a lost upstream still counts for refusals.
	peakHold = time.Minute
)

// rate updates the marks at now and returns the flow's drain rate in cost
// units per healthy-upstream second; 0 while unmeasured.
func (d *flowDrain) rate(now time.Time, out int64, capT float64) float64 {
	if d.at1.IsZero() {
		d.at1, d.out1, d.cap1 = now, out, capT
		return 0
	}
	if now.Sub(d.at1) >= drainSpan {
		d.at0, d.out0, d.cap0 = d.at1, d.out1, d.cap1
		d.at1, d.out1, d.cap1 = now, out, capT
		d.rotations++
	}
	if d.rotations < 2 || capT <= d.cap0 || out <= d.out0 {
		return 0
	}
	return float64(out-d.out0) / (capT - d.cap0)
}

// advanceCapLocked accumulates healthy-upstream seconds up to now and keeps
// the peak healthy count of the last peakHold; call it before the healthy
// count changes.
func (q *Queue) advanceCapLocked(now time.Time) {
	a := q.adm
	if !a.capAt.IsZero() && now.After(a.capAt) {
		a.capTime += float64(q.healthy) * now.Sub(a.capAt).Seconds()
	}
	if now.After(a.capAt) {
		a.capAt = now
	}
	if q.healthy >= a.peak || now.Sub(a.peakAt) > peakHold {
		a.peak, a.peakAt = q.healthy, now
	}
}

// refuseLocked is one early-refusal pass (see above), run by Tick and
// SetHealthy.
func (q *Queue) refuseLocked(now time.Time) {
	q.advanceCapLocked(now)
	if !q.cfg.Admission.FastFail || len(q.deadlines) == 0 || q.healthy == 0 {
		// With no healthy upstream, capacity usually comes back within
		// seconds: the deadlines decide.
		return
	}
	p, ok := q.refusalPassLocked(now)
	if !ok {
		return
	}
	a := q.adm
	for i := min(p.flows, refuseFlows); i > 0 && p.refused < maxRefusals; i-- {
		f := q.flowAtLocked(a.cursor)
		if f == nil {
			break
		}
		a.cursor++
		if q.spareFlowLocked(now, f) {
			continue
		}
		if f.t.cfg.Quota != nil && f.t != q.group && !q.remoteStore {
			// A quota can hold what the slots would not.
			p.refused += q.refuseQuotaFlowLocked(now, f, maxRefusals-p.refused)
			if f.q.tail == nil {
				continue
			}
		}
		q.refuseFlowLocked(now, f, &p)
	}
}

// refusalPass is what one early-refusal pass decides on: the peak healthy
// count h, the refusal, promise (0: not learned) and binding account's (0:
// none) rates, the backlogged flows, whether their ETAs are exact, and the
// refusals so far.
type refusalPass struct {
	h                int
	r, promise, acct float64
	flows            int
	exact            bool
	refused          int
}

// refusalPassLocked sets up a pass at now; false when the refusal rate is
// unknown (refuse nothing).
func (q *Queue) refusalPassLocked(now time.Time) (refusalPass, bool) {
	a := q.adm
	p := refusalPass{h: max(q.healthy, a.peak)}
	p.r = q.refusalRateLocked(now, p.h)
	if p.r <= 0 {
		return p, false
	}
	if q.warmLocked(now) {
		p.promise = a.rate.Rate(now, q.healthy)
	}
	// Behind a provider account that binds, the promise is held to it
	// too, and a flow expected to drain at its tenant's share of it.
	q.noteBackloggedLocked(now)
	if q.accountBindsLocked(now) {
		p.acct = q.accountRateLocked(now)
		p.promise = min(p.promise, p.acct)
	}
	for _, c := range q.classes {
		p.flows += c.flows.len()
	}
	p.exact = p.flows <= refuseExactFlows
	return p, true
}

// spareFlowLocked reports whether f's requests are left alone by the pass:
// the fallback may serve what the primary cannot, or its tenant's
// reservation takes its tail in time.
func (q *Queue) spareFlowLocked(now time.Time, f *flow) bool {
	if f.t == q.group {
		return false
	}
	if q.fallbackServesLocked(f.t.name) {
		return true
	}
	return q.up != nil && q.up.res[f.t.name] != nil && f.q.tail != nil &&
		q.reservedInTimeLocked(now, f.t, quota.Backlog{Requests: int64(f.t.queued), Tokens: f.t.queuedCost}, f.q.tail.deadline)
}

// refuseFlowLocked walks f from its tail, refusing while the ticket
// misses its deadline (see the order above).
func (q *Queue) refuseFlowLocked(now time.Time, f *flow, p *refusalPass) {
	drain := f.drain.rate(now, f.out, q.adm.capTime) * float64(p.h)
	expect := 0.0
	if p.acct > 0 {
		expect = q.accountShareLocked(f.t, p.acct)
	}
	young := 0
	for tk := f.q.tail; tk != nil && p.refused < maxRefusals; {
		if tk.deadline.IsZero() || tk.deadline.Sub(now) <= q.cfg.Admission.Margin {
			return // the expiry answers, not an estimate
		}
		// Late means past the deadline itself, not merely the margin.
		eta := q.refusalETALocked(now, tk, p.r, p.promise, drain, expect, p.exact)
		if !now.Add(eta).After(tk.deadline) || q.boostSavesLocked(now, tk, p.r) {
			// Behind an account that binds, a request short of its
			// decision point passed on the refusal rate alone; those ahead
			// of it may be past theirs: walk on, a few.
			if expect <= 0 || young >= refuseYoung || !q.beforeDecisionLocked(now, tk) {
				return
			}
			young++
			tk = tk.prev
			continue
		}
		prev := tk.prev
		q.refuseQueuedLocked(now, tk, eta)
		p.refused++
		tk = prev
	}
}

// refuseYoung bounds the requests short of their decision point a pass
// walks past in one flow behind an account (see refuseLocked).
const refuseYoung = 64

// decisionLocked returns tk's age at now and its decision point: a quarter
// of its budget after admission, less the lead.
func (q *Queue) decisionLocked(now time.Time, tk *Ticket) (age, at time.Duration) {
	enq := q.at(tk.enqueued)
	at = tk.deadline.Sub(enq) / decideAt
	at -= min(at/5, decideLead)
	return now.Sub(enq), at
}

// beforeDecisionLocked reports whether tk is short of its decision window.
func (q *Queue) beforeDecisionLocked(now time.Time, tk *Ticket) bool {
	age, at := q.decisionLocked(now, tk)
	return age < at-decideWindow
}

// coldMargin is the share of its ETA by which a request must miss to be
// refused while the rate is cold: an extrapolation from the first seconds
// of a flood that the next minutes can beat by a few percent.
const coldMargin = 0.03

// refusalETALocked is the ETA a refusal of the queued tk is decided on (see
// the top of the file): r is the refusal rate, promise the promise rate (0:
// not learned), drain the flow's drain rate (0: unmeasured), and expect,
// behind an account that binds, the drain its tenant's share of the account
// gives (0: none).
func (q *Queue) refusalETALocked(now time.Time, tk *Ticket, r, promise, drain, expect float64, exact bool) time.Duration {
	own := q.aheadInFlow(tk)
	work := q.workAheadLocked(now, tk.t, tk.f.cq, own, tk.cost, exact)
	lo := budget.ETA(work, r)
	age, at := q.decisionLocked(now, tk)
	if expect > 0 && age >= at-decideWindow && age < at {
		// Behind an account that binds, at its decision point: at the
		// share of the account its tenant's weight gets, or what the flow
		// has really been draining, the slower. A request goes once its
		// flow has drained the work ahead of it and its own cost.
		eta := max(budget.ETA(float64(own+tk.cost)*(1+accountSlack), expect), lo)
		if drain > 0 {
			eta = max(eta, budget.ETA(float64(own+tk.cost), drain))
		}
		// Kept, it is committed (commit.go).
		return eta + commitLead
	}
	if age < at-decideWindow || age >= at {
		// Outside the decision window: at the refusal rate, less the cold
		// margin before the window, where its flow's own drain decides.
		if age < at-decideWindow && q.coldLocked(now) {
			return time.Duration(float64(lo) * (1 - coldMargin))
		}
		return lo
	}
	if drain <= 0 {
		// Nothing measured on the flow yet: the global rate, from the few
		// completions seen so far, held to one standard error of their
		// mean service time more (1/sqrt(n), for a coefficient of
		// variation of 1).
		if n := q.adm.cold.Completions(); n >= budget.ColdCompletions {
			if x := float64(lo) * (1 + 1/math.Sqrt(float64(n))); x < float64(budget.Never) {
				return time.Duration(x)
			}
			return budget.Never
		}
		return lo
	}
	eta := max(budget.ETA(float64(own), drain), lo)
	if promise > 0 {
		eta = min(eta, budget.ETA(work, promise))
	}
	return eta
}

// flowAtLocked returns the k-th backlogged flow (mod their number) over the
// classes' heaps, nil when none is backlogged. Heap order moves flows about
// between passes, but every position is visited in turn. The undeclared
// tenants' group counts as one flow there; landing on it visits its members
// in turn (a second cursor).
func (q *Queue) flowAtLocked(k int) *flow {
	n := 0
	for _, c := range q.classes {
		n += c.flows.len()
	}
	if n == 0 {
		return nil
	}
	k %= n
	for _, c := range q.classes {
		if k >= c.flows.len() {
			k -= c.flows.len()
			continue
		}
		f := c.flows.flow(&c.flows.e[k])
		if f.group {
			if f.sub.len() == 0 {
				return nil
			}
			q.adm.subCursor++
			f = f.sub.flow(&f.sub.e[q.adm.subCursor%f.sub.len()])
		}
		return f
	}
	return nil
}

// boostSavesLocked reports whether a boost, now or once the boost lane has
// room, would dispatch the queued tk, its flow's tail, in time at rate r:
// the re-check (recheckLocked) then gives it. The requests ahead of it in
// its flow go first, so their work counts, as at admission
// (boostPlanLocked).
func (q *Queue) boostSavesLocked(now time.Time, tk *Ticket, r float64) bool {
	if q.cfg.Admission.BoostShareMax <= 0 || q.accountBindsLocked(now) {
		return false // behind an account that binds, a boost makes no room
	}
	own := 0.0
	if ownDueFirst(tk.f, tk, tk.deadline) {
		// Every request of the flow would need a boost.
		if h := q.adm.boosts.PerTenantHourly(); h > 0 && q.adm.boosts.Count(now, tk.t.name)+tk.f.q.n > h {
			return false
		}
		own = float64(max(0, tk.mark-tk.f.out))
	}
	eta, _, ok := q.boostedETALocked(now, tk.t.name, tk.cost, own, r)
	return ok && eta < budget.Never && !now.Add(eta).After(tk.deadline.Add(-q.cfg.Admission.Margin))
}

// unqueueTailLocked takes out a queued tk that a refusal pass ends.
func (q *Queue) unqueueTailLocked(tk *Ticket) {
	f := tk.f
	tail := tk.state == stateQueued && f.q.tail == tk
	q.takeLocked(tk, true)
	if tail {
		// takeLocked counts a ticket leaving as cost gone out ahead of those
		// still queued (aheadInFlow); a tail is taken back from the intake
		// instead, so that the others' work ahead stays exact.
		f.out -= tk.cost
		f.in -= tk.cost
	}
}

// refuseQueuedLocked ends the queued tk with an early refusal whose
// Retry-After comes from eta, its ETA at the refusal rate.
func (q *Queue) refuseQueuedLocked(now time.Time, tk *Ticket, eta time.Duration) {
	left := tk.deadline.Sub(now)
	frac := 0.0
	if total := tk.deadline.Sub(q.at(tk.enqueued)); total > 0 && left > 0 {
		frac = min(float64(left)/float64(total), 1)
	}
	q.unqueueTailLocked(tk)
	q.finishLocked(now, tk, stateExpired, &Rejection{Reason: ReasonBudgetExceeded,
		RetryAfter: budget.RetryAfter(eta), WhileQueued: true, BudgetLeft: frac,
		Detail: fmt.Sprintf("estimated wait %s, budget left %s (refused while queued)",
			eta.Round(100*time.Millisecond), max(left, 0).Round(100*time.Millisecond))})
}
