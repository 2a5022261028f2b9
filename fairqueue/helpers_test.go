package fairqueue

import (
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is where every virtual clock in these tests starts.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testConfig is a one-class configuration: every tenant has weight 1 unless
// weights names it, and capacity is maxInflight per healthy upstream.
func testConfig(maxInflight int, weights map[string]float64) Config {
	cfg := Config{
		MaxInflight: maxInflight,
		Classes: []ClassConfig{
			{Name: "interactive", WaitBudget: 15 * time.Second},
			{Name: "batch", WaitBudget: 300 * time.Second},
		},
		Tenants:      map[string]TenantConfig{},
		Default:      TenantConfig{Weight: 1, Class: "batch"},
		ExpiryMargin: 500 * time.Millisecond,
	}
	for name, w := range weights {
		cfg.Tenants[name] = TenantConfig{Weight: w, Class: "batch"}
	}
	return cfg
}

// harness drives a Queue synchronously on a virtual clock. It plays the
// upstream pool: it learns about dispatches from the observer and completes
// in-flight tickets when told to. It checks, on every event, that no ticket
// is dispatched twice or after its deadline and that every ticket ends
// exactly once.
type harness struct {
	tb  testing.TB
	q   *Queue
	clk *ManualClock
	rng *rand.Rand

	// inflight holds the dispatched, unreleased tickets in dispatch order.
	inflight []*Ticket
	// order is every dispatched ticket, in dispatch order.
	order []*Ticket

	live       map[*Ticket]bool // admitted, not yet ended
	dispatched map[*Ticket]bool
	ended      map[*Ticket]Event

	queuedBy map[string]int     // queued tickets per tenant (own count)
	charged  map[string]float64 // estimated cost at dispatch, per tenant
	served   map[string]float64 // actual cost of completed tickets, per tenant

	// actual gives the cost a completed ticket really had; by default the
	// estimate.
	actual func(tk *Ticket) int64
	// onDispatch, when set, runs after the harness has recorded a dispatch.
	onDispatch func(tk *Ticket)
	// keepOrder, when false, skips recording order (long runs).
	keepOrder bool
}

func newHarness(tb testing.TB, cfg Config, healthy int, seed uint64) *harness {
	tb.Helper()
	clk := NewManualClock(t0)
	q, err := New(cfg, clk)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{tb: tb, q: q, clk: clk, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		live: map[*Ticket]bool{}, dispatched: map[*Ticket]bool{}, ended: map[*Ticket]Event{},
		queuedBy: map[string]int{}, charged: map[string]float64{}, served: map[string]float64{},
		actual: func(tk *Ticket) int64 { return tk.Cost() }, keepOrder: true}
	q.SetObserver(h.observe)
	q.SetHealthy(healthy)
	return h
}

func (h *harness) observe(ev Event, tk *Ticket) {
	h.tb.Helper()
	// A ticket may be dispatched or expired inside Enqueue, before the
	// harness has seen it returned; end() catches events after the end.
	switch ev {
	case EventDispatched:
		if h.dispatched[tk] {
			h.tb.Fatalf("ticket of %s dispatched twice", tk.Tenant())
		}
		if _, done := h.ended[tk]; done {
			h.tb.Fatalf("ticket of %s dispatched after it ended", tk.Tenant())
		}
		if dl := tk.Deadline(); !dl.IsZero() && !h.clk.Now().Before(dl) {
			h.tb.Fatalf("ticket of %s dispatched at %v, at or after its deadline %v",
				tk.Tenant(), h.clk.Now(), dl)
		}
		h.live[tk] = true
		h.dispatched[tk] = true
		h.inflight = append(h.inflight, tk)
		if h.keepOrder {
			h.order = append(h.order, tk)
		}
		h.queuedBy[tk.Tenant()]--
		h.charged[tk.Tenant()] += float64(tk.Cost())
		if h.onDispatch != nil {
			h.onDispatch(tk)
		}
	case EventReleased:
		if !h.dispatched[tk] {
			h.tb.Fatalf("ticket of %s released but never dispatched", tk.Tenant())
		}
		h.end(tk, ev)
	case EventCancelled, EventExpired:
		if h.dispatched[tk] {
			h.tb.Fatalf("ticket of %s ended as %v after dispatch", tk.Tenant(), ev)
		}
		h.queuedBy[tk.Tenant()]--
		h.end(tk, ev)
	default:
		h.tb.Fatalf("unknown event %v", ev)
	}
}

func (h *harness) end(tk *Ticket, ev Event) {
	if prev, done := h.ended[tk]; done {
		h.tb.Fatalf("ticket of %s ended twice (%v, then %v)", tk.Tenant(), prev, ev)
	}
	h.ended[tk] = ev
	delete(h.live, tk)
}

// enqueue admits a request and fails the test on a rejection.
func (h *harness) enqueue(r Request) *Ticket {
	h.tb.Helper()
	tk, err := h.tryEnqueue(r)
	if err != nil {
		h.tb.Fatalf("enqueue %+v: %v", r, err)
	}
	return tk
}

func (h *harness) tryEnqueue(r Request) (*Ticket, error) {
	// Counted before the call: Enqueue may dispatch at once, and the
	// observer decrements.
	h.queuedBy[r.Tenant]++
	tk, err := h.q.Enqueue(r)
	if err != nil {
		h.queuedBy[r.Tenant]--
		return nil, err
	}
	if _, done := h.ended[tk]; !done {
		h.live[tk] = true
	}
	return tk, nil
}

// complete releases the i-th in-flight ticket with its actual cost.
func (h *harness) complete(i int) *Ticket {
	tk := h.inflight[i]
	h.inflight = append(h.inflight[:i], h.inflight[i+1:]...)
	a := h.actual(tk)
	h.served[tk.Tenant()] += float64(a)
	tk.Release(a)
	return tk
}

func (h *harness) completeOldest() *Ticket { return h.complete(0) }

func (h *harness) completeRandom() *Ticket { return h.complete(h.rng.IntN(len(h.inflight))) }

// backlog tops every tenant up to depth queued requests, sizes from cost.
func (h *harness) backlog(tenants []string, depth int, cost func(tenant string) int64) {
	for _, name := range tenants {
		for h.queuedBy[name] < depth {
			h.enqueue(Request{Tenant: name, Cost: cost(name)})
		}
	}
}

// checkConservation asserts work conservation: capacity is full, or nothing
// is queued, or the next request in order does not fit the free token
// capacity while something is in flight. With nothing in flight, nothing
// may wait (the oversized request runs alone).
func (h *harness) checkConservation() {
	h.tb.Helper()
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inflight >= q.capacity || q.queued == 0 {
		return
	}
	if q.up != nil && (q.clock.Now().Before(q.up.poolUntil) || q.clock.Now().Before(q.up.until)) {
		return // the provider account gates dispatch (upstream.go)
	}
	if q.inflight == 0 {
		h.tb.Fatalf("work conservation: %d queued, nothing in flight, capacity %d", q.queued, q.capacity)
	}
	next, _ := q.nextLocked()
	if next == nil {
		// Only requests of tenants at their in-flight cap may wait.
		for _, t := range q.tenants {
			if t.queued > 0 && !t.capped {
				h.tb.Fatalf("work conservation: %s has %d queued, not capped, but no next request", t.name, t.queued)
			}
		}
		return
	}
	if q.tokenCap > 0 && q.inflightCost+next.tokens > q.tokenCap {
		return // strict tag order: the next request waits for tokens
	}
	h.tb.Fatalf("work conservation: %d/%d in flight (%d/%d tokens), %d queued, next (%s, %d tokens) fits",
		q.inflight, q.capacity, q.inflightCost, q.tokenCap, q.queued, next.Tenant(), next.tokens)
}

// checkAccounting compares the queue's counters with the harness's view.
func (h *harness) checkAccounting() {
	h.tb.Helper()
	s := h.q.Stats(false)
	if s.Inflight != len(h.inflight) {
		h.tb.Fatalf("queue has %d in flight, harness %d", s.Inflight, len(h.inflight))
	}
	var cost int64
	for _, tk := range h.inflight {
		cost += tk.Tokens()
	}
	if s.InflightCost != cost {
		h.tb.Fatalf("queue has %d tokens in flight, harness %d", s.InflightCost, cost)
	}
	queued := 0
	for _, n := range h.queuedBy {
		queued += n
	}
	if s.Queued != queued {
		h.tb.Fatalf("queue has %d queued, harness %d", s.Queued, queued)
	}
}

// drain restores capacity and completes everything, then checks that every
// admitted ticket ended exactly once.
func (h *harness) drain(healthy int) {
	h.tb.Helper()
	h.q.SetHealthy(healthy)
	for len(h.inflight) > 0 {
		h.completeOldest()
	}
	if len(h.live) != 0 {
		h.tb.Fatalf("%d tickets never ended", len(h.live))
	}
	s := h.q.Stats(false)
	if s.Queued != 0 || s.Inflight != 0 || s.QueuedCost != 0 || s.InflightCost != 0 {
		h.tb.Fatalf("drained queue not empty: %+v", s)
	}
}

// shares returns each tenant's fraction of the total of m.
func shares(m map[string]float64, tenants []string) []float64 {
	total := 0.0
	for _, name := range tenants {
		total += m[name]
	}
	out := make([]float64, len(tenants))
	for i, name := range tenants {
		out[i] = m[name] / total
	}
	return out
}

// checkShares asserts that each tenant's share of m is within tol (a
// fraction of the expected share) of weight_i / sum(weights).
func checkShares(tb testing.TB, what string, m map[string]float64, tenants []string, weights []float64, tol float64) {
	tb.Helper()
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	got := shares(m, tenants)
	for i, name := range tenants {
		want := weights[i] / sum
		if dev := (got[i] - want) / want; dev > tol || dev < -tol {
			tb.Errorf("%s: tenant %s share %.5f, want %.5f (deviation %+.3f%%, tolerance %.1f%%)",
				what, name, got[i], want, 100*dev, 100*tol)
		} else {
			tb.Logf("%s: tenant %s share %.5f, want %.5f (deviation %+.3f%%)", what, name, got[i], want, 100*dev)
		}
	}
}

// Test-only entry points into the queue: production pauses classes through
// the degrade ladder and promotes through the wait-budget logic.

// Promote moves a queued ticket into the boost lane, ahead of tag order. It
// reports false when the ticket is no longer queued or already boosted.
func (q *Queue) Promote(tk *Ticket) bool {
	q.mu.Lock()
	defer q.unlock()
	if tk.state != stateQueued {
		return false
	}
	now := q.clock.Now()
	q.promoteLocked(now, tk)
	q.dispatchLocked(now)
	return true
}

// SetPaused makes a class yield (paused) or compete normally; the ladder
// sets it again at its next transition.
func (q *Queue) SetPaused(class string, paused bool) {
	q.mu.Lock()
	defer q.unlock()
	if cq := q.classLocked(class); cq != nil && cq.paused != paused {
		cq.paused = paused
		q.aheadPausedLocked(cq)
		q.dispatchLocked(q.clock.Now())
	}
}

// Precheck is PrecheckRequest for a request of tenant and class estimated
// at tokens.
func (q *Queue) Precheck(tenant, class string, tokens int64) *Rejection {
	return q.PrecheckRequest(Request{Tenant: tenant, Class: class, Cost: tokens})
}

// Idle reports whether a request enqueued now would be dispatched at once:
// nothing waits and a slot is free.
func (q *Queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued == 0 && q.inflight < q.capacity
}

// StoreCallsInFlight is the number of store calls made off the lock that
// have not returned yet: a queue with none has applied everything it
// started.
func (q *Queue) StoreCallsInFlight() int64 { return q.storeCallsInFlight.Load() }

// Ticket accessors the tests read.

// Class returns the class the request is scheduled in.
func (tk *Ticket) Class() string { return tk.f.cq.name }

// Tokens returns the estimated tokens the request counts against the token
// caps; it equals Cost unless the unit is CostRequests.
func (tk *Ticket) Tokens() int64 { return tk.tokens }

// Deadline returns the dispatch deadline (zero if none).
func (tk *Ticket) Deadline() time.Time { return tk.deadline }

// Enqueued returns the admission time.
func (tk *Ticket) Enqueued() time.Time { return tk.q.at(tk.enqueued) }

// setStatsPause makes f run between Stats' chunks until the test ends, so
// that a test failing before it puts the default back leaks nothing.
func setStatsPause(tb testing.TB, f func()) {
	old := statsPause
	statsPause = f
	tb.Cleanup(func() { statsPause = old })
}
