package fairqueue

import (
	"context"
	"errors"
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

func (s *slowStore) Refund(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Status, error) {
	s.refunds.Add(1)
	s.call("refund")
	return s.Memory.Refund(ctx, tenant, l, tokens)
}

// settle waits until every charge made off the lock has been applied.
func settle(t *testing.T, q *Queue) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.GatesInFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a charge off the lock never came back")
		}
		time.Sleep(time.Millisecond)
	}
}

func dispatched(tk *Ticket) bool { return !tk.Dispatched().IsZero() }

// TestRemoteQuotaDecidedOffLock: with a remote store, no store call is made
// under the queue's lock. While a metered tenant's Peek at admission and
// its charge at dispatch wait on a slow store, a tenant without a quota is
// admitted and dispatched at once, and the metered request holds its slot
// meanwhile (capacity counts it). A charge the store refuses holds the
// tenant and puts the request back at the head of its queue; a request
// cancelled while its charge is made ends at once and its charge is
// refunded.
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

	// The Peek at admission waits on the store, off the lock.
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
	if got := <-store.entered; got != "peek" {
		t.Fatalf("first store call %q, want the admission's peek", got)
	}
	b1, err := q.Enqueue(Request{Tenant: "b", Cost: 10})
	if err != nil || !dispatched(b1) {
		t.Fatalf("a tenant without a quota while the store is slow: %v, dispatched %v; want it dispatched at once", err, dispatched(b1))
	}
	store.unblock()
	// Its charge at dispatch waits on the store too, holding the last slot.
	store.block()
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := <-store.entered; got != "charge" {
		t.Fatalf("second store call %q, want the dispatch's charge", got)
	}
	a1 := r.tk
	if dispatched(a1) || q.Stats(false).Inflight != 2 {
		t.Fatalf("while its charge is made: dispatched %v, %d in flight; want not yet, and its slot held (2)", dispatched(a1), q.Stats(false).Inflight)
	}
	b1.Release(UnknownCost)
	b2, err := q.Enqueue(Request{Tenant: "b", Cost: 10})
	if err != nil || !dispatched(b2) {
		t.Fatalf("b's next request while a's charge is made: %v, dispatched %v", err, dispatched(b2))
	}
	store.unblock()
	settle(t, q)
	if !dispatched(a1) {
		t.Fatal("the charge allowed it, but the request was not dispatched")
	}

	// A second request within the second: refused by the store at
	// dispatch (the Peek counted only a's queue: none), so it goes back
	// to the head of a's queue and a is held until the quota allows it.
	a2, err := q.Enqueue(Request{Tenant: "a", Cost: 10})
	if err != nil {
		t.Fatal(err)
	}
	b2.Release(UnknownCost)
	settle(t, q)
	if dispatched(a2) || a2.Err() != nil {
		t.Fatalf("a's second request within its second: dispatched %v, err %v; want queued", dispatched(a2), a2.Err())
	}
	clk.Set(t0.Add(time.Second))
	q.Tick()
	settle(t, q)
	if !dispatched(a2) {
		t.Fatal("a's second request not dispatched once its quota allowed it")
	}

	// Cancelled while its charge is made: it ends at once, and the charge
	// the store made is refunded when it answers.
	a1.Release(UnknownCost)
	clk.Set(t0.Add(2 * time.Second))
	store.block()
	var a3 *Ticket
	done := make(chan struct{})
	go func() {
		defer close(done)
		a3, err = q.Enqueue(Request{Tenant: "a", Cost: 10})
	}()
	<-store.entered // the peek
	store.mu.Lock()
	close(store.blocked)
	store.blocked = make(chan struct{})
	store.mu.Unlock()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	<-store.entered // the charge, holding a2's freed slot... or the last one
	a3.Release(UnknownCost)
	var rej *Rejection
	if !errors.As(a3.Err(), &rej) || rej.Reason != ReasonCancelled {
		t.Fatalf("cancelled while its charge was made: err %v, want cancelled at once", a3.Err())
	}
	refunds := store.refunds.Load()
	store.unblock()
	settle(t, q)
	for store.refunds.Load() == refunds {
		time.Sleep(time.Millisecond) // the refund follows the gate's end
	}
	if st, _ := store.Memory.Status(context.Background(), "a", cfg.Tenants["a"].Quota); st.Requests.Reset != 0 {
		t.Errorf("the cancelled request's charge was not refunded: %+v", st.Requests)
	}
	a2.Release(UnknownCost)
	if n := q.Stats(false).Inflight; n != 0 {
		t.Errorf("%d in flight at the end, want 0 (a slot held for a charge leaked)", n)
	}
	if n := store.underLock.Load(); n != 0 {
		t.Errorf("%d of %d store calls made under the queue's lock, want none", n, store.calls.Load())
	}
}
