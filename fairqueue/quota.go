package fairqueue

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Tenant quotas (package quota) as the queue applies them: a request is
// charged its estimated tokens at dispatch and reconciled at completion. A
// tenant its quota does not allow yet is held out of the heaps until the
// quota's earliest time, so it never holds a slot. A request whose earliest
// time is past its deadline is refused at once (ReasonQuotaExceeded).

// quotaStoreLocked returns the store quotas are kept in, making the
// in-process one on first use; it lives as long as the queue, so a reload
// keeps every tenant's debt.
func (q *Queue) quotaStoreLocked() quota.Store {
	if q.cfg.QuotaStore != nil {
		return q.cfg.QuotaStore
	}
	if q.quotas == nil {
		q.quotas = quota.NewMemory(q.clock.Now)
	}
	return q.quotas
}

// accountStoreLocked returns the store the provider account's meters are
// kept in: Config.AccountStore, else the quota store.
func (q *Queue) accountStoreLocked() quota.Store {
	if q.cfg.AccountStore != nil {
		return q.cfg.AccountStore
	}
	return q.quotaStoreLocked()
}

// quotaAdmitLocked is the quota's part of admission: how long the request
// must wait for its tenant's quota behind the tenant's queued requests, or a
// refusal when that is past its deadline. On a shared store the booking made
// before the lock (pre) decides (see quotaBooking.admit).
func (q *Queue) quotaAdmitLocked(now time.Time, t *tenant, name string, l *quota.Limits, deadline time.Time, pre *quotaBooking) (quotaDelay, *Rejection) {
	margin := q.quotaMarginLocked()
	if q.remoteStore {
		return pre.admit(now, deadline, margin)
	}
	var ahead quota.Backlog
	if t != nil {
		ahead = quota.Backlog{Requests: int64(t.queued), Tokens: t.quotaTokens(t.queuedCost)}
	}
	d, ok := q.quotaTimeLocked(name, l, ahead)
	if !ok || d.RetryAfter <= 0 {
		return quotaDelay{}, nil
	}
	// The store's time may be another clock (Redis): only the wait counts.
	if at := now.Add(d.RetryAfter); !deadline.IsZero() && !at.Before(deadline.Add(-margin)) {
		return quotaDelay{reason: d.Reason}, quotaRejection(d, ahead)
	}
	return quotaDelay{d.RetryAfter, d.Reason}, nil
}

// admit is quotaAdmitLocked on a shared store: booking b decides; without
// one, or on a store error, the request is admitted uncharged.
func (b *quotaBooking) admit(now, deadline time.Time, margin time.Duration) (quotaDelay, *Rejection) {
	late := !deadline.IsZero() && b != nil &&
		!now.Add(b.d.RetryAfter+b.slotWait).Before(deadline.Add(-margin))
	switch {
	case b == nil || b.err != nil:
		return quotaDelay{}, nil
	case b.d.Allowed && (b.d.RetryAfter <= 0 || !late):
		return quotaDelay{max(b.d.RetryAfter, 0), b.d.Reason}, nil
	case b.d.Allowed:
		// Booked in time, but the store's answer came so late that
		// the place no longer leaves the request its wait for a
		// slot (the caller gives the booking back).
		d := b.d
		d.Allowed = false
		rej := quotaRejection(d, quota.Backlog{})
		rej.Detail = fmt.Sprintf("%s quota: this request may start in %v, which, after the quota store's slow answer, leaves it less time before its wait budget ends than requests wait for a slot past their quota's time (%v here)",
			d.Reason, d.RetryAfter.Round(time.Millisecond), b.slotWait.Round(time.Millisecond))
		return quotaDelay{reason: d.Reason}, rej
	}
	rej := quotaRejection(b.d, quota.Backlog{})
	if !deadline.IsZero() && now.Add(b.d.RetryAfter).Before(deadline.Add(-margin)) {
		rej.Detail = fmt.Sprintf("%s quota: this request may start in %v, which leaves it less time before its wait budget ends than requests have lately waited for a slot past their quota's time (%v here)",
			b.d.Reason, b.d.RetryAfter.Round(time.Millisecond), b.slotWait.Round(time.Millisecond))
	}
	return quotaDelay{reason: b.d.Reason}, rej
}

func quotaRejection(d quota.Decision, ahead quota.Backlog) *Rejection {
	detail := fmt.Sprintf("%s quota: the next request may start in %v", d.Reason, d.RetryAfter.Round(time.Millisecond))
	if ahead.Requests > 0 {
		detail = fmt.Sprintf("%s quota: behind your %d queued requests, this one may start in %v", d.Reason, ahead.Requests, d.RetryAfter.Round(time.Millisecond))
	}
	st := d.Status
	return &Rejection{Reason: ReasonQuotaExceeded, RetryAfter: d.RetryAfter, Detail: detail,
		Quota: d.Reason, QuotaStatus: &st}
}

// chargeQuotaLocked charges tk to its tenant's quota as it is about to be
// dispatched and reports whether it may go. When the quota refuses, the
// tenant is held until the quota's earliest time.
func (q *Queue) chargeQuotaLocked(now time.Time, tk *Ticket) bool {
	t := tk.t
	l := t.cfg.Quota
	d, err := q.quotaStoreLocked().Charge(context.Background(), t.name, l, tk.tokens)
	switch {
	case err != nil:
		return true // see quotaAdmitLocked: fail open, uncharged
	case !d.Allowed:
		q.holdLocked(t, now, d)
		return false
	}
	c := tk.chargeRecordLocked()
	c.quota, c.quotaStatus = l, d.Status
	return true
}

// quotaAllowsLocked asks tk's tenant quota whether tk may go now, charging
// nothing; when it may not, the tenant is held until it may.
func (q *Queue) quotaAllowsLocked(now time.Time, tk *Ticket) bool {
	d, err := q.quotaStoreLocked().Peek(context.Background(), tk.t.name, tk.t.cfg.Quota, quota.Backlog{})
	if err != nil || d.Allowed {
		return true
	}
	q.holdLocked(tk.t, now, d)
	return false
}

// Quota ratios. When a tenant's estimates run low, its quota's earliest
// times run later than the estimates of its queued requests say. The ratio
// of actual to estimated tokens of its recent completions corrects those
// estimates wherever the queue predicts a quota time; charges stay
// estimates.
const (
	// quotaRatioAlpha weighs one completion in the ratio: it follows the
	// tenant's last few dozen requests.
	quotaRatioAlpha = 1.0 / 16
	// quotaRatioMin is the completions the ratio needs before it counts.
	quotaRatioMin = 4
	// quotaRatioMax bounds the ratio both ways (and 1/quotaRatioMax).
	quotaRatioMax = 4.0
)

// quotaRatio is what t's requests have really cost its quota per token
// estimated: 1 until quotaRatioMin of them completed.
func (t *tenant) quotaRatio() float64 {
	d := t.demand
	if d == nil || d.estN < quotaRatioMin || d.estSum <= 0 {
		return 1
	}
	return min(max(d.actSum/d.estSum, 1/quotaRatioMax), quotaRatioMax)
}

// quotaTokens is estimated tokens of t's requests as its quota is
// expected to be charged for them.
func (t *tenant) quotaTokens(estimated int64) int64 {
	return int64(math.Round(float64(estimated) * t.quotaRatio()))
}

// noteQuotaUseLocked adds a completed request of a quota'd tenant to its
// ratio.
func (q *Queue) noteQuotaUseLocked(tk *Ticket, actual int64) {
	d := tk.t.demandLocked()
	d.estSum = d.estSum*(1-quotaRatioAlpha) + float64(tk.tokens)
	d.actSum = d.actSum*(1-quotaRatioAlpha) + float64(actual)
	d.estN++
}

// reconcileQuotaLocked corrects tk's charge with its actual tokens.
func (q *Queue) reconcileQuotaLocked(tk *Ticket, actual int64) {
	if tk.quotaLimits() == nil || actual < 0 {
		return
	}
	q.noteQuotaUseLocked(tk, actual)
	_, _ = q.quotaStoreLocked().Reconcile(context.Background(), tk.t.name, tk.ch.quota, tk.tokens, actual)
	if actual < tk.tokens {
		q.refundedLocked(tk.t)
	}
}

// deferredReconcile is a completion's reconciliation with a shared store
// (Config.QuotaStore set), made after the queue's lock is released: a round
// trip there must not hold every other decision, and a correction decides
// nothing by itself. The in-process store reconciles under the lock.
type deferredReconcile struct {
	// store is the tenants' quota store, acct the account's.
	store, acct quota.Store
	t           *tenant
	// ch is what to correct: the tenant's quota charged and the account
	// (and reservation) drawn on; nil limits: none.
	ch             ticketCharge
	tokens, actual int64
	// upCounted is what the provider counted of the request (its prompt
	// and output cap), the account's draw corrected to it.
	upCounted int64
}

// deferReconcileLocked takes tk's reconciliations off tk when they are to
// run after the lock; completeLocked then finds nothing to reconcile. The
// account's stay when its store answers in memory (a Mirror).
func (q *Queue) deferReconcileLocked(tk *Ticket, actual, prompt int64) (deferredReconcile, bool) {
	if q.cfg.QuotaStore == nil || actual < 0 || tk.ch == nil {
		return deferredReconcile{}, false
	}
	d := deferredReconcile{store: q.cfg.QuotaStore, acct: q.accountStoreLocked(), t: tk.t, ch: *tk.ch,
		tokens: tk.tokens, actual: actual, upCounted: providerCount(tk, prompt)}
	if q.cfg.AccountStore != nil && !isRemote(q.cfg.AccountStore) {
		d.ch.upLimits = nil
	}
	if d.ch.quota == nil && d.ch.upLimits == nil {
		return deferredReconcile{}, false
	}
	if d.ch.quota != nil {
		q.noteQuotaUseLocked(tk, actual)
	}
	if d.ch.upLimits != nil {
		if d.upCounted != d.tokens {
			q.unlogUpstreamLocked(tk, d.tokens-d.upCounted, 0)
		}
		tk.ch.upLimits, tk.ch.resLimits = nil, nil
	}
	tk.ch.quota = nil
	return d, true
}

// refuseQuotaFlowLocked refuses, from the tail of f towards its head, the
// queued requests its tenant's quota cannot let start before their deadline
// (429 quota_exceeded), stopping at the first that makes it and at max
// refusals; it returns how many it refused. In-process store only: on a
// shared one every queued request holds a booking that fits its budget.
func (q *Queue) refuseQuotaFlowLocked(now time.Time, f *flow, max int) int {
	t := f.t
	l := t.cfg.Quota
	margin := q.quotaMarginLocked()
	tokens, reqs := f.tokens, int64(f.q.n)
	refused := 0
	for tk := f.q.tail; tk != nil && refused < max; {
		tokens -= tk.tokens
		reqs--
		if tk.deadline.IsZero() || tk.deadline.Sub(now) <= q.cfg.Admission.Margin {
			return refused // its budget has run out: the expiry answers
		}
		ahead := quota.Backlog{Requests: reqs, Tokens: t.quotaTokens(tokens)}
		d, ok := q.quotaTimeLocked(t.name, l, ahead)
		if !ok || now.Add(d.RetryAfter).Before(tk.deadline.Add(-margin)) {
			return refused
		}
		prev := tk.prev
		rej := quotaRejection(d, quota.Backlog{})
		rej.WhileQueued = true
		rej.Detail = fmt.Sprintf("%s quota: behind this tenant's %d requests queued ahead of it, at what its requests have been costing, this one may start in %v, after its wait budget ends",
			d.Reason, ahead.Requests, d.RetryAfter.Round(time.Millisecond))
		q.unqueueTailLocked(tk)
		q.finishLocked(now, tk, stateExpired, rej)
		refused++
		tk = prev
	}
	return refused
}

// quotaTimeLocked is the earliest time tenant's quota lets a request behind
// ahead start, as a Decision (RetryAfter 0: now); false when the store
// failed. It adds the holds' granularity: a held tenant goes at the first
// tick after its quota allows it (Margin is three ticks), and when the
// quota's burst tolerance is shorter than a tick the time is lost for good,
// half a tick per request ahead on average.
func (q *Queue) quotaTimeLocked(tenant string, l *quota.Limits, ahead quota.Backlog) (quota.Decision, bool) {
	d, err := q.quotaStoreLocked().Peek(context.Background(), tenant, l, ahead)
	if tick := q.cfg.Admission.Margin / 3; l.Tolerance() < tick && ahead.Requests > 0 {
		d.RetryAfter += time.Duration(ahead.Requests) * tick / 2
		d.Allowed = d.RetryAfter <= 0
	}
	return d, err == nil
}

// reconcileDeferred makes d's store calls without the lock, then, after a
// refund, ends what it may end sooner (refundedLocked) and dispatches.
func (q *Queue) reconcileDeferred(d deferredReconcile) {
	c := &d.ch
	if c.quota != nil {
		_, _ = d.store.Reconcile(context.Background(), d.t.name, c.quota, d.tokens, d.actual)
	}
	if c.upLimits != nil && d.upCounted != d.tokens {
		_, _ = d.acct.Reconcile(context.Background(), c.upKey, c.upLimits, d.tokens, d.upCounted)
		if c.resLimits != nil {
			_, _ = d.acct.Reconcile(context.Background(), c.resKey, c.resLimits, d.tokens, d.upCounted)
		}
	}
	if d.actual >= d.tokens {
		return
	}
	q.mu.Lock()
	defer q.unlock()
	if c.quota != nil {
		q.refundedLocked(d.t)
	}
	q.dispatchLocked(q.clock.Now())
}

// refundedLocked ends t's hold after a refund to its quota: the next
// dispatch charges again and holds to the new time if it must. (An
// account's wait is left to run out: ending it early could let the primary
// take what its fallback was serving.)
func (q *Queue) refundedLocked(t *tenant) {
	if t.heldIdx >= 0 {
		q.unholdLocked(t)
	}
}

// holdLocked makes t ineligible until its quota allows its next request,
// as decision d says, and notes the hold for refuseHeldLocked.
func (q *Queue) holdLocked(t *tenant, now time.Time, d quota.Decision) {
	at := now.Add(d.RetryAfter)
	if q.cfg.Admission.FastFail {
		q.holdNotes = append(q.holdNotes, holdNote{t: t, at: at.UnixNano(), d: d})
	}
	q.holdUntilLocked(t, at)
}

// holdUntilLocked makes t ineligible until at.
func (q *Queue) holdUntilLocked(t *tenant, at time.Time) {
	t.heldUntil = at.UnixNano()
	if t.heldIdx < 0 {
		heap.Push(&q.held, t)
	} else {
		heap.Fix(&q.held, int(t.heldIdx))
	}
	q.relinkLocked(t)
}

// holdNote is a hold just set, for refuseHeldLocked.
type holdNote struct {
	t  *tenant
	at int64 // heldUntil when noted
	d  quota.Decision
}

// refuseHeldLocked answers at once (429 quota_exceeded, Retry-After to the
// end of the hold) the queued requests of each tenant held since its last
// call whose deadline, less the margins, comes before the hold ends: they
// would only wait out their budget. O(notes + refusals).
func (q *Queue) refuseHeldLocked(now time.Time) {
	margin := q.quotaMarginLocked()
	for i := range q.holdNotes {
		n := &q.holdNotes[i]
		t := n.t
		if t.heldIdx < 0 || t.heldUntil != n.at {
			continue // the hold ended or moved since
		}
		at := time.Unix(0, n.at)
		late := func(tk *Ticket) bool { return !tk.deadline.IsZero() && !at.Before(tk.deadline.Add(-margin)) }
		refuse := func(tk *Ticket) {
			d := n.d
			d.RetryAfter = at.Sub(now)
			rej := quotaRejection(d, quota.Backlog{})
			rej.WhileQueued = true
			rej.Detail = fmt.Sprintf("%s quota: while this request was queued, the quota was spent (by this tenant's requests elsewhere in the cluster or ahead of it here); its next request may start in %v, after this one's wait budget ends",
				d.Reason, d.RetryAfter.Round(time.Millisecond))
			q.takeLocked(tk, true)
			q.finishLocked(now, tk, stateExpired, rej)
		}
		for _, f := range t.flows {
			for tk := f.q.head; tk != nil && late(tk); tk = f.q.head {
				refuse(tk)
			}
		}
		// Promoted ones wait in the boost lane (short: the boost budget).
		for tk := q.boost.head; tk != nil; {
			next := tk.next
			if tk.t == t && late(tk) {
				refuse(tk)
			}
			tk = next
		}
	}
	clear(q.holdNotes)
	q.holdNotes = q.holdNotes[:0]
}

// unholdDueLocked ends the holds that are due at now: O(1) when none is.
func (q *Queue) unholdDueLocked(now time.Time) {
	for len(q.held) > 0 && q.held[0].heldUntil <= now.UnixNano() {
		q.unholdLocked(q.held[0])
	}
}

func (q *Queue) unholdLocked(t *tenant) {
	heap.Remove(&q.held, int(t.heldIdx))
	q.relinkLocked(t)
}

// QuotaStatus reports tenant's standing on its quota, for the x-ratelimit-*
// headers of an answer that was not dispatched; ok is false when the
// tenant has no quota.
func (q *Queue) QuotaStatus(tenant string) (st quota.Status, ok bool) {
	q.mu.Lock()
	tc, _ := q.cfg.Tenant(tenant)
	if tc.Quota == nil {
		q.mu.Unlock()
		return st, false
	}
	s := q.quotaStoreLocked()
	q.mu.Unlock()
	st, err := s.Status(context.Background(), tenant, tc.Quota)
	return st, err == nil
}

// holdHeap orders held tenants by the end of their hold.
type holdHeap []*tenant

func (h holdHeap) Len() int           { return len(h) }
func (h holdHeap) Less(i, j int) bool { return h[i].heldUntil < h[j].heldUntil }
func (h holdHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heldIdx, h[j].heldIdx = int32(i), int32(j)
}

func (h *holdHeap) Push(x any) {
	t := x.(*tenant)
	t.heldIdx = int32(len(*h))
	*h = append(*h, t)
}

func (h *holdHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.heldIdx = -1
	return t
}
