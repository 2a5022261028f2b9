package fairqueue

import (
	"testing"
	"time"
)

// fallbackConfig: a primary account of 60 requests per minute (one a
// second, no burst to speak of) and a fallback for vip only, 2 slots per
// healthy fallback upstream.
func fallbackConfig() Config {
	cfg := upstreamConfig(0, time.Millisecond, 0)
	cfg.UpstreamQuota = &UpstreamQuota{RPM: 60, Burst: time.Millisecond}
	cfg.Fallback = &FallbackConfig{Tenants: []string{"vip"}, MaxInflight: 2}
	return cfg
}

// When the provider declares the primary account exhausted, the listed
// tenant's requests go to the fallback, up to its slots; the others wait
// for the primary.
func TestFallbackWhenPrimaryExhausted(t *testing.T) {
	h := newHarness(t, fallbackConfig(), 1, 1)
	h.q.SetFallbackHealthy(1)
	first := h.enqueue(Request{Tenant: "a", Cost: 10})
	if first.Dispatched().IsZero() || first.Fallback() {
		t.Fatal("a's first request did not go to the primary")
	}
	first.AccountExhausted(t0.Add(10 * time.Second))
	a := h.enqueue(Request{Tenant: "a", Cost: 10})
	v := []*Ticket{h.enqueue(Request{Tenant: "vip", Cost: 10}), h.enqueue(Request{Tenant: "vip", Cost: 10}),
		h.enqueue(Request{Tenant: "vip", Cost: 10})}
	if !v[0].Fallback() || !v[1].Fallback() || !v[2].Dispatched().IsZero() {
		t.Fatalf("vip: fallback %v %v, third dispatched %v; want the first two on the fallback's 2 slots",
			v[0].Fallback(), v[1].Fallback(), v[2].Dispatched())
	}
	if !a.Dispatched().IsZero() {
		t.Fatal("a tenant the fallback does not list went while the primary was exhausted")
	}
	h.complete(1) // a fallback slot frees: vip's third goes there
	if !v[2].Fallback() {
		t.Fatal("vip's third request did not take the freed fallback slot")
	}
	h.clk.Set(t0.Add(10 * time.Second))
	h.q.Tick()
	if a.Dispatched().IsZero() || a.Fallback() {
		t.Fatal("a did not go to the primary once it was back")
	}
}

// A listed tenant waits for the primary while it can serve (here its one
// slot is busy), and goes to the fallback once half its budget is gone
// (its primary ETA misses).
func TestFallbackAtHalfBudget(t *testing.T) {
	cfg := fallbackConfig()
	cfg.UpstreamQuota, cfg.MaxInflight = nil, 1
	h := newHarness(t, cfg, 1, 1)
	h.q.SetFallbackHealthy(1)
	h.enqueue(Request{Tenant: "vip", Cost: 10}) // takes the primary's one slot
	v := h.enqueue(Request{Tenant: "vip", Cost: 10, Deadline: t0.Add(4 * time.Second)})
	h.clk.Set(t0.Add(500 * time.Millisecond))
	h.q.Tick()
	if !v.Dispatched().IsZero() {
		t.Fatal("went to the fallback with most of its budget left and the primary serving")
	}
	h.clk.Set(t0.Add(2 * time.Second))
	h.q.Tick()
	if !v.Fallback() {
		t.Fatalf("not on the fallback at half its budget (dispatched %v)", v.Dispatched())
	}
}
