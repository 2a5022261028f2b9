package fairqueue

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// costMix draws request sizes per tenant: each tenant has its own shape, so
// fairness has to hold across very different request sizes.
func costMix(h *harness) func(tenant string) int64 {
	return func(tenant string) int64 {
		switch tenant {
		case "chat": // short chat turns
			return 20 + h.rng.Int64N(180)
		case "rag": // long prompts
			return 500 + h.rng.Int64N(2500)
		case "mixed": // mostly small, sometimes huge
			if h.rng.IntN(5) == 0 {
				return 4000
			}
			return 50
		default: // uniform middle
			return 1000 + h.rng.Int64N(1000)
		}
	}
}

// runBacklogged keeps every tenant backlogged (depth queued requests) and
// completes a random in-flight ticket n times, advancing the clock.
func runBacklogged(h *harness, tenants []string, depth, n int, cost func(string) int64) {
	h.backlog(tenants, depth, cost)
	for i := 0; i < n; i++ {
		h.clk.Advance(10 * time.Millisecond)
		h.completeRandom()
		h.backlog(tenants, depth, cost)
	}
}

// Test 1: equal weights, permanently backlogged, very different request
// sizes: long-run shares of actual served tokens within 1% of equal.
func TestSharesEqualWeights(t *testing.T) {
	tenants := []string{"chat", "rag", "mixed", "batch"}
	h := newHarness(t, testConfig(4, nil), 2, 1)
	h.keepOrder = false
	runBacklogged(h, tenants, 3, 60000, costMix(h))
	checkShares(t, "served actual tokens", h.served, tenants, []float64{1, 1, 1, 1}, 0.01)
	h.drain(2)
}

// Test 2: weights 30:30:15 give shares 2:2:1 within 1%.
func TestSharesWeighted(t *testing.T) {
	tenants := []string{"chat", "rag", "mixed"}
	h := newHarness(t, testConfig(4, map[string]float64{"chat": 30, "rag": 30, "mixed": 15}), 2, 2)
	h.keepOrder = false
	runBacklogged(h, tenants, 3, 60000, costMix(h))
	checkShares(t, "served actual tokens", h.served, tenants, []float64{2, 2, 1}, 0.01)
	h.drain(2)
}

// Test 2b: the same with cost_unit requests: shares count requests.
func TestSharesWeightedRequests(t *testing.T) {
	tenants := []string{"chat", "rag", "mixed"}
	cfg := testConfig(4, map[string]float64{"chat": 30, "rag": 30, "mixed": 15})
	cfg.CostUnit = CostRequests
	h := newHarness(t, cfg, 2, 3)
	h.keepOrder = false
	count := map[string]float64{}
	h.onDispatch = func(tk *Ticket) {
		count[tk.Tenant()]++
		if tk.Cost() != 1 {
			t.Fatalf("cost_unit requests charged %d", tk.Cost())
		}
	}
	runBacklogged(h, tenants, 3, 30000, costMix(h))
	checkShares(t, "dispatched requests", count, tenants, []float64{2, 2, 1}, 0.01)
	h.drain(2)
}

// Test 3: the VTC bound. Two backlogged tenants of equal weight: the
// difference in service between them never exceeds twice the largest
// request cost, checked at every dispatch, with several slots in flight and
// completions in random order.
func TestServiceDifferenceBound(t *testing.T) {
	const maxCost = 4096
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			tenants := []string{"a", "b"}
			h := newHarness(t, testConfig(3, nil), 2, seed)
			h.keepOrder = false
			cost := func(string) int64 {
				// Heavy-tailed sizes between 1 and maxCost.
				switch h.rng.IntN(4) {
				case 0:
					return maxCost
				case 1:
					return 1 + h.rng.Int64N(64)
				default:
					return 1 + h.rng.Int64N(maxCost)
				}
			}
			// Fill the slots with a filler tenant first, so that a and b
			// are both backlogged from their first dispatch on: the bound
			// is about service received while both are backlogged.
			for i := 0; i < 6; i++ {
				h.enqueue(Request{Tenant: "filler", Cost: 1})
			}
			h.backlog(tenants, 3, cost)
			worst, checked := 0.0, 0
			h.onDispatch = func(tk *Ticket) {
				d := math.Abs(h.charged["a"] - h.charged["b"])
				worst = max(worst, d)
				if d > 2*maxCost {
					t.Fatalf("after %d dispatches service differs by %.0f > 2x%d", checked, d, maxCost)
				}
				checked++
				if checked%997 == 0 {
					// The queue's own counters agree with ours.
					s := h.q.Stats(true)
					for _, ts := range s.Tenants {
						if ts.Served != h.charged[ts.Name] {
							t.Fatalf("Stats says %s served %.0f, harness %.0f", ts.Name, ts.Served, h.charged[ts.Name])
						}
					}
				}
			}
			runBacklogged(h, tenants, 3, 40000, cost)
			t.Logf("%d dispatches checked, worst service difference %.0f (bound %d)", checked, worst, 2*maxCost)
			h.onDispatch = nil
			h.drain(2)
		})
	}
}

// Test 5: back-fill. A tenant whose estimates are twice its actual cost
// still gets its fair share of actual tokens, within 2%, against a tenant
// whose estimates are exact.
func TestBackfillOverestimate(t *testing.T) {
	tenants := []string{"over", "exact"}
	h := newHarness(t, testConfig(4, nil), 2, 5)
	h.keepOrder = false
	h.actual = func(tk *Ticket) int64 {
		if tk.Tenant() == "over" {
			return tk.Cost() / 2
		}
		return tk.Cost()
	}
	cost := func(tenant string) int64 {
		a := 100 + h.rng.Int64N(1900)
		if tenant == "over" {
			return 2 * a
		}
		return a
	}
	runBacklogged(h, tenants, 3, 40000, cost)
	checkShares(t, "served actual tokens", h.served, tenants, []float64{1, 1}, 0.02)
	// Without back-fill the over-estimating tenant would get a third.
	h.drain(2)

	// Under-estimates (actual twice the estimate) are corrected too.
	h = newHarness(t, testConfig(4, nil), 2, 6)
	h.keepOrder = false
	h.actual = func(tk *Ticket) int64 {
		if tk.Tenant() == "over" {
			return tk.Cost() * 2
		}
		return tk.Cost()
	}
	runBacklogged(h, []string{"over", "exact"}, 3, 40000, func(string) int64 { return 100 + h.rng.Int64N(1900) })
	checkShares(t, "served actual tokens (under-estimates)", h.served, tenants, []float64{1, 1}, 0.02)
	h.drain(2)
}

// Test 6: a tenant idle for an hour, while others were served, gets no
// burst on return: it starts level with the others and interleaves.
func TestIdleTenantNoBurst(t *testing.T) {
	t.Run("equal sizes", func(t *testing.T) {
		h := newHarness(t, testConfig(2, nil), 1, 7)
		h.keepOrder = false
		const c = 1000
		cost := func(string) int64 { return c }
		runBacklogged(h, []string{"a", "b", "c"}, 2, 3000, cost)

		// c goes quiet; a and b are served for an hour of virtual time.
		for h.queuedBy["c"] > 0 || h.inflightOf("c") > 0 {
			h.clk.Advance(10 * time.Millisecond)
			h.completeOldest()
			h.backlog([]string{"a", "b"}, 2, cost)
		}
		start := h.clk.Now()
		for h.clk.Now().Sub(start) < time.Hour {
			h.clk.Advance(100 * time.Millisecond)
			h.completeOldest()
			h.backlog([]string{"a", "b"}, 2, cost)
		}
		if h.charged["a"]-h.charged["c"] < 1e7 {
			t.Fatalf("setup: c should be far behind, a %.0f c %.0f", h.charged["a"], h.charged["c"])
		}

		// c returns with 50 requests at once.
		base := map[string]int{}
		for _, n := range []string{"a", "b", "c"} {
			base[n] = int(h.charged[n] / c)
		}
		for i := 0; i < 50; i++ {
			h.enqueue(Request{Tenant: "c", Cost: c})
		}
		var firstC int
		dispatches := 0
		h.onDispatch = func(tk *Ticket) {
			dispatches++
			n := map[string]int{}
			for _, name := range []string{"a", "b", "c"} {
				n[name] = int(h.charged[name]/c) - base[name]
			}
			if tk.Tenant() == "c" && firstC == 0 {
				firstC = dispatches
			}
			if n["c"] > min(n["a"], n["b"])+1 {
				t.Fatalf("dispatch %d after return: c %d requests, a %d, b %d: a burst", dispatches, n["c"], n["a"], n["b"])
			}
		}
		for i := 0; i < 120; i++ {
			h.clk.Advance(100 * time.Millisecond)
			h.completeOldest()
			h.backlog([]string{"a", "b"}, 2, cost)
		}
		if firstC == 0 || firstC > 3 {
			t.Fatalf("c's first request dispatched as number %d after its return, want within 3", firstC)
		}
		if got := int(h.charged["c"]/c) - base["c"]; got < 35 || got > 45 {
			t.Fatalf("c got %d of 120 dispatches after return, want a third", got)
		}
		h.onDispatch = nil
		h.drain(1)
	})

	t.Run("mixed sizes", func(t *testing.T) {
		h := newHarness(t, testConfig(3, nil), 1, 8)
		h.keepOrder = false
		cost := costMix(h)
		const maxCost = 4000
		runBacklogged(h, []string{"chat", "rag", "mixed"}, 2, 3000, cost)
		for h.queuedBy["mixed"] > 0 || h.inflightOf("mixed") > 0 {
			h.clk.Advance(10 * time.Millisecond)
			h.completeRandom()
			h.backlog([]string{"chat", "rag"}, 2, cost)
		}
		start := h.clk.Now()
		for h.clk.Now().Sub(start) < time.Hour {
			h.clk.Advance(100 * time.Millisecond)
			h.completeRandom()
			h.backlog([]string{"chat", "rag"}, 2, cost)
		}
		base := map[string]float64{}
		for k, v := range h.charged {
			base[k] = v
		}
		for i := 0; i < 100; i++ {
			h.enqueue(Request{Tenant: "mixed", Cost: cost("mixed")})
		}
		h.onDispatch = func(tk *Ticket) {
			since := func(n string) float64 { return h.charged[n] - base[n] }
			if since("mixed") > max(since("chat"), since("rag"))+maxCost {
				t.Fatalf("returning tenant got %.0f since return, others %.0f and %.0f: a burst",
					since("mixed"), since("chat"), since("rag"))
			}
		}
		for i := 0; i < 2000; i++ {
			h.clk.Advance(100 * time.Millisecond)
			h.completeRandom()
			h.backlog([]string{"chat", "rag"}, 2, cost)
		}
		h.onDispatch = nil
		h.drain(1)
	})
}

func (h *harness) inflightOf(tenant string) int {
	n := 0
	for _, tk := range h.inflight {
		if tk.Tenant() == tenant {
			n++
		}
	}
	return n
}

// Test 12: the tie rule. With equal start tags the smaller request goes
// first, so a sparse small request starts at the next free slot during a
// flood of large ones.
func TestTieSmallFirst(t *testing.T) {
	t.Run("fresh tenants", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 9)
		h.enqueue(Request{Tenant: "busy", Cost: 10})
		big := h.enqueue(Request{Tenant: "big", Cost: 4000})
		small := h.enqueue(Request{Tenant: "small", Cost: 100})
		h.completeOldest()
		if h.inflight[0] != small {
			t.Fatalf("with equal start tags the large request went first")
		}
		h.completeOldest()
		if h.inflight[0] != big {
			t.Fatalf("large request not dispatched next")
		}
		h.drain(1)
	})

	for _, over := range []bool{false, true} {
		name := "sparse small during flood"
		if over {
			name += ", estimates twice the actual cost"
		}
		t.Run(name, func(t *testing.T) { testSparseDuringFlood(t, over) })
	}
}

// testSparseDuringFlood: with over-estimates, every completion of the flood
// refunds it; the refund must not let it undercut the start tag the sparse
// tenant was just lifted to.
func testSparseDuringFlood(t *testing.T, overestimate bool) {
	h := newHarness(t, testConfig(2, nil), 1, 10)
	if overestimate {
		h.actual = func(tk *Ticket) int64 { return tk.Cost() / 2 }
	}
	flood := func(string) int64 { return 4000 }
	h.backlog([]string{"flood"}, 5, flood)
	for arrival := 0; arrival < 200; arrival++ {
		for i := 0; i < 7; i++ {
			h.completeRandom()
			h.backlog([]string{"flood"}, 5, flood)
		}
		tk := h.enqueue(Request{Tenant: "chat", Cost: 100})
		if h.dispatched[tk] {
			t.Fatalf("capacity should be full")
		}
		h.completeRandom()
		if !h.dispatched[tk] {
			t.Fatalf("arrival %d: small request not dispatched at the next free slot", arrival)
		}
		h.backlog([]string{"flood"}, 5, flood)
	}
	h.drain(1)
}

// Test 14: idle tenants are forgotten, so memory is bounded by the active
// tenants, and forgetting changes nothing: the same run with and without
// pruning dispatches the same requests in the same order.
func TestPruneIdleTenants(t *testing.T) {
	run := func(prune bool) (order []string, maxTenants int) {
		h := newHarness(t, testConfig(4, nil), 1, 11)
		h.keepOrder = false
		heavy := []string{"heavy-1", "heavy-2"}
		cost := func(string) int64 { return 500 + h.rng.Int64N(3000) }
		h.onDispatch = func(tk *Ticket) {
			order = append(order, fmt.Sprintf("%s/%d", tk.Tenant(), tk.Cost()))
		}
		h.backlog(heavy, 3, cost)
		k := 0
		for i := 0; i < 12000; i++ {
			h.clk.Advance(time.Second)
			if prune {
				h.q.Tick()
			}
			if i%3 == 0 {
				// 900 sparse tenants, each returning every 2700 steps
				// with a request of a size unique within the window.
				k++
				h.enqueue(Request{Tenant: fmt.Sprint("sparse-", k%900), Cost: 10 + int64(k%4999)})
			}
			h.completeRandom()
			h.backlog(heavy, 3, cost)
			if i%50 == 0 {
				if n := len(h.q.Stats(true).Tenants); n > maxTenants {
					maxTenants = n
				}
			}
		}
		h.onDispatch = nil
		h.drain(1)
		return order, maxTenants
	}
	withPrune, bounded := run(true)
	without, unbounded := run(false)
	t.Logf("tenants remembered: at most %d with pruning, %d without", bounded, unbounded)
	if bounded > 100 {
		t.Errorf("pruning kept up to %d tenants, want at most 100", bounded)
	}
	if unbounded < 900 {
		t.Errorf("setup: without pruning expected every sparse tenant remembered, got %d", unbounded)
	}
	if len(withPrune) != len(without) {
		t.Fatalf("pruning changed the number of dispatches: %d vs %d", len(withPrune), len(without))
	}
	for i := range withPrune {
		if withPrune[i] != without[i] {
			t.Fatalf("pruning changed dispatch %d: %s vs %s", i, withPrune[i], without[i])
		}
	}
}
