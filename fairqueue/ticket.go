package fairqueue

import (
	"context"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

type ticketState uint8

const (
	stateQueued ticketState = iota + 1
	stateBoosted
	stateInflight
	stateReleased
	stateCancelled
	stateExpired
)

// UnknownCost passed to Release keeps the estimate: no back-fill.
const UnknownCost int64 = -1

// Ticket is one admitted request. Its life ends exactly once:
//
//   - Wait returns nil: the request is in flight; the owner proxies it and
//     then calls Release with the actual cost.
//   - Wait returns an error: the ticket has already ended (expired,
//     cancelled, or the context ended) and holds no capacity.
//
// Release may be called any number of times, from a defer: only the first
// call on a live ticket has an effect, so a panic cannot leak a slot.
type Ticket struct {
	// Times are kept as nanoseconds from the queue's epoch (Queue.at).
	q          *Queue
	t          *tenant
	f          *flow
	prev, next *Ticket // in a flow or the boost lane
	cost       int64   // charged to the tenant: tokens, or 1 with CostRequests
	tokens     int64   // estimated tokens, counted against the token caps
	dlIdx      int32   // position in the deadline heap, -1 when not in it
	state      ticketState
	boosted    bool
	// fallback: dispatched to the fallback channel (fallback.go).
	fallback bool

	deadline time.Time
	// dispatched is when the ticket was dispatched, valid while it is in
	// flight or released (stateInflight, stateReleased).
	dispatched int64
	// ready is closed when the ticket leaves the queue; only a Wait that
	// has to block makes it.
	ready chan struct{}
	bytes int64 // Request.Bytes, counted against MaxQueueBytes while queued
	// ch is what dispatch charged the request to, nil when nothing.
	ch     *ticketCharge
	actual int64

	enqueued int64
	err      error
	// mark is the flow's intake when the ticket entered it (aheadInFlow).
	mark int64
	// eta is the latest predicted wait (admission, or a re-check).
	eta time.Duration
	// delay is set when admission found the tenant's quota would hold
	// the request, before Enqueue returns the ticket.
	delay *quotaDelay
	// prompt is the prompt part of tokens (CostLearned).
	prompt int64
}

// quotaDelay is how long a tenant's quota holds an admitted request, and
// the meter that said so.
type quotaDelay struct {
	wait   time.Duration
	reason quota.Dimension
}

// QuotaWait is how long, at admission, the tenant's quota was expected to
// hold the request (0: the quota allowed it at once, or no quota).
func (tk *Ticket) QuotaWait() time.Duration {
	if tk.delay == nil {
		return 0
	}
	return tk.delay.wait
}

// QuotaReason is the meter that set QuotaWait ("" when it is 0).
func (tk *Ticket) QuotaReason() quota.Dimension {
	if tk.delay == nil {
		return ""
	}
	return tk.delay.reason
}

// QuotaStatus is the tenant's standing on its quota right after this
// request was charged at dispatch, for the x-ratelimit-* headers of its
// response; ok is false when it was not charged (no quota, or not
// dispatched). Call it after Wait returned nil.
func (tk *Ticket) QuotaStatus() (st quota.Status, ok bool) {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	if c := tk.ch; c != nil {
		st, ok = c.quotaStatus, c.quota != nil
	}
	return st, ok
}

// ticketCharge is what a ticket's dispatch was charged to.
type ticketCharge struct {
	// quota and quotaStatus are the limits the tenant's quota charged it
	// under (nil: not charged) and the meters after the charge; booked,
	// that the charge is a booking not yet used (gate.go).
	quota       *quota.Limits
	quotaStatus quota.Status
	booked      bool
	// upKey and upLimits are the account meter it drew on, resKey and
	// resLimits the reservation besides; nil limits: none.
	upKey     string
	upLimits  *quota.Limits
	resKey    string
	resLimits *quota.Limits
}

// chargeRecordLocked returns tk's charge record, making it on first use.
func (tk *Ticket) chargeRecordLocked() *ticketCharge {
	if tk.ch == nil {
		tk.ch = &ticketCharge{}
	}
	return tk.ch
}

// quotaLimits is the tenant quota tk was charged under, nil if none.
func (tk *Ticket) quotaLimits() *quota.Limits {
	if tk.ch == nil {
		return nil
	}
	return tk.ch.quota
}

// upLimits is the account meter tk drew on, nil if none.
func (tk *Ticket) upLimits() *quota.Limits {
	if tk.ch == nil {
		return nil
	}
	return tk.ch.upLimits
}

// wakeLocked signals a blocked Wait.
func (tk *Ticket) wakeLocked() {
	if tk.ready != nil {
		close(tk.ready)
	}
}

// Wait blocks until the ticket is dispatched (nil), ends without dispatch
// (a *Rejection), or ctx ends (ctx's error; the ticket is cancelled at once
// and is never dispatched). A ticket dispatched in the same instant ctx ended
// is released with cost 0, since the upstream never saw it.
func (tk *Ticket) Wait(ctx context.Context) error {
	q := tk.q
	q.mu.Lock()
	if tk.state != stateQueued && tk.state != stateBoosted {
		err := tk.err // nil once dispatched
		q.mu.Unlock()
		return err
	}
	if tk.ready == nil {
		tk.ready = make(chan struct{})
	}
	ready := tk.ready
	q.mu.Unlock()

	select {
	case <-ready:
		q.mu.Lock()
		err := tk.err
		q.mu.Unlock()
		return err
	case <-ctx.Done():
		q.release(tk, 0, -1)
		return ctx.Err()
	}
}

// Release ends the ticket: a queued ticket is cancelled without charge; a
// dispatched one frees its slot and back-fills actual (UnknownCost keeps the
// estimate). Later calls do nothing. A provider account it drew on keeps
// the estimate (see ReleaseUsage).
func (tk *Ticket) Release(actual int64) { tk.q.release(tk, actual, -1) }

// ReleaseUsage is Release with the prompt tokens the upstream reported
// (prompt < 0: none), to which a provider account's draw is corrected:
// providers count the prompt and the output cap at arrival, whatever is
// generated.
func (tk *Ticket) ReleaseUsage(actual, prompt int64) { tk.q.release(tk, actual, prompt) }

// Tenant returns the tenant name.
func (tk *Ticket) Tenant() string { return tk.t.name }

// Cost returns the estimated cost charged at dispatch (1 with CostRequests).
func (tk *Ticket) Cost() int64 { return tk.cost }

// Dispatched returns the dispatch time, zero if never dispatched.
func (tk *Ticket) Dispatched() time.Time {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	return tk.dispatchedLocked()
}

// dispatchedLocked is Dispatched.
func (tk *Ticket) dispatchedLocked() time.Time {
	if tk.state != stateInflight && tk.state != stateReleased {
		return time.Time{}
	}
	return tk.q.at(tk.dispatched)
}

// Boosted reports whether the ticket was dispatched from the boost lane.
func (tk *Ticket) Boosted() bool {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	return tk.boosted
}

// ETA returns the wait predicted for the ticket, from its admission to
// its dispatch, at admission or at its latest re-check, its quota's delay
// included; 0 when the queue could not predict it.
func (tk *Ticket) ETA() time.Duration {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	return tk.eta
}

// DispatchInfo is what Ticket.Info returns of a ticket's dispatch.
type DispatchInfo struct {
	// Dispatched is the dispatch time, Wait the time since admission.
	Dispatched time.Time
	Wait       time.Duration
	// ETA is as Ticket.ETA.
	ETA time.Duration
	// Boosted and Fallback are as Ticket.Boosted and Ticket.Fallback.
	Boosted, Fallback bool
	// Quota reports that dispatch charged the request to its tenant's
	// quota: Ticket.QuotaStatus has the standing then, and only then.
	Quota bool
}

// Info returns what the dispatch of tk decided, valid once Wait returned
// nil (zero before), under one lock where the accessors take one each.
func (tk *Ticket) Info() DispatchInfo {
	q := tk.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if tk.state != stateInflight && tk.state != stateReleased {
		return DispatchInfo{}
	}
	return DispatchInfo{Dispatched: q.at(tk.dispatched), Wait: time.Duration(tk.dispatched - tk.enqueued),
		ETA: tk.eta, Boosted: tk.boosted, Fallback: tk.fallback, Quota: tk.ch != nil && tk.ch.quota != nil}
}

// Err returns why the ticket ended without dispatch, or nil.
func (tk *Ticket) Err() error {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	return tk.err
}

// ticketList is an intrusive doubly linked FIFO: removal from the middle
// (a cancelled waiter) is O(1) and costs no allocation.
type ticketList struct {
	head, tail *Ticket
	n          int
}

// insertAfter puts tk right after at, or first when at is nil.
func (l *ticketList) insertAfter(tk, at *Ticket) {
	tk.prev = at
	if at != nil {
		tk.next, at.next = at.next, tk
	} else {
		tk.next, l.head = l.head, tk
	}
	if tk.next != nil {
		tk.next.prev = tk
	} else {
		l.tail = tk
	}
	l.n++
}

func (l *ticketList) remove(tk *Ticket) {
	if tk.prev != nil {
		tk.prev.next = tk.next
	} else {
		l.head = tk.next
	}
	if tk.next != nil {
		tk.next.prev = tk.prev
	} else {
		l.tail = tk.prev
	}
	tk.prev, tk.next = nil, nil
	l.n--
}
