package fairqueue

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// LightMode reads what the queue stored when its state changed, without
// the lock: it must follow the ladder through engagement, recovery and
// reloads as a locked read would; Idle follows the backlog alongside.
func TestLightModeAndIdleFollowTheQueue(t *testing.T) {
	trim := degrade.Action{Kind: degrade.ActionLightMode, Class: "interactive", MaxInputTokens: 512, MaxTokens: 64}
	cfg := testConfig(1, nil)
	cfg.MaxQueue = 4
	cfg.DegradeHold = time.Millisecond
	cfg.Degrade = []degrade.Step{{Name: "L1", Trigger: 0.5, Recover: 0.25, Action: trim}}
	h := newHarness(t, cfg, 1, 1)
	light := func(want bool) {
		t.Helper()
		a, ok := h.q.LightMode("interactive")
		if ok != want || ok && a != trim {
			t.Fatalf("LightMode(interactive) = %+v, %v; want %v", a, ok, want)
		}
		if _, ok := h.q.LightMode("batch"); ok {
			t.Fatal("LightMode(batch) engaged: no step trims batch")
		}
	}
	idle := func(want bool) {
		t.Helper()
		if got := h.q.Idle(); got != want {
			t.Fatalf("Idle() = %v, want %v", got, want)
		}
	}
	idle(true)
	light(false)
	h.enqueue(Request{Tenant: "a", Cost: 10}) // takes the one slot
	idle(false)
	for i := range 3 {
		h.enqueue(Request{Tenant: fmt.Sprint("b", i), Cost: 10})
	}
	h.clk.Advance(time.Second)
	h.q.Tick() // water 0.75: L1 engages
	light(true)
	h.drain(1) // recovers at the next tick
	idle(true)
	h.clk.Advance(time.Second)
	h.q.Tick()
	light(false)

	// Engaged again, then reloaded without the ladder: nothing trims.
	h.enqueue(Request{Tenant: "a", Cost: 10})
	for i := range 3 {
		h.enqueue(Request{Tenant: fmt.Sprint("b", i), Cost: 10})
	}
	h.clk.Advance(time.Second)
	h.q.Tick()
	light(true)
	cfg.Degrade = nil
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	light(false)
	// No healthy upstream: nothing would start at once, queued or not.
	h.drain(1)
	h.q.SetHealthy(0)
	idle(false)
	h.q.SetHealthy(1)
	idle(true)

	// A reload that changes the capacity: one request in flight fills a
	// capacity of 1 and leaves one of 2 with a slot free.
	cfg.MaxInflight = 2
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	h.enqueue(Request{Tenant: "a", Cost: 10})
	idle(true)
	cfg.MaxInflight = 1
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	idle(false)
	cfg.MaxInflight = 2
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	idle(true)
}
