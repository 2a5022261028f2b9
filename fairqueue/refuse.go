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
// as that is known, rather than left to wait out its budget and expire
// with queue_timeout.
//
// Known means known with confidence. A ticket is refused when its ETA
// passes its deadline itself (not merely the margin before it; a request
// already inside the margin is left to the expiry, queue_timeout). The ETA
// (refusalETALocked):
//
//   - Normally, the work tag order puts ahead of the ticket at the refusal
//     rate (refusalRateLocked), the most the upstreams can plausibly do:
//     a request is not refused on an estimate that a slow minute, or the
//     low quantile promises are made on, would explain.
//   - Once, at the decision point, in a one-second window ending half a
//     second before a quarter of its budget (decideAt), at the rate its
//     own flow has really been draining per healthy upstream over the
//     last 20 to 40 s (flowDrain), held between the ETA at the refusal
//     rate and the ETA at the promise rate. That rate holds the share the
//     other tenants take, their future arrivals included, which no count
//     of what is queued now can; a right refusal is thus made by a quarter
//     of the budget. Before a flow has drained for 40 s the decision uses
//     the refusal rate with one standard error more (1/sqrt of the
//     completions seen). Applying the drain rate in one window only, not
//     tick after tick, keeps a noisy reading from refusing on its lows.
//   - Behind a provider account that binds, the decision point is where a
//     request is refused or committed to (commit.go): kept, it is refused
//     after only on the refusal rate, and boosted if it is about to miss.
//
// Capacity counts at the largest healthy count of the last minute: an
// upstream that just went down may come back, so what an outage costs is
// refused as it accrues, not all at once on the guess that it is gone for
// good.
//
// Order: a tenant's flow is served in FIFO order, so its tail is what the
// scheduler would serve last. A pass walks each flow it visits from the
// tail towards the head, refusing while the ticket misses, and stops at
// the first ticket that still makes its deadline: the ones ahead of it
// have less work ahead and (one budget per tenant and class) earlier
// deadlines, so they make theirs too.
//
// Cost per pass, under the lock, with F backlogged flows, n tenants and R
// refusals: O(min(F, refuseFlows) x E + R x (E + log n)), where E, one
// ETA, is O(log n) when F <= refuseExactFlows (the work-ahead index,
// ahead.go, plus the re-filing of the tenants that changed since the
// previous ETA, O(log n) each and paid once per change; or, while at most
// aheadWalkMax flows are backlogged, the undeclared tenants' included, a
// walk over them) and O(1) above (the ETA then counts only the work of the
// request's own tenant and the boost lane, a lower bound, so refusals stay
// right and only come later). F counts the undeclared tenants' group as
// one flow, so with many undeclared tenants the ETAs are the full ones,
// from the index. The index would make the full ETA as cheap above 64
// flows, but with many tenants it refuses too much: in the simulator's
// "many" scenario (1000 tenants) it refused 246 requests of which 164
// would have made their deadline, where the lower bound refuses none. So a
// pass is O(64 log n) at most, refusals aside. It never scans the queued requests: at 100k
// queued in one flow a pass that refuses nothing checks one tail; at 100k
// queued in 100k flows it checks 64 tails at O(1) each. R is at most
// maxRefusals per pass and every refusal ends a ticket, so refusals cost
// O(log n) amortised per request over its life.

const (
	// refuseFlows is how many flows' tails one pass checks. A pass resumes
	// where the previous one stopped, so with more backlogged flows every
	// flow is still visited, every F/refuseFlows ticks.
	refuseFlows = 64
	// refuseExactFlows is the most backlogged flows for which a refusal's
	// ETA counts the other tenants' work (see the cost above for why not
	// beyond).
	refuseExactFlows = 64
	// maxRefusals bounds the refusals of one pass, so that a flood found
	// late is refused over a few ticks rather than in one long hold of the
	// lock.
	maxRefusals = 1024
)

// refusalRateLocked is the rate the global bound of a refusal is computed
// at, in cost units per second, with healthy upstreams; 0 means unknown
// (refuse nothing).
//
//   - With samples in the window: the larger of the promise rate and the
//     window's mean rate (budget.ThroughputStats.Mean), the unbiased
//     estimate of what the upstreams deliver, where the promise rate is a
//     low quantile of it.
//   - Until the estimator has warmed up (learned a rate: 15 s of busy
//     samples) and then for one more window (60 s), until the samples of
//     the cold start have left it, also the cold bound budget.ColdRate, if
//     larger:
//     slots x mean cost / mean time of the requests dispatched so far, each
//     in-flight request counting for its age so far. It is an upper bound
//     of the rate, so it refuses only what is late for sure, from the
//     first moments of a flood, and it tightens as the requests in flight
//     age and complete. The first sample (one 5 s bucket of busy time with
//     4 completions, whose quantile is itself) is biased low when a flood
//     starts on an idle gateway: nothing completes for the first service
//     time, and stays in the window, and in its mean, for a minute. The cold
//     bound, being service-time based, is not biased so.
//   - Without samples: the larger of the prior (or the rate learned before
//     an idle spell) and the cold bound.
func (q *Queue) refusalRateLocked(now time.Time, healthy int) float64 {
	a := q.adm
	st := a.rate.Stats(now, healthy)
	r := max(st.Rate, st.Mean*float64(healthy))
	if st.Learned > 0 && a.learnedAt.IsZero() {
		a.learnedAt = now
	}
	window := q.cfg.Admission.Throughput.Window
	if window <= 0 {
		window = budget.DefaultWindow
	}
	if a.learnedAt.IsZero() || now.Sub(a.learnedAt) < window {
		r = max(r, a.cold.Rate(now, q.cfg.MaxInflight*healthy))
	}
	if q.up != nil {
		// A provider account is a hard bound: nothing goes faster than it
		// is drawn, whatever the slots could do.
		r = min(r, q.accountRateLocked(now))
	}
	return r
}

// accountSlack is the share by which a request behind an account must be
// on time to be kept: the share of the account its tenant gets is an
// average that the reservations' draws and the order of the others'
// requests move by a few percent over a wait budget.
const accountSlack = 0.05

// accountShareLocked is the rate, in cost units per second, at which t's
// requests are dispatched from an account admitting acct while every
// tenant now backlogged stays so: its weight's share of the backlogged
// weight. 0 for an undeclared tenant (its share is the group's, split
// among members the queue does not weigh).
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
// now; every early-refusal pass calls it. The average is exponentially
// weighted and divided by its total weight, so that its first seconds
// are the average of what was seen, not pulled towards 0.
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
// queued, in cost units per second: its tokens and requests per second,
// less what the reservations have been drawing (they go out of tag order,
// ahead of what is queued), converted at the cost per token and per
// request of what is queued; +Inf when nothing is queued to convert with.
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
// measurements (15 s of busy samples), so that admission refuses on its
// promise rate; before, admission refuses only what is late at the refusal
// rate, and the queue sorts out the rest once it knows.
func (q *Queue) warmLocked(now time.Time) bool {
	return q.adm.rate.Stats(now, q.healthy).Learned > 0
}

// flowDrain measures how fast a flow lets out work (its out counter) per
// healthy-upstream second, between two marks that rotate every drainSpan:
// the rate spans between one and two spans of the recent past. A flow
// becoming backlogged clears it (pushFlow), so an idle gap never counts,
// and its first span is not used at all: a flow that has just become
// backlogged waits for slots that other work holds, or, on a gateway that
// was idle, for the first completions, so it drains slower than it will.
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
	// of the way), so that the answer, a tick and a network away, still
	// comes within a quarter of the budget.
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
// the peak healthy count of the last peakHold. Call it before the healthy
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

// refuseLocked is one early-refusal pass (see above). Tick runs it, and
// SetHealthy when capacity changes; a change of the throughput estimate
// (once per 5 s bucket) is seen by the next tick.
func (q *Queue) refuseLocked(now time.Time) {
	q.advanceCapLocked(now)
	if !q.cfg.Admission.FastFail || len(q.deadlines) == 0 || q.healthy == 0 {
		// With no healthy upstream every ETA is never, but capacity
		// usually comes back within seconds: the deadlines decide.
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
// count h, the refusal rate r, the promise rate (0: not learned), the
// account's rate when it binds (0: it does not), the backlogged flows,
// whether their ETAs are exact, and the refusals so far.
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
	// Behind a provider account that binds (its rate is the refusal
	// rate), the promise is held to it too, and a tenant's flow is
	// expected to drain at its weight's share of it while the others stay
	// backlogged (accountShare).
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
	if q.fb != nil && q.fallbackListed(f.t.name) && q.fb.capacity() > 0 {
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
			// No deadline, or too close to it for any dispatch to count
			// as on time: its budget has run out, which the expiry
			// answers (queue_timeout), not an estimate.
			return
		}
		// Late means past the deadline itself, not merely inside the
		// margin before it: a request that would start within its last
		// moments is left to start, or to expire.
		eta := q.refusalETALocked(now, tk, p.r, p.promise, drain, expect, p.exact)
		if !now.Add(eta).After(tk.deadline) || q.boostSavesLocked(now, tk, p.r) {
			// Behind an account that binds, a request still short of its
			// decision point passed on the refusal rate alone; those
			// ahead of it may be past theirs, which the share decides:
			// walk on, a few (the arrivals of a quarter of a budget).
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

// beforeDecisionLocked reports whether tk is short of its decision point
// (a quarter of its budget after admission, less the lead).
func (q *Queue) beforeDecisionLocked(now time.Time, tk *Ticket) bool {
	enq := q.at(tk.enqueued)
	at := tk.deadline.Sub(enq) / decideAt
	at -= min(at/5, decideLead)
	return now.Sub(enq) < at-decideWindow
}

// coldMargin is the share of its ETA by which a request must miss to be
// refused while the rate is still taken from the cold start (see
// refusalMarginLocked).
const coldMargin = 0.03

// refusalMarginLocked is the share of an ETA a refusal needs beyond the
// deadline: coldMargin until the estimator has learned a rate and a full
// window has passed since, when the rate is an extrapolation from the
// first seconds of a flood that the next minutes can beat by a few
// percent; 0 after.
func (q *Queue) refusalMarginLocked(now time.Time) float64 {
	a := q.adm
	window := q.cfg.Admission.Throughput.Window
	if window <= 0 {
		window = budget.DefaultWindow
	}
	if a.learnedAt.IsZero() || now.Sub(a.learnedAt) < window {
		return coldMargin
	}
	return 0
}

// refusalETALocked is the ETA a refusal of the queued tk is decided on: the
// work ahead of it in its flow at the flow's drain rate (0: unmeasured),
// held between the global ETAs at the refusal rate r and at the promise
// rate (0: not learned yet). Behind an account that binds, expect is the
// drain its tenant's share of the account gives (0: none), and decides
// alone with the refusal rate in the decision window: unbounded by tag
// order, which counts none of the arrivals to come that the share does.
// After the window a request behind the account is committed (commit.go)
// and refused only on the refusal rate.
func (q *Queue) refusalETALocked(now time.Time, tk *Ticket, r, promise, drain, expect float64, exact bool) time.Duration {
	own := q.aheadInFlow(tk)
	work := q.workAheadLocked(now, tk.t, tk.f.cq, own, tk.cost, exact)
	lo := budget.ETA(work, r)
	enq := q.at(tk.enqueued)
	at := tk.deadline.Sub(enq) / decideAt
	at -= min(at/5, decideLead)
	if age := now.Sub(enq); expect > 0 && age >= at-decideWindow && age < at {
		// Behind an account that binds, at its decision point, a
		// request is decided on the rate its flow drains at: the share
		// of the account its tenant's weight gets against the weight
		// backlogged on average over the last seconds, and, once it has
		// been measured, what the flow has really been draining, the
		// slower. Tag order goes by finish tags: a request goes once its
		// flow has drained the work ahead of it and its own cost; and the
		// share is an average, which the reservations' draws and the
		// order of the others' requests move by a few percent.
		eta := max(budget.ETA(float64(own+tk.cost)*(1+accountSlack), expect), lo)
		if drain > 0 {
			eta = max(eta, budget.ETA(float64(own+tk.cost), drain))
		}
		// Kept, it is committed (commit.go): only a dispatch a
		// commitLead before its deadline counts as on time.
		return eta + commitLead
	}
	if age := now.Sub(enq); age < at-decideWindow || age >= at {
		// Outside the decision window: at the refusal rate, less the cold
		// margin while that rate is extrapolated from a flood's first
		// seconds. A request missing by less waits for the window, where
		// its flow's own drain decides, by a quarter of its budget.
		if age < at-decideWindow {
			return time.Duration(float64(lo) * (1 - q.refusalMarginLocked(now)))
		}
		return lo
	}
	if drain <= 0 {
		// Nothing measured on the flow yet (a short budget, a young
		// flood): the decision rests on the global rate, taken from the
		// few completions seen so far. Hold it to one standard error of
		// their mean service time more (1/sqrt(n), for a coefficient of
		// variation of 1), a margin that vanishes as completions add up.
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
// between passes, so the sweep is not an exact round robin, but every
// position is visited in turn. The undeclared tenants' group counts as one
// flow there; landing on it visits its members in turn (a second cursor),
// so each lookup stays O(1).
func (q *Queue) flowAtLocked(k int) *flow {
	f := q.topFlowAtLocked(k)
	if f != nil && f.group {
		if f.sub.len() == 0 {
			return nil
		}
		q.adm.subCursor++
		f = f.sub.flow(&f.sub.e[q.adm.subCursor%f.sub.len()])
	}
	return f
}

// topFlowAtLocked is flowAtLocked over the classes' own heaps.
func (q *Queue) topFlowAtLocked(k int) *flow {
	n := 0
	for _, c := range q.classes {
		n += c.flows.len()
	}
	if n == 0 {
		return nil
	}
	k %= n
	for _, c := range q.classes {
		if k < c.flows.len() {
			return c.flows.flow(&c.flows.e[k])
		}
		k -= c.flows.len()
	}
	return nil
}

// boostSavesLocked reports whether a boost, now or once the boost lane has
// room, would dispatch the queued tk, its flow's tail, in time at rate r: the boost re-check
// (recheckLocked) then gives it, so it is not refused. A ticket behind its
// own flow's head (due first) is not boosted past it: the requests ahead
// of it in its flow go first, boosted themselves if need be, so their work
// counts, as admission counted it (boostPlanLocked).
func (q *Queue) boostSavesLocked(now time.Time, tk *Ticket, r float64) bool {
	if q.cfg.Admission.BoostShareMax <= 0 || q.accountBindsLocked(now) {
		return false // behind an account that binds, a boost makes no room
	}
	a := q.adm
	k := q.boostedInflight + q.boost.n
	allowed, reason := a.boosts.Allow(now, tk.t.name, k, q.capacity)
	if !allowed && reason != budget.ReasonShare {
		return false
	}
	work := float64(a.boostCost) + a.slotWork(now, tk.cost)
	if ownDueFirst(tk.f, tk, tk.deadline) {
		// tk is its flow's tail: every request of the flow would need a
		// boost, and a tenant gets a few an hour, not a flood's worth.
		if h := a.boosts.PerTenantHourly(); h > 0 && a.boosts.Count(now, tk.t.name)+tk.f.q.n > h {
			return false
		}
		work += float64(max(0, tk.mark-tk.f.out))
	}
	eta := budget.ETA(work, r)
	if !allowed {
		if m := a.rate.MeanCost(now); m > 0 && eta < budget.Never {
			eta += budget.ETA(float64(q.capacity)/float64(max(k, 1))*m, r)
		}
	}
	return eta < budget.Never && !now.Add(eta).After(tk.deadline.Add(-q.cfg.Admission.Margin))
}

// unqueueTailLocked takes out a queued tk that a refusal pass ends.
func (q *Queue) unqueueTailLocked(tk *Ticket) {
	f := tk.f
	tail := tk.state == stateQueued && f.q.tail == tk
	q.unqueueLocked(tk)
	if tail {
		// unqueue counts a ticket leaving as cost gone out ahead of those
		// still queued (aheadInFlow), right for a head and close enough
		// for one cancelled here and there, but refusals take the tail by
		// the thousand: taking it back from the intake instead keeps the
		// remaining tickets' work ahead exact.
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
