package fairqueue

import (
	"context"
	"fmt"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Decisions on a shared quota store, off the lock.
//
// A remote store (Config.QuotaStore that is a quota.Remote: the cluster's
// Redis) answers in a network round trip, which must never be made while the queue's lock is
// held: every other decision of the queue, for tenants with no quota at
// all, would wait on it, and a slow store would throttle them all. So with
// a remote store a tenant quota is asked outside the lock:
//
//   - At admission (Enqueue), the Peek behind the tenant's queued requests
//     is made before the lock is taken, on a count of them read under a
//     brief hold of it (peekQuota).
//   - At dispatch, a request of a tenant with a quota, next in tag order
//     with a slot free, is taken out of the queue and holds that slot while
//     its charge is made on a goroutine of its own (the gate): only that
//     request waits for the round trip. Its tenant is ineligible meanwhile
//     (at most one charge of a tenant in flight, so its requests keep
//     their order); every other tenant dispatches as usual. When the store
//     answers, under the lock: allowed, the request is dispatched into the
//     slot it held; refused, the slot is freed, the request goes back to
//     the head of its tenant's queue and the tenant is held, exactly as a
//     charge refused under the lock would (holdLocked); a store error lets
//     it go, uncharged. Cancelled or past its deadline meanwhile, it ends
//     as a queued request would, and its charge is refunded, off the lock.
//
// The store's own timeout bounds the wait (the cluster's Fallback then
// decides locally). Dispatch on a provider account (Config.UpstreamQuota)
// or through a fallback channel still asks the store under the lock.

// sharedQuotaLocked reports whether quota decisions are made off the lock:
// a store whose calls go over a network (quota.Remote), and neither a
// provider account nor a fallback channel (whose draws stay under it).
func (q *Queue) sharedQuotaLocked() bool {
	return q.remoteStore && q.up == nil && q.fb == nil
}

// isRemote reports whether s says its calls go over a network.
func isRemote(s quota.Store) bool {
	r, ok := s.(quota.Remote)
	return ok && r.Remote()
}

// quotaPeek is an admission Peek made before Enqueue took the lock.
type quotaPeek struct {
	limits *quota.Limits
	d      quota.Decision
	err    error
}

// peekQuota makes the admission Peek of r's tenant on a remote store,
// off the lock; nil when there is none to make (no shared store, no
// quota). The tenant's queued requests are read under a brief hold of the
// lock: what queues or leaves in between moves the answer by a request.
func (q *Queue) peekQuota(r *Request) *quotaPeek {
	if !q.offLock.Load() {
		return nil
	}
	q.mu.Lock()
	if !q.sharedQuotaLocked() {
		q.mu.Unlock()
		return nil
	}
	t := q.tenantLocked(r.Tenant)
	tc, _, _ := q.settingsLocked(t, r.Tenant, r.Class)
	if tc.Quota == nil {
		q.mu.Unlock()
		return nil
	}
	var ahead quota.Backlog
	if t != nil {
		ahead = quota.Backlog{Requests: int64(t.queued), Tokens: t.quotaTokens(t.queuedCost)}
	}
	store, l := q.cfg.QuotaStore, tc.Quota
	q.mu.Unlock()
	d, err := store.Peek(context.Background(), r.Tenant, l, ahead)
	return &quotaPeek{limits: l, d: d, err: err}
}

// gateLocked takes tk, next in tag order with a slot free, out of the
// queue into that slot and charges its tenant's quota off the lock (see
// above).
func (q *Queue) gateLocked(tk *Ticket, overtakes bool) {
	t := tk.t
	q.takeLocked(tk, true) // out of its flow or the boost lane, and the deadline heap
	tk.state = stateGating
	q.holdSlotLocked(tk, 1)
	t.gating = true
	q.relinkLocked(t)
	store, l, name, tokens := q.cfg.QuotaStore, t.cfg.Quota, t.name, tk.tokens
	q.gatesInFlight.Add(1)
	go func() {
		defer q.gatesInFlight.Add(-1)
		d, err := chargeGuarded(store, name, l, tokens)
		q.gateDone(tk, store, l, overtakes, d, err)
	}()
}

// holdSlotLocked counts (sign 1) or uncounts (-1) a gating ticket in the
// queue's, its tenant's and its group's requests in flight: it holds a
// slot, and its tenant is not idle, while its charge is made.
func (q *Queue) holdSlotLocked(tk *Ticket, sign int) {
	q.inflight += sign
	q.inflightCost += int64(sign) * tk.tokens
	tk.t.inflight += sign
	if g := tk.t.group; g != nil {
		g.inflight += sign
	}
	q.capLocked(tk.t)
}

// gateDone applies the store's answer to a gating ticket.
func (q *Queue) gateDone(tk *Ticket, store quota.Store, l *quota.Limits, overtakes bool, d quota.Decision, err error) {
	q.mu.Lock()
	now := q.clock.Now()
	t := tk.t
	q.holdSlotLocked(tk, -1)
	t.gating = false
	charged := err == nil && d.Allowed
	refund := charged
	switch {
	case tk.state != stateGating:
		// Released (cancelled) while its charge was made: its owner has
		// its answer already.
		q.idleCheckLocked(t, now)
	case q.closed != "":
		q.finishLocked(now, tk, stateCancelled, q.closedLocked())
	case !tk.deadline.IsZero() && !now.Before(tk.deadline):
		// Never dispatched after its deadline.
		q.finishLocked(now, tk, stateExpired, q.timeoutLocked(now))
	case err != nil || d.Allowed:
		// A store that fails lets the request go, uncharged (see
		// quotaAdmitLocked).
		refund = false
		if charged {
			c := tk.chargeRecordLocked()
			c.quota, c.quotaStatus = l, d.Status
		}
		q.relinkLocked(t)
		q.startLocked(tk, now, q.since(now), overtakes)
	default:
		q.ungateLocked(tk)
		q.holdLocked(t, now, d)
	}
	q.relinkLocked(t)
	q.dispatchLocked(now)
	q.unlock()
	if refund {
		_, _ = store.Refund(context.Background(), t.name, l, tk.tokens)
	}
}

// ungateLocked puts a gating ticket back at the head of its flow, where it
// was taken from (a boosted one back into its flow: the lane's order is
// arrival, and it goes next in its tenant's turn).
func (q *Queue) ungateLocked(tk *Ticket) {
	f := tk.f
	tk.state = stateQueued
	if f.q.head == nil {
		f.drain = flowDrain{} // backlogged anew: an idle gap is no drain
	}
	f.out -= tk.cost
	tk.mark = f.out
	f.q.pushFront(tk)
	q.countLocked(tk, 1)
	if !tk.t.out {
		q.linkFlowLocked(f)
	}
	if !tk.deadline.IsZero() {
		q.deadlines.push(tk)
	}
}

// GatesInFlight is the number of quota charges being made off the lock
// (tests: a queue with none in flight has decided everything it started).
func (q *Queue) GatesInFlight() int64 { return q.gatesInFlight.Load() }

// chargeGuarded is store.Charge with a panic turned into an error (the
// request then goes, uncharged), so that a store's bug never ends the
// process from the gate's goroutine nor leaves the request's slot held.
func chargeGuarded(store quota.Store, tenant string, l *quota.Limits, tokens int64) (d quota.Decision, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fairqueue: the quota store panicked: %v", r)
		}
	}()
	return store.Charge(context.Background(), tenant, l, tokens)
}
