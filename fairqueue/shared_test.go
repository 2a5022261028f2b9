package fairqueue

import (
	"fmt"
	"math"
	"strconv"
	"testing"
)

// twoGateways runs tenant a through gateways g1 (2 slots, a alone) and
// g2 (4 slots, a and b), both flooded, equal weights and costs, for
// rounds rounds: each round every request in flight completes and the
// queues refill; with share set, the gateways exchange what they served
// after every round (the sync interval is one service time). It returns
// the requests each tenant was served over both gateways after a warm-up.
func twoGateways(t *testing.T, rounds int, share bool) map[string]float64 {
	t.Helper()
	cfg := testConfig(1, map[string]float64{"a": 1, "b": 1})
	g1 := newHarness(t, cfg, 2, 1)
	g2 := newHarness(t, cfg, 4, 2)
	if share {
		g1.q.TakeServed(nil)
		g2.q.TakeServed(nil)
	}
	cost := func(string) int64 { return 100 }
	got := map[string]float64{}
	var buf []Served
	for r := range rounds {
		g1.backlog([]string{"a"}, 20, cost)
		g2.backlog([]string{"a", "b"}, 20, cost)
		for _, h := range []*harness{g1, g2} {
			for range len(h.inflight) {
				tk := h.completeOldest()
				if r >= rounds/5 {
					got[tk.Tenant()]++
				}
			}
		}
		if share {
			buf = g1.q.TakeServed(buf[:0])
			g2.q.ChargeRemote(buf)
			buf = g2.q.TakeServed(buf[:0])
			g1.q.ChargeRemote(buf)
		}
		g1.checkConservation()
		g2.checkConservation()
	}
	g1.drain(2)
	g2.drain(4)
	return got
}

// TestSharedVirtualTime: a tenant flooding two gateways and one flooding
// only the second, equal weights, 6 slots in all. Alone, each gateway's
// WFQ gives a its share of each gateway: 2 + 2 of 6 slots against b's 2,
// so 2:1. Sharing what each served, the second gateway sees a ahead by
// what the first served it and gives b the difference: 3:3. On the
// virtual clock both are exact over the 400 rounds counted: 1600:800 and
// 1200:1200.
func TestSharedVirtualTime(t *testing.T) {
	alone := twoGateways(t, 500, false)
	if alone["a"] != 2*alone["b"] {
		t.Errorf("without sharing a:b = %.0f:%.0f, want exactly 2:1 (a's weight counts on each gateway)", alone["a"], alone["b"])
	}
	shared := twoGateways(t, 500, true)
	t.Logf("served a:b, 6 slots: alone %.0f:%.0f; sharing %.0f:%.0f", alone["a"], alone["b"], shared["a"], shared["b"])
	if shared["a"] != shared["b"] || shared["a"] == 0 {
		t.Errorf("sharing, a:b = %.0f:%.0f, want exactly 1:1", shared["a"], shared["b"])
	}
}

// TestChargeRemoteIdleTenant: what a tenant was served elsewhere while it
// had nothing queued here is no debt here: its next request takes its
// turn at once, as a tenant back from idle does. Charged while it waits
// here, it goes behind by that cost over its weight.
func TestChargeRemoteIdleTenant(t *testing.T) {
	h := newHarness(t, testConfig(1, map[string]float64{"a": 1, "b": 1}), 1, 1)
	h.q.TakeServed(nil)
	cost := func(string) int64 { return 100 }
	h.backlog([]string{"b"}, 5, cost)
	if n := h.q.ChargeRemote([]Served{{Tenant: "a", Cost: 1e6}, {Tenant: "nobody", Cost: 1}}); n != 0 {
		t.Fatalf("ChargeRemote charged %d tenants with nothing queued, want 0", n)
	}
	h.enqueue(Request{Tenant: "a", Cost: 100})
	h.completeOldest() // b's first, dispatched when it came
	if got := h.inflight[0].Tenant(); got != "a" {
		t.Fatalf("after b's first request, %s was dispatched, want a (back from idle, no debt)", got)
	}
	// Now charged while queued here: b goes first for that cost.
	h.enqueue(Request{Tenant: "a", Cost: 100})
	if n := h.q.ChargeRemote([]Served{{Tenant: "a", Cost: 300}}); n != 1 {
		t.Fatalf("ChargeRemote charged %d tenants, want a", n)
	}
	var order []string
	for len(h.inflight) > 0 {
		h.completeOldest()
		if len(h.inflight) > 0 {
			order = append(order, h.inflight[0].Tenant())
		}
	}
	// b's six requests have start tags 0, 100, ..., 500 (the first was
	// dispatched on arrival); a's first took its turn at 100, so its
	// second would start at 200, between b's, but for the 300 charged
	// elsewhere: at 500, after every b of a tag below.
	want := []string{"b", "b", "b", "b", "a", "b"}
	if len(order) != len(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
	h.drain(1)
}

// TestTakeServed: estimates at dispatch, corrections at completion, net
// per tenant, once; nothing before the first call.
func TestTakeServed(t *testing.T) {
	h := newHarness(t, testConfig(2, map[string]float64{"a": 1}), 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	if got := h.q.TakeServed(nil); len(got) != 0 {
		t.Fatalf("first TakeServed = %v, want nothing (bookkeeping starts with it)", got)
	}
	h.actual = func(*Ticket) int64 { return 40 }
	h.completeOldest() // -60 on the 100 charged before the first call
	h.enqueue(Request{Tenant: "a", Cost: 100})
	h.enqueue(Request{Tenant: "x", Cost: 50})
	got := h.q.TakeServed(nil)
	// x is undeclared: it goes as the undeclared tenants' group, unnamed.
	if len(got) != 2 || got[0] != (Served{Tenant: "a", Cost: 40}) || got[1] != (Served{Group: true, Cost: 50}) {
		t.Fatalf("TakeServed = %v, want a 40 (-60+100) and the undeclared group 50", got)
	}
	if got := h.q.TakeServed(nil); len(got) != 0 {
		t.Fatalf("second TakeServed = %v, want nothing", got)
	}
	h.drain(1)
}

// BenchmarkShareSync: one sync interval at 10k backlogged tenants: 64
// completions, re-enqueues and dispatches, then, with sharing on, the
// sync's work under the queue lock (TakeServed of the 64 tenants charged,
// ChargeRemote of 64 tenants the other gateways served). The difference
// between on and off is what sharing costs per interval.
func BenchmarkShareSync(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("share=%v", on), func(b *testing.B) {
			h := newHarness(b, testConfig(64, nil), 1, 1)
			h.keepOrder = false
			if on {
				h.q.TakeServed(nil)
			}
			names := make([]string, 10000)
			for i := range names {
				names[i] = "t" + strconv.Itoa(i)
			}
			h.backlog(names, 2, func(string) int64 { return 100 })
			remote := make([]Served, 64)
			var buf []Served
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				for range 64 {
					tk := h.completeOldest()
					h.enqueue(Request{Tenant: tk.Tenant(), Cost: 100})
				}
				if !on {
					continue
				}
				for j := range remote {
					remote[j] = Served{Tenant: names[(i*64+j*157)%len(names)], Cost: 100}
				}
				i++
				buf = h.q.TakeServed(buf[:0])
				h.q.ChargeRemote(remote)
			}
		})
	}
}

// TestStopServed: sharing turned off drops what was not taken, and turned
// on again starts afresh.
func TestStopServed(t *testing.T) {
	h := newHarness(t, testConfig(2, nil), 1, 1)
	h.q.TakeServed(nil)
	h.enqueue(Request{Tenant: "a", Cost: 100})
	h.q.StopServed()
	h.enqueue(Request{Tenant: "b", Cost: 100})
	if got := h.q.TakeServed(nil); len(got) != 0 {
		t.Fatalf("TakeServed after StopServed = %v, want nothing (restarted)", got)
	}
	h.completeOldest()
	h.enqueue(Request{Tenant: "c", Cost: 100})
	if got := h.q.TakeServed(nil); len(got) != 1 || got[0] != (Served{Group: true, Cost: 100}) {
		t.Fatalf("TakeServed = %v, want c's 100 only (as the undeclared group's)", got)
	}
	h.drain(1)
}

// Review: a remote refund gives back at most what was charged here
// since the tenant came back from idle; an undeclared tenant's group is
// charged too; a name listed twice (forgotten and seen again) is one
// entry.
func TestChargeRemoteRefundsAndGroup(t *testing.T) {
	h := newHarness(t, testConfig(1, map[string]float64{"a": 1}), 1, 1)
	h.enqueue(Request{Tenant: "b", Cost: 100}) // holds the slot
	h.enqueue(Request{Tenant: "a", Cost: 100})
	vt := func(name string) float64 {
		for _, ts := range h.q.Stats(true).Tenants {
			if ts.Name == name {
				return ts.VirtualTime
			}
		}
		return math.NaN()
	}
	a0 := vt("a")
	// A refund of a charge never applied here: no credit.
	h.q.ChargeRemote([]Served{{Tenant: "a", Cost: -500}})
	if got := vt("a"); got != a0 {
		t.Fatalf("a refund of nothing charged moved a's virtual time %v -> %v", a0, got)
	}
	// Charged 300, refunded 500: back where it was, not below.
	h.q.ChargeRemote([]Served{{Tenant: "a", Cost: 300}})
	if got := vt("a"); got != a0+300 {
		t.Fatalf("a charged 300: virtual time %v, want %v", got, a0+300)
	}
	h.q.ChargeRemote([]Served{{Tenant: "a", Cost: -500}, {Tenant: "a", Cost: math.Inf(1)}, {Tenant: "a", Cost: math.NaN()}})
	if got := vt("a"); got != a0 {
		t.Fatalf("a refunded: virtual time %v, want %v (credit capped at the 300 charged)", got, a0)
	}
	// An undeclared tenant: its group moves as its own virtual time does.
	h.enqueue(Request{Tenant: "u", Cost: 100})
	groupVT := func() float64 {
		h.q.mu.Lock()
		defer h.q.mu.Unlock()
		return h.q.group.vt - h.q.group.credit
	}
	g0, u0 := groupVT(), vt("u")
	h.q.ChargeRemote([]Served{{Tenant: "u", Cost: 200}})
	if g, u := groupVT(), vt("u"); g != g0+200 || u != u0+200 {
		t.Fatalf("u charged 200: group %v -> %v, u %v -> %v; want both +200", g0, g, u0, u)
	}
	// The undeclared tenants' service elsewhere, as their group (how
	// gateways send it): the group moves, no member does.
	g0, u0 = groupVT(), vt("u")
	if n := h.q.ChargeRemote([]Served{{Group: true, Cost: 300}}); n != 1 {
		t.Fatalf("the group's entry applied %d times, want once", n)
	}
	if g, u := groupVT(), vt("u"); g != g0+300 || u != u0 {
		t.Fatalf("the group charged 300: group %v -> %v, u %v -> %v; want the group +300, u unmoved", g0, g, u0, u)
	}
	h.drain(1)

	// Two *tenant of one name on the dirty list: one entry, summed.
	q := h.q
	q.TakeServed(nil)
	q.mu.Lock()
	x1 := &tenant{name: "x", shareDelta: 5, shareListed: true}
	x2 := &tenant{name: "x", shareDelta: 7, shareListed: true}
	q.shareDirty = append(q.shareDirty, x1, x2)
	q.mu.Unlock()
	if got := q.TakeServed(nil); len(got) != 1 || got[0] != (Served{Tenant: "x", Cost: 12}) {
		t.Fatalf("TakeServed = %v, want one entry x 12", got)
	}
}
