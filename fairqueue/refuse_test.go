package fairqueue

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
)

// earlyConfig is one slot per upstream, fast-fail on, no boost, no margin,
// no throughput prior: a cold gateway.
func earlyConfig() Config {
	cfg := testConfig(1, nil)
	cfg.Admission = BudgetConfig{FastFail: true}
	return cfg
}

// A cold queue admits a flood it knows nothing about, then refuses from the
// tail, while queued, every request that the cold bound shows to be late:
// after 1 s the request in flight has not completed, so a request takes at
// least 1 s and the slot does at most 100 cost units/s.
func TestEarlyRefusalFromTail(t *testing.T) {
	h := newHarness(t, earlyConfig(), 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100}) // takes the slot
	deadline := t0.Add(5 * time.Second)
	var tks []*Ticket
	for i := 0; i < 10; i++ {
		tks = append(tks, h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: deadline}))
	}
	h.q.Tick()
	for i, tk := range tks {
		if tk.Err() != nil {
			t.Fatalf("at t0: request %d refused with nothing known: %v", i, tk.Err())
		}
	}
	h.clk.Advance(time.Second)
	h.q.Tick()
	// The i-th queued request (from 0) has i requests ahead of it plus
	// half a request until the slot frees: ETA (i+0.5) s at 100/s, 4 s
	// left. Requests 0..3 make it; 4..9 do not.
	for i, tk := range tks {
		var rej *Rejection
		got := errors.As(tk.Err(), &rej)
		if want := i >= 4; got != want {
			t.Fatalf("request %d: refused %v (err %v), want %v", i, got, tk.Err(), want)
		}
		if !got {
			continue
		}
		eta := time.Duration(i)*time.Second + 500*time.Millisecond
		if rej.Reason != ReasonBudgetExceeded || !rej.WhileQueued || rej.BudgetLeft != 0.8 ||
			rej.RetryAfter != budget.RetryAfter(eta) || h.ended[tk] != EventExpired {
			t.Errorf("request %d: %+v, event %v; want wait_budget_exceeded while queued, 0.8 of the budget left, Retry-After %v",
				i, rej, h.ended[tk], budget.RetryAfter(eta))
		}
	}
	// The refused tail is taken back from the flow's intake: the work
	// ahead of the new tail is exactly the three requests before it.
	h.q.mu.Lock()
	ahead := h.q.aheadInFlow(tks[3])
	h.q.mu.Unlock()
	if ahead != 300 {
		t.Errorf("work ahead of the remaining tail %d, want 300", ahead)
	}
	// Stable: the same instant refuses nothing more.
	h.q.Tick()
	if tks[3].Err() != nil {
		t.Fatalf("second pass refused request 3: %v", tks[3].Err())
	}
	h.checkAccounting()
}

// With fast-fail off the queue never refuses: late requests expire.
func TestEarlyRefusalOff(t *testing.T) {
	cfg := earlyConfig()
	cfg.Admission.FastFail = false
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	tk := h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(5 * time.Second)})
	for i := 0; i < 10; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(5 * time.Second)})
	}
	h.clk.Advance(time.Second)
	h.q.Tick()
	if tk.Err() != nil {
		t.Fatalf("refused with fast-fail off: %v", tk.Err())
	}
	for tk, ev := range h.ended {
		t.Fatalf("ticket of %s ended (%v) with fast-fail off", tk.Tenant(), ev)
	}
}

// A capacity change re-checks the queue at once, without waiting for a
// tick.
func TestEarlyRefusalOnCapacityChange(t *testing.T) {
	h := newHarness(t, earlyConfig(), 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	var tks []*Ticket
	for i := 0; i < 10; i++ {
		tks = append(tks, h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(5 * time.Second)}))
	}
	h.clk.Advance(time.Second)
	h.q.SetHealthy(2) // one more slot: the next request starts now
	refused := 0
	for _, tk := range tks {
		if refusedForBudget(tk.Err()) {
			refused++
		}
	}
	// Two slots at 100/s each: request i (from 0) has i x 100 ahead plus
	// half a request, at 200/s: (i+0.5)/2 s against 4 s left, so 0..7
	// make it and 8 and 9 do not (with one slot, 4..9 would not).
	if refused != 2 || !refusedForBudget(tks[8].Err()) || !refusedForBudget(tks[9].Err()) {
		t.Fatalf("%d refused on the capacity change, want 2, the tail", refused)
	}
}

// Another tenant's flood ahead in tag order counts: a light tenant's
// request is refused only when the work tag order puts ahead of it is
// late, and its own queue is walked from its tail.
func TestEarlyRefusalCountsOtherTenants(t *testing.T) {
	h := newHarness(t, earlyConfig(), 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	for i := 0; i < 20; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(time.Hour)})
	}
	// b's request finishes, in virtual time, after 5 of a's: 5 x 100 of
	// a's work plus half a slot ahead of it, 5.5 s at 100/s.
	b := h.enqueue(Request{Tenant: "b", Cost: 500, Deadline: t0.Add(6 * time.Second)})
	h.clk.Advance(time.Second)
	h.q.Tick()
	if !refusedForBudget(b.Err()) {
		t.Fatalf("b's request (ETA 5.5 s, 5 s left) not refused: %v", b.Err())
	}
	c := h.enqueue(Request{Tenant: "c", Cost: 300, Deadline: t0.Add(6 * time.Second)})
	h.q.Tick()
	if c.Err() != nil {
		t.Fatalf("c's request (ETA 3.5 s, 5 s left) refused: %v", c.Err())
	}
}

func TestColdBoundIsNotAPromise(t *testing.T) {
	// The cold bound refuses, it never admits: with no prior and no
	// measurement, admission has no ETA to promise (Ticket.ETA 0).
	h := newHarness(t, earlyConfig(), 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	h.clk.Advance(time.Second)
	tk := h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(10 * time.Second)})
	if tk.ETA() != 0 {
		t.Fatalf("cold admission promised ETA %v", tk.ETA())
	}
	// ...but it refuses at admission what it already knows is late: 1 s
	// of age, 100/s at most, 20 requests ahead.
	for i := 0; i < 20; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(time.Hour)})
	}
	if _, err := h.tryEnqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(10 * time.Second)}); !refusedForBudget(err) {
		t.Fatalf("late request admitted cold: %v", err)
	}
}

// BenchmarkRefusePass measures one early-refusal pass, the per-tick cost,
// at 100k queued requests that all still make their deadline (a pass that
// refuses nothing, the steady state): in one tenant's flow, and in 100k
// tenants' flows of one request each.
func BenchmarkRefusePass(b *testing.B) {
	for _, tenants := range []int{1, 100000} {
		b.Run(fmt.Sprintf("queued=100000/tenants=%d", tenants), func(b *testing.B) {
			cfg := Config{
				MaxInflight: 64,
				Classes:     []ClassConfig{{Name: "batch", WaitBudget: time.Hour}},
				Default:     TenantConfig{Weight: 1, Class: "batch"},
				// Filled with admission's ETA off (no rate yet) and fast-fail
				// off; the pass is switched on below.
				Admission: BudgetConfig{BoostShareMax: 0.1},
			}
			clk := NewManualClock(time.Unix(0, 0))
			q, err := New(cfg, clk)
			if err != nil {
				b.Fatal(err)
			}
			q.SetHealthy(1)
			names := make([]string, tenants)
			for i := range names {
				names[i] = fmt.Sprint("t", i)
			}
			for i := 0; i < 100000+64; i++ {
				if _, err := q.Enqueue(Request{Tenant: names[i%tenants], Cost: 100,
					Deadline: clk.Now().Add(time.Hour)}); err != nil {
					b.Fatal(err)
				}
			}
			if q.Stats(false).Queued != 100000 {
				b.Fatalf("queued %d", q.Stats(false).Queued)
			}
			q.mu.Lock()
			q.cfg.Admission.FastFail = true
			q.adm.rate = budget.NewThroughput(budget.ThroughputConfig{Prior: 1e9})
			q.mu.Unlock()
			now := clk.Now()
			b.ReportAllocs()
			for b.Loop() {
				q.mu.Lock()
				q.refuseLocked(now)
				q.mu.Unlock()
			}
			if q.Stats(false).Queued != 100000 {
				b.Fatalf("the pass refused: %d queued", q.Stats(false).Queued)
			}
		})
	}
}
