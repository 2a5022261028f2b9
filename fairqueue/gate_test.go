package fairqueue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// slowStore is a Memory that says it is remote (as the cluster's Redis
// store does), counts the calls made while the queue's lock was held, and
// holds each call until the test lets it go (when blocking).
type slowStore struct {
	*quota.Memory
	q         atomic.Pointer[Queue]
	underLock atomic.Int32
	calls     atomic.Int32
	refunds   atomic.Int32

	mu      sync.Mutex
	blocked chan struct{} // nil: calls go through
	entered chan string   // each blocked call's name, once it waits
}

func (s *slowStore) Remote() bool { return true }

// call records one call and waits while the store blocks.
func (s *slowStore) call(name string) {
	s.calls.Add(1)
	if q := s.q.Load(); q != nil && !lockFree(q) {
		s.underLock.Add(1)
	}
	s.mu.Lock()
	b := s.blocked
	s.mu.Unlock()
	if b != nil {
		s.entered <- name
		<-b
	}
}

// lockFree reports whether q's lock can be taken within a while: the
// other goroutines of the test hold it only for moments, a caller that
// made this call under it would hold it throughout.
func lockFree(q *Queue) bool {
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; time.Sleep(50 * time.Microsecond) {
		if q.mu.TryLock() {
			q.mu.Unlock()
			return true
		}
	}
	return false
}

func (s *slowStore) block() {
	s.mu.Lock()
	s.blocked = make(chan struct{})
	s.mu.Unlock()
}

func (s *slowStore) unblock() {
	s.mu.Lock()
	close(s.blocked)
	s.blocked = nil
	s.mu.Unlock()
}

func (s *slowStore) Peek(ctx context.Context, tenant string, l *quota.Limits, ahead quota.Backlog) (quota.Decision, error) {
	s.call("peek")
	return s.Memory.Peek(ctx, tenant, l, ahead)
}

func (s *slowStore) Charge(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Decision, error) {
	s.call("charge")
	return s.Memory.Charge(ctx, tenant, l, tokens)
}

func (s *slowStore) Book(ctx context.Context, tenant string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (quota.Decision, error) {
	s.call("book")
	return s.Memory.Book(ctx, tenant, l, tokens, maxWait, lead)
}

func (s *slowStore) Refund(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Status, error) {
	s.refunds.Add(1)
	s.call("refund")
	return s.Memory.Refund(ctx, tenant, l, tokens)
}

func (s *slowStore) Reconcile(ctx context.Context, tenant string, l *quota.Limits, estimated, actual int64) (quota.Status, error) {
	s.call("reconcile")
	return s.Memory.Reconcile(ctx, tenant, l, estimated, actual)
}

func (s *slowStore) Status(ctx context.Context, tenant string, l *quota.Limits) (quota.Status, error) {
	s.call("status")
	return s.Memory.Status(ctx, tenant, l)
}

// settle waits until every store call made off the lock has returned.
func settle(t *testing.T, q *Queue) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.StoreCallsInFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a store call off the lock never came back")
		}
		time.Sleep(time.Millisecond)
	}
}

func dispatched(tk *Ticket) bool { return !tk.Dispatched().IsZero() }

// TestRemoteQuotaDecidedOffLock: with a remote store, no store call is made
// under the queue's lock. While a metered tenant's booking at admission
// waits on a slow store, a tenant without a quota is admitted and
// dispatched at once. A booked request goes at its booked time with no
// call at dispatch; one whose quota time leaves it no room before its
// deadline is refused at admission, charged nothing; a booked request
// cancelled or expired gives its booking back, off the lock, and the
// next booking takes its place.
func TestRemoteQuotaDecidedOffLock(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 1})
	cfg.MaxInflight = 2
	clk := NewManualClock(t0)
	store := &slowStore{Memory: quota.NewMemory(clk.Now), entered: make(chan string, 16)}
	cfg.QuotaStore = store
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	store.q.Store(q)
	q.SetHealthy(1)
	l := cfg.Tenants["a"].Quota

	// The booking at admission waits on the store, off the lock.
	store.block()
	type enq struct {
		tk  *Ticket
		err error
	}
	first := make(chan enq, 1)
	go func() {
		tk, err := q.Enqueue(Request{Tenant: "a", Cost: 10})
		first <- enq{tk, err}
	}()
	if got := <-store.entered; got != "book" {
		t.Fatalf("first store call %q, want the admission's booking", got)
	}
	b1, err := q.Enqueue(Request{Tenant: "b", Cost: 10})
	if err != nil || !dispatched(b1) {
		t.Fatalf("a tenant without a quota while the store is slow: %v, dispatched %v; want it dispatched at once", err, dispatched(b1))
	}
	store.unblock()
	r := <-first
	if r.err != nil || !dispatched(r.tk) {
		t.Fatalf("a's first request, booked at rest: %v, dispatched %v; want dispatched", r.err, dispatched(r.tk))
	}
	a1 := r.tk
	if n := store.calls.Load(); n != 1 {
		t.Errorf("%d store calls for a request booked and dispatched, want 1 (the booking)", n)
	}

	// A second request within the second: booked for t0+1s, queued, its
	// tenant held; dispatched then without a call.
	b1.Release(UnknownCost)
	a2, err := q.Enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(5 * time.Second)})
	if err != nil || dispatched(a2) || a2.QuotaWait() != time.Second {
		t.Fatalf("a's second request within its second: %v, dispatched %v, quota wait %v; want queued for 1s", err, dispatched(a2), a2.QuotaWait())
	}
	calls := store.calls.Load()
	clk.Set(t0.Add(time.Second))
	q.Tick()
	if !dispatched(a2) {
		t.Fatal("a's second request not dispatched at its booked time")
	}
	if n := store.calls.Load() - calls; n != 0 {
		t.Errorf("%d store calls at the dispatch of a booked request, want none", n)
	}

	// The next place is t0+2s: a request due by t0+1.5s cannot have it,
	// and is refused at once, charged nothing.
	before, _ := store.Memory.Status(context.Background(), "a", l)
	_, err = q.Enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(1500 * time.Millisecond)})
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Reason != ReasonQuotaExceeded || rej.RetryAfter != time.Second {
		t.Fatalf("a request its quota cannot start before its deadline: %v, want quota_exceeded, Retry-After 1s", err)
	}
	if st, _ := store.Memory.Status(context.Background(), "a", l); st != before {
		t.Errorf("a refused booking charged the quota: %+v, was %+v", st, before)
	}

	// Booked for t0+2s, then cancelled: its booking is given back.
	a3, err := q.Enqueue(Request{Tenant: "a", Cost: 10})
	if err != nil || a3.QuotaWait() != time.Second {
		t.Fatalf("a3: %v, quota wait %v; want booked 1s ahead", err, a3.QuotaWait())
	}
	a3.Release(UnknownCost)
	settle(t, q)
	if st, _ := store.Memory.Status(context.Background(), "a", l); st != before {
		t.Errorf("after a booked request was cancelled: %+v, want the quota as before it (%+v)", st, before)
	}
	// And one that expires: the same.
	a4, err := q.Enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(3500 * time.Millisecond)})
	if err != nil || a4.QuotaWait() != time.Second {
		t.Fatalf("a4: %v, quota wait %v; want booked 1s ahead", err, a4.QuotaWait())
	}
	clk.Set(t0.Add(3500 * time.Millisecond))
	q.Tick()
	if !errors.As(a4.Err(), &rej) || rej.Reason != ReasonQueueTimeout {
		t.Fatalf("a4 past its deadline: %v, want queue_timeout", a4.Err())
	}
	settle(t, q)
	if st, _ := store.Memory.Status(context.Background(), "a", l); st.Requests.Reset != 0 {
		t.Errorf("after a booked request expired: %+v, want the quota at rest", st)
	}
	a1.Release(UnknownCost)
	a2.Release(UnknownCost)
	settle(t, q)
	if n := q.Stats(false).Inflight; n != 0 {
		t.Errorf("%d in flight at the end, want 0", n)
	}
	if n := store.underLock.Load(); n != 0 {
		t.Errorf("%d of %d store calls made under the queue's lock, want none", n, store.calls.Load())
	}
}

// TestBookingsTakenInDispatchOrder: a tenant's booked times are its, not
// one request's: two admissions that reached the store in one order and
// the queue in the other still go at the two times, in the queue's order,
// and neither waits past the later one.
func TestBookingsTakenInDispatchOrder(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 1})
	cfg.MaxInflight = 1
	clk := NewManualClock(t0)
	store := &slowStore{Memory: quota.NewMemory(clk.Now)}
	cfg.QuotaStore = store
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(1)
	hold, err := q.Enqueue(Request{Tenant: "b", Cost: 10}) // the one slot, until released
	if err != nil || !dispatched(hold) {
		t.Fatal(err)
	}
	x, _ := q.Enqueue(Request{Tenant: "a", Cost: 10}) // booked now
	y, _ := q.Enqueue(Request{Tenant: "a", Cost: 10}) // booked t0+1s
	// Swap their places in the flow, as a race between the store and the
	// lock would have queued them.
	q.mu.Lock()
	f := x.f
	f.q.remove(x)
	f.q.insertAfter(x, f.q.tail)
	q.mu.Unlock()
	if f.q.head != y {
		t.Fatal("test setup: y is not at the head")
	}
	hold.Release(UnknownCost)
	if !dispatched(y) || dispatched(x) {
		t.Fatalf("with a slot free: y (head) dispatched %v, x %v; want y on the earliest booked time", dispatched(y), dispatched(x))
	}
	y.Release(UnknownCost)
	if dispatched(x) {
		t.Fatal("x went before the second booked time")
	}
	clk.Set(t0.Add(time.Second))
	q.Tick()
	if !dispatched(x) {
		t.Fatal("x not dispatched at the second booked time")
	}
	x.Release(UnknownCost)
	settle(t, q)
}

// TestRequeueKeepsBooking: a booked request its provider sends back
// (Requeue) keeps its booking: it goes again at once, with no store call,
// and its tenant stays charged for it once.
func TestRequeueKeepsBooking(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 1})
	cfg.MaxInflight = 1
	clk := NewManualClock(t0)
	store := &slowStore{Memory: quota.NewMemory(clk.Now)}
	cfg.QuotaStore = store
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(1)
	l := cfg.Tenants["a"].Quota
	a1, err := q.Enqueue(Request{Tenant: "a", Cost: 10})
	if err != nil || !dispatched(a1) {
		t.Fatalf("%v, dispatched %v", err, dispatched(a1))
	}
	charged, _ := store.Memory.Status(context.Background(), "a", l)
	calls := store.calls.Load()
	clk.Advance(100 * time.Millisecond)
	if !a1.Requeue() {
		t.Fatal("Requeue refused an in-flight ticket")
	}
	if !dispatched(a1) {
		t.Fatal("the requeued request, whose booking had come, was not dispatched again at once")
	}
	settle(t, q)
	if n := store.calls.Load() - calls; n != 0 {
		t.Errorf("%d store calls for a requeued booked request, want none", n)
	}
	if st, _ := store.Memory.Status(context.Background(), "a", l); st.Requests.Reset != charged.Requests.Reset-100*time.Millisecond {
		t.Errorf("after the requeue: %+v, want the one charge (%v of debt, 100ms ago)", st.Requests, charged.Requests.Reset)
	}
	a1.Release(UnknownCost)
	settle(t, q)
}

// lateStore is a remote Memory whose bookings answer after the clock
// moved on by lag (a store that took that long to answer).
type lateStore struct {
	*quota.Memory
	clk *ManualClock
	lag time.Duration
}

func (s *lateStore) Remote() bool { return true }

func (s *lateStore) Book(ctx context.Context, tenant string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (quota.Decision, error) {
	d, err := s.Memory.Book(ctx, tenant, l, tokens, maxWait, lead)
	s.clk.Advance(s.lag)
	return d, err
}

// TestBookingAnsweredLate: a place booked in time, whose answer came so
// late that it no longer leaves the request its margin before the
// deadline, is refused (429 quota_exceeded) and given back, rather than
// queued to expire.
func TestBookingAnsweredLate(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 1})
	clk := NewManualClock(t0)
	store := &lateStore{Memory: quota.NewMemory(clk.Now), clk: clk}
	cfg.QuotaStore = store
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(1)
	l := cfg.Tenants["a"].Quota
	a1, err := q.Enqueue(Request{Tenant: "a", Cost: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Release(UnknownCost)
	before, _ := store.Memory.Status(context.Background(), "a", l)
	// The next place is 1 s ahead; the deadline 1.5 s: in time when asked,
	// but the answer takes 400 ms.
	store.lag = 400 * time.Millisecond
	_, err = q.Enqueue(Request{Tenant: "a", Cost: 10, Deadline: clk.Now().Add(1500 * time.Millisecond)})
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Reason != ReasonQuotaExceeded || !strings.Contains(rej.Detail, "slow answer") {
		t.Fatalf("a booking answered too late: %v, want quota_exceeded (the store's slow answer)", err)
	}
	settle(t, q)
	if st, _ := store.Memory.Status(context.Background(), "a", l); st.Requests.Reset != before.Requests.Reset-400*time.Millisecond {
		t.Errorf("the late booking was not given back: %+v, want %v of debt", st.Requests, before.Requests.Reset-400*time.Millisecond)
	}
}
