package fairqueue

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
)

// budgetConfig is testConfig with one slot per upstream and wait budgets
// on: fast-fail, boost share 1 (one boosted request at a time with one
// slot), no margin, and a throughput prior of prior cost units per second
// per upstream (0: none).
func budgetConfig(prior float64) Config {
	cfg := testConfig(1, nil)
	cfg.Admission = BudgetConfig{FastFail: true, BoostShareMax: 1,
		Throughput: budget.ThroughputConfig{Prior: prior}}
	return cfg
}

func refusedForBudget(err error) bool {
	var rej *Rejection
	return errors.As(err, &rej) && rej.Reason == ReasonBudgetExceeded
}

// A configured throughput prior is an estimate the queue acts on before it
// has measured anything: a flood on a cold queue is refused at admission
// from the first request that cannot make its deadline. Without a prior
// the queue has no estimate and refuses nothing.
func TestAdmissionPriorBeforeMeasurement(t *testing.T) {
	for _, prior := range []float64{0, 100} {
		cfg := budgetConfig(prior)
		cfg.Admission.BoostShareMax = 0
		h := newHarness(t, cfg, 1, 1)
		h.enqueue(Request{Tenant: "a", Cost: 100}) // takes the slot
		deadline := t0.Add(5 * time.Second)
		admitted := 0
		for i := 0; i < 10; i++ {
			_, err := h.tryEnqueue(Request{Tenant: "a", Cost: 100, Deadline: deadline})
			switch {
			case err == nil:
				admitted++
			case !refusedForBudget(err):
				t.Fatalf("prior %v: request %d: %v", prior, i, err)
			}
		}
		// With 100/s: the i-th queued request (i from 0) has i*100 ahead
		// plus half a request until the slot frees: ETA i+0.5 s, so the
		// first five make 5 s.
		want := 5
		if prior == 0 {
			want = 10
		}
		if admitted != want {
			t.Errorf("prior %v: %d admitted, want %d", prior, admitted, want)
		}
	}
}

// With cost_unit requests the ETA counts queued requests, the unit the
// rate is measured in, not their tokens.
func TestAdmissionETAUnitsWithCostRequests(t *testing.T) {
	cfg := budgetConfig(2) // 2 requests/s
	cfg.CostUnit = CostRequests
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 10000})
	for i := 0; i < 4; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 10000})
	}
	tk := h.enqueue(Request{Tenant: "a", Cost: 10000, Deadline: t0.Add(time.Hour)})
	// Four requests ahead and half of one until the slot frees, at 2/s.
	if got, want := tk.ETA(), 2250*time.Millisecond; got != want {
		t.Errorf("ETA %v, want %v", got, want)
	}
}

// warm completes one request of cost 100, so that the mean completed cost
// is 100 and the work until a slot frees half of it: 0.5 s at 100/s.
func warm(h *harness) {
	h.enqueue(Request{Tenant: "w", Cost: 100})
	h.completeOldest()
}

// A boost serves a request that tag order puts behind other tenants' work.
// One whose own flow holds a request due first is not boosted past it: that
// would only reorder the tenant's own requests, and the one due first would
// miss instead.
func TestAdmissionBoostNotPastOwnQueue(t *testing.T) {
	h := newHarness(t, budgetConfig(100), 1, 1)
	warm(h)
	h.enqueue(Request{Tenant: "x", Cost: 100}) // takes the slot
	dl := t0.Add(2 * time.Second)
	b := h.enqueue(Request{Tenant: "x", Cost: 1000, Deadline: dl}) // ETA 0.5 s
	// c: 1000 of its own ahead, ETA 10.5 s; a boost would jump b, which is
	// due at the same time, so it is refused.
	if _, err := h.tryEnqueue(Request{Tenant: "x", Cost: 1000, Deadline: dl}); !refusedForBudget(err) {
		t.Fatalf("c: got %v, want wait_budget_exceeded", err)
	}
	// d: an idle tenant, behind 900 of x's work in tag order (ETA 9.5 s):
	// boosted at admission.
	d := h.enqueue(Request{Tenant: "y", Cost: 1000, Deadline: dl})
	h.completeOldest()
	if len(h.inflight) != 1 || h.inflight[0] != d || !d.Boosted() {
		t.Fatalf("d was not boosted ahead of b")
	}
	if b.Boosted() {
		t.Fatal("b boosted")
	}
}

// When the boost share is in use, a request a boost would save waits for
// the lane to open (the re-check boosts it) instead of being refused, as
// long as a boosted slot is predicted to free in time.
func TestAdmissionBoostLater(t *testing.T) {
	cfg := budgetConfig(100)
	for _, n := range []string{"x", "y"} {
		cfg.Tenants[n] = TenantConfig{Weight: 1, Class: "batch"}
	}
	h := newHarness(t, cfg, 1, 1)
	warm(h)
	h.enqueue(Request{Tenant: "x", Cost: 100})  // takes the slot
	h.enqueue(Request{Tenant: "x", Cost: 2000}) // x's backlog
	y := h.enqueue(Request{Tenant: "y", Cost: 1000, Deadline: t0.Add(2 * time.Second)})
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if y.state != stateBoosted {
		t.Fatal("y not boosted")
	}
	z := &tenant{name: "z", weight: 1}
	cq := q.classLocked("batch")
	// Tag order puts z behind y's boost, all of x's backlog and the next
	// slot: ETA 30.5 s. Boosted, it would wait for y and the slot (10.5 s)
	// and for the lane to open: one of k=1 boosted of C=1 slots completes
	// in C/k x the mean completed cost over the rate, 1 s: 11.5 s.
	eta, ok, later := q.boostPlanLocked(t0, z, cq, 3000, t0.Add(20*time.Second), q.adm.rate.Rate(t0, q.healthy))
	if !ok || !later || eta != 11500*time.Millisecond {
		t.Errorf("boost plan: %v, ok %v, later %v; want 11.5s, later", eta, ok, later)
	}
	if d, est := q.decideLocked(t0, z, cq, 3000, t0.Add(20*time.Second)); d != budget.Wait || est.ETA != 30500*time.Millisecond {
		t.Errorf("20 s budget: %v (ETA %v), want wait (ETA 30.5s)", d, est.ETA)
	}
	if d, _ := q.decideLocked(t0, z, cq, 3000, t0.Add(10*time.Second)); d != budget.Reject {
		t.Errorf("10 s budget: %v, want reject", d)
	}
}

// A boosted request keeps its deadline: when no slot frees in time, Tick
// answers it with queue_timeout before the deadline, rather than the boost
// lane holding it until a slot finally frees.
func TestBoostedRequestStillExpires(t *testing.T) {
	cfg := testConfig(1, nil)
	cfg.ExpiryMargin = 100 * time.Millisecond
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100}) // holds the only slot
	tk := h.enqueue(Request{Tenant: "b", Cost: 10, Deadline: t0.Add(time.Second)})
	if !h.q.Promote(tk) {
		t.Fatal("Promote refused a queued ticket")
	}
	h.clk.Advance(800 * time.Millisecond)
	h.q.Tick()
	if err := tk.Err(); err != nil {
		t.Fatalf("expired %v early: %v", time.Second-800*time.Millisecond, err)
	}
	h.clk.Advance(150 * time.Millisecond) // within ExpiryMargin of the deadline
	h.q.Tick()
	var rej *Rejection
	if !errors.As(tk.Err(), &rej) || rej.Reason != ReasonQueueTimeout {
		t.Fatalf("boosted ticket near its deadline: err %v, want queue_timeout", tk.Err())
	}
	if h.ended[tk] != EventExpired {
		t.Fatalf("boosted ticket ended with event %v, want EventExpired", h.ended[tk])
	}
}
