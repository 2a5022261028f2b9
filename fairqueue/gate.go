package fairqueue

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Decisions on a shared quota store, off the lock: a remote store answers
// in a network round trip, which is never made under the queue's lock.
// Enqueue books a request (quota.Store.Book) before it takes the lock, at
// the earliest time the quota lets it start, first come first served over
// every gateway; a booking that leaves no time before the deadline refuses
// it at once. Its tenant is held until its earliest booked time. A request
// that leaves undispatched gives its booking back after the lock; a store
// error admits the request uncharged.

// isRemote reports whether s says its calls go over a network.
func isRemote(s quota.Store) bool {
	r, ok := s.(quota.Remote)
	return ok && r.Remote()
}

// quotaBooking is a booking Enqueue made before it took the lock.
type quotaBooking struct {
	limits *quota.Limits
	tokens int64
	// slotWait is what the booking left for the wait for a slot.
	slotWait time.Duration
	d        quota.Decision
	err      error
}

// booked reports whether b holds a booking to keep or give back.
func (b *quotaBooking) booked() bool { return b != nil && b.err == nil && b.d.Allowed }

// bookQuota books r on its tenant's quota on a remote store, off the lock
// (see above); nil when there is nothing to book (no shared store, no
// quota). What the booking may wait for is read under a brief hold of the
// lock.
func (q *Queue) bookQuota(r *Request, now time.Time) *quotaBooking {
	if !q.offLock.Load() {
		return nil
	}
	q.mu.Lock()
	if !q.remoteStore {
		q.mu.Unlock()
		return nil
	}
	t := q.tenants[r.Tenant]
	tc, _, _ := q.settingsLocked(t, r.Tenant, r.Class)
	if tc.Quota == nil {
		q.mu.Unlock()
		return nil
	}
	b := &quotaBooking{limits: tc.Quota, tokens: max(r.Cost, 1)}
	maxWait := time.Duration(math.MaxInt64)
	if !r.Deadline.IsZero() {
		b.slotWait = q.slotWaitLocked(now, b.tokens)
		maxWait = r.Deadline.Sub(now) - q.quotaMarginLocked()
	}
	store := q.cfg.QuotaStore
	q.mu.Unlock()
	b.d, b.err = bookGuarded(store, r.Tenant, b.limits, b.tokens, max(maxWait, 0), b.slotWait)
	return b
}

// quotaMarginLocked is how long before its deadline a request must leave
// its tenant's quota: Tick expires what is within ExpiryMargin of its
// deadline, and a dispatch counts as on time Admission.Margin before it.
func (q *Queue) quotaMarginLocked() time.Duration {
	return max(q.cfg.Admission.Margin, q.cfg.ExpiryMargin)
}

// slotWaitLocked is the lead a booking asks for (quota.Store.Book): the
// longest a booked request waited past its booked time lately, and at
// least, while no slot is free, the average time until one frees. The
// longest, not the mean: slots free in bunches.
func (q *Queue) slotWaitLocked(now time.Time, cost int64) time.Duration {
	w := q.adm.late.max(q.since(now))
	if q.inflight < q.capacity && q.queued == 0 {
		return w
	}
	a := q.adm
	if avg := budget.ETA(a.slotWork(now, cost), a.rate.Rate(now, q.healthy)); avg < budget.Never {
		w = max(w, avg)
	}
	return w
}

// lateWindow keeps how late the last lateSamples booked requests were
// dispatched past their booked time, within lateHorizon.
type lateWindow struct {
	at   [lateSamples]int64 // Queue.since's scale; 0: empty
	late [lateSamples]time.Duration
	next int
}

const (
	lateSamples = 64
	lateHorizon = time.Minute
)

// add records a booked request dispatched at at, late past its time.
func (w *lateWindow) add(at int64, late time.Duration) {
	w.at[w.next], w.late[w.next] = max(at, 1), max(late, 0)
	w.next = (w.next + 1) % lateSamples
}

// max is the longest of the samples within lateHorizon of now.
func (w *lateWindow) max(now int64) time.Duration {
	var m time.Duration
	for i, at := range w.at {
		if at != 0 && now-at <= int64(lateHorizon) {
			m = max(m, w.late[i])
		}
	}
	return m
}

// bookGuarded is store.Book with a panic turned into an error (the request
// then goes, uncharged), so that a store's bug never ends the process.
func bookGuarded(store quota.Store, tenant string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (d quota.Decision, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fairqueue: the quota store panicked: %v", r)
		}
	}()
	return store.Book(context.Background(), tenant, l, tokens, maxWait, lead)
}

// keepBookingLocked gives the ticket tk of tenant t the booking b:
// charged to t's quota under b's limits, its time added to t's bookings.
func (q *Queue) keepBookingLocked(now time.Time, t *tenant, tk *Ticket, b *quotaBooking) {
	c := tk.chargeRecordLocked()
	c.quota, c.quotaStatus, c.booked = b.limits, b.d.Status, true
	t.addBookingLocked(q.since(now) + int64(max(b.d.RetryAfter, 0)))
}

// addBookingLocked adds a booked time (Queue.since's scale) to t's
// bookings, kept earliest first.
func (t *tenant) addBookingLocked(at int64) {
	b := t.demandLocked().bookings
	i := len(b)
	for i > 0 && b[i-1] > at {
		i--
	}
	t.demand.bookings = slices.Insert(b, i, at)
}

// bookedDueLocked reports whether tk may be dispatched now as far as its
// tenant's quota goes: it is not booked, or its tenant's earliest booked
// time has come. Otherwise its tenant is held until then.
func (q *Queue) bookedDueLocked(now time.Time, tk *Ticket) bool {
	if tk.ch == nil || !tk.ch.booked {
		return true
	}
	d := tk.t.demand
	if d == nil || len(d.bookings) == 0 || d.bookings[0] <= q.since(now) {
		return true
	}
	q.holdUntilLocked(tk.t, q.at(d.bookings[0]))
	return false
}

// useBookingLocked spends the earliest of tk's tenant's booked times on
// tk, dispatched now: its charge stays, to be reconciled at completion.
func (q *Queue) useBookingLocked(tk *Ticket) {
	tk.ch.booked = false
	if d := tk.t.demand; d != nil && len(d.bookings) > 0 {
		q.adm.late.add(tk.dispatched, time.Duration(tk.dispatched-d.bookings[0]))
		d.bookings = slices.Delete(d.bookings, 0, 1)
	}
}

// unbookLocked gives back tk's booking, which it leaves without being
// dispatched: its tenant drops its latest booked time, and the store is
// refunded after the lock.
func (q *Queue) unbookLocked(tk *Ticket) {
	c := tk.ch
	c.booked = false
	if d := tk.t.demand; d != nil && len(d.bookings) > 0 {
		d.bookings = d.bookings[:len(d.bookings)-1]
	}
	q.refundLaterLocked(tk.t.name, c.quota, tk.tokens)
	c.quota = nil
}

// refundLaterLocked has the store refunded a booking of tokens on tenant's
// quota l once the lock is released.
func (q *Queue) refundLaterLocked(tenant string, l *quota.Limits, tokens int64) {
	store := q.cfg.QuotaStore
	q.storeCalls = append(q.storeCalls, func() {
		_, _ = store.Refund(context.Background(), tenant, l, tokens)
	})
}

// runStoreCalls makes the calls left for after the lock (storeCalls) on a
// goroutine of their own, which the caller does not wait for.
func (q *Queue) runStoreCalls(calls []func()) {
	q.storeCallsInFlight.Add(1)
	go func() {
		defer q.storeCallsInFlight.Add(-1)
		for _, call := range calls {
			callGuarded(call)
		}
	}()
}

// callGuarded runs a store call; a panic in it is ignored as a failed call
// is, so that it never ends the process.
func callGuarded(call func()) {
	defer func() { _ = recover() }()
	call()
}
