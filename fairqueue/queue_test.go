package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// wantRejection asserts err is a *Rejection with the given reason.
func wantRejection(t *testing.T, err error, reason Reason) *Rejection {
	t.Helper()
	var rej *Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("got %v (%T), want a *Rejection %v", err, err, reason)
	}
	if rej.Reason != reason {
		t.Fatalf("got reason %v (%v), want %v", rej.Reason, rej, reason)
	}
	if rej.Error() == "" {
		t.Fatalf("empty error text")
	}
	return rej
}

// Test 4: work conservation after every operation, under a random mix of
// arrivals, completions, cancellations, promotions, pauses and capacity
// changes, with and without a token cap.
func TestWorkConservation(t *testing.T) {
	for _, tokenCap := range []int64{0, 3000} {
		t.Run(fmt.Sprint("max_inflight_tokens=", tokenCap), func(t *testing.T) {
			cfg := testConfig(3, map[string]float64{"a": 2, "b": 1})
			cfg.MaxInflightTokens = tokenCap
			cfg.Tenants["i"] = TenantConfig{Weight: 1, Class: "interactive"}
			h := newHarness(t, cfg, 2, 40)
			tenants := []string{"a", "b", "c", "i"}
			var queued []*Ticket
			for op := 0; op < 20000; op++ {
				h.clk.Advance(time.Millisecond)
				switch r := h.rng.IntN(100); {
				case r < 45:
					cost := 1 + h.rng.Int64N(2000)
					if h.rng.IntN(50) == 0 {
						// The largest request admitted: one upstream's whole
						// token capacity, or a huge one without a cap.
						cost = 10000
						if tokenCap > 0 {
							cost = tokenCap
						}
					}
					tk := h.enqueue(Request{Tenant: tenants[h.rng.IntN(len(tenants))], Cost: cost})
					queued = append(queued, tk)
				case r < 85:
					if len(h.inflight) > 0 {
						h.completeRandom()
					}
				case r < 92:
					if len(queued) > 0 {
						if tk := queued[h.rng.IntN(len(queued))]; !h.dispatched[tk] {
							tk.Release(UnknownCost) // cancel (no-op if it already ended)
						}
					}
				case r < 95:
					if len(queued) > 0 {
						h.q.Promote(queued[h.rng.IntN(len(queued))])
					}
				case r < 98:
					h.q.SetPaused("batch", h.rng.IntN(2) == 0)
				default:
					h.q.SetHealthy(1 + h.rng.IntN(3))
				}
				h.checkConservation()
				h.checkAccounting()
				if len(queued) > 1000 {
					queued = queued[500:]
				}
			}
			h.q.SetPaused("batch", false)
			h.drain(2)
		})
	}
}

// Test 4b: a request larger than one upstream's token capacity, or than the
// whole queue's, is refused at once (never parked), naming the limit; one
// that a reload made oversized while it was queued waits while something is
// in flight and then runs alone, so nothing deadlocks.
func TestOversizedRefusedOrRunsAlone(t *testing.T) {
	cfg := testConfig(8, nil)
	cfg.MaxInflightTokens = 1000
	cfg.MaxQueueTokens = 4000
	h := newHarness(t, cfg, 2, 41) // 2000 tokens in flight over two upstreams
	h.enqueue(Request{Tenant: "b", Cost: 400})
	for _, c := range []struct {
		cost  int64
		limit string
	}{{1001, "max_inflight_tokens"}, {1 << 40, "max_inflight_tokens"}} {
		_, err := h.tryEnqueue(Request{Tenant: "a", Cost: c.cost})
		rej := wantRejection(t, err, ReasonTooLarge)
		if !strings.Contains(rej.Detail, c.limit) || rej.RetryAfter != 0 {
			t.Fatalf("cost %d: %+v, want the limit %s named and no Retry-After", c.cost, rej, c.limit)
		}
	}
	if s := h.q.Stats(true); s.Queued != 0 || len(s.Tenants) != 1 {
		t.Fatalf("a refused request left state: %+v", s)
	}
	cfg.MaxInflightTokens = 0
	cfg.MaxQueueTokens = 500
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	_, err := h.tryEnqueue(Request{Tenant: "a", Cost: 501})
	if rej := wantRejection(t, err, ReasonTooLarge); !strings.Contains(rej.Detail, "max_queue_tokens") {
		t.Fatalf("%+v does not name max_queue_tokens", rej)
	}
	h.completeOldest()

	// Made oversized by a reload: queued behind in-flight work at a cap of
	// 1000 per upstream, then the cap drops to 100 (200 for the pool).
	cfg = testConfig(8, nil)
	cfg.MaxInflightTokens = 1000
	h = newHarness(t, cfg, 1, 42)
	h.enqueue(Request{Tenant: "b", Cost: 400})
	h.enqueue(Request{Tenant: "b", Cost: 400})
	huge := h.enqueue(Request{Tenant: "a", Cost: 900})
	after := h.enqueue(Request{Tenant: "a", Cost: 10})
	cfg.MaxInflightTokens = 100
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if h.dispatched[huge] || h.dispatched[after] {
		t.Fatalf("oversized request dispatched beside in-flight work, or overtaken")
	}
	h.checkConservation()
	h.completeOldest()
	h.completeOldest()
	if !h.dispatched[huge] || len(h.inflight) != 1 {
		t.Fatalf("oversized request not running alone once the slots drained (in flight %d)", len(h.inflight))
	}
	h.completeOldest()
	if !h.dispatched[after] {
		t.Fatalf("request behind the oversized one not dispatched")
	}
}

// Test 4c: cancelling or expiring the head that held the token gate closed
// lets the next request start at once.
func TestTokenGateReopensOnCancel(t *testing.T) {
	cfg := testConfig(8, nil)
	cfg.MaxInflightTokens = 1000
	h := newHarness(t, cfg, 1, 42)
	h.enqueue(Request{Tenant: "a", Cost: 600})
	// The small request is behind the blocker in order: same tenant, FIFO.
	blocker := h.enqueue(Request{Tenant: "b", Cost: 900, Deadline: t0.Add(time.Minute)})
	small := h.enqueue(Request{Tenant: "b", Cost: 100})
	if h.dispatched[blocker] || h.dispatched[small] {
		t.Fatalf("setup: expected the 900-token head to wait")
	}
	blocker.Release(UnknownCost)
	h.checkConservation()
	if !h.dispatched[small] {
		t.Fatalf("cancelling the blocking head left a fitting request queued")
	}

	blocker = h.enqueue(Request{Tenant: "d", Cost: 900, Deadline: h.clk.Now().Add(time.Second)})
	small = h.enqueue(Request{Tenant: "d", Cost: 100})
	if h.dispatched[blocker] || h.dispatched[small] {
		t.Fatalf("setup: expected the 900-token head to wait")
	}
	h.clk.Advance(time.Second)
	h.q.Tick()
	if h.ended[blocker] != EventExpired {
		t.Fatalf("blocking head not expired")
	}
	h.checkConservation()
	if !h.dispatched[small] {
		t.Fatalf("expiring the blocking head left a fitting request queued")
	}
	h.drain(1)
}

// Test 7: cancellation.
func TestCancellation(t *testing.T) {
	t.Run("context cancelled while waiting", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 70)
		h.enqueue(Request{Tenant: "a", Cost: 100}) // takes the only slot
		tk := h.enqueue(Request{Tenant: "c", Cost: 100})
		vtBefore := tenantStats(h.q, "c").VirtualTime

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tk.Wait(ctx) }()
		cancel()
		err := <-done
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait returned %v, want context.Canceled", err)
		}
		// It left the queue at once.
		if s := h.q.Stats(false); s.Queued != 0 || s.QueuedCost != 0 {
			t.Fatalf("cancelled ticket still queued: %+v", s)
		}
		if h.ended[tk] != EventCancelled {
			t.Fatalf("ticket ended as %v, want cancelled", h.ended[tk])
		}
		wantRejection(t, tk.Err(), ReasonCancelled)
		// Never dispatched, even when a slot frees.
		h.completeOldest()
		if h.dispatched[tk] || len(h.inflight) != 0 {
			t.Fatalf("cancelled ticket dispatched")
		}
		if vt := tenantStats(h.q, "c").VirtualTime; vt != vtBefore {
			t.Fatalf("cancelled ticket charged its tenant: virtual time %v -> %v", vtBefore, vt)
		}
		// Waiting again reports the cancellation, without blocking.
		wantRejection(t, tk.Wait(context.Background()), ReasonCancelled)
		h.drain(1)
	})

	t.Run("context already done", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 71)
		h.enqueue(Request{Tenant: "a", Cost: 100})
		tk := h.enqueue(Request{Tenant: "b", Cost: 100})
		ctx, cancel := context.WithTimeout(context.Background(), 0)
		defer cancel()
		if err := tk.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait returned %v, want context.DeadlineExceeded", err)
		}
		if h.ended[tk] != EventCancelled {
			t.Fatalf("ticket not cancelled")
		}
		// A dispatched ticket's Wait returns nil even with a dead context.
		running := h.inflight[0]
		if err := running.Wait(ctx); err != nil {
			t.Fatalf("Wait on an in-flight ticket: %v", err)
		}
		h.drain(1)
	})

	t.Run("Wait returns when dispatched", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 72)
		h.enqueue(Request{Tenant: "a", Cost: 100})
		tk := h.enqueue(Request{Tenant: "b", Cost: 100})
		done := make(chan error, 1)
		go func() { done <- tk.Wait(context.Background()) }()
		h.completeOldest()
		if err := <-done; err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if tk.Dispatched().IsZero() || tk.Err() != nil {
			t.Fatalf("dispatched ticket: time %v err %v", tk.Dispatched(), tk.Err())
		}
		h.drain(1)
	})

	t.Run("Release on a queued ticket cancels it", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 73)
		h.enqueue(Request{Tenant: "a", Cost: 100})
		tk := h.enqueue(Request{Tenant: "b", Cost: 100})
		boosted := h.enqueue(Request{Tenant: "c", Cost: 100})
		h.q.Promote(boosted)
		vtB := tenantStats(h.q, "b").VirtualTime
		tk.Release(500)
		boosted.Release(500)
		if h.ended[tk] != EventCancelled || h.ended[boosted] != EventCancelled {
			t.Fatalf("Release on queued tickets: %v, %v", h.ended[tk], h.ended[boosted])
		}
		wantRejection(t, tk.Wait(context.Background()), ReasonCancelled)
		h.completeOldest()
		if len(h.inflight) != 0 {
			t.Fatalf("cancelled ticket dispatched")
		}
		if b := tenantStats(h.q, "b"); b.Served != 0 || b.VirtualTime != vtB {
			t.Fatalf("cancelled tenant charged: %+v (virtual time was %v)", b, vtB)
		}
		h.drain(1)
	})

	t.Run("Release twice is a no-op", func(t *testing.T) {
		h := newHarness(t, testConfig(2, nil), 1, 74)
		a := h.enqueue(Request{Tenant: "a", Cost: 100})
		h.enqueue(Request{Tenant: "b", Cost: 100})
		waiting := h.enqueue(Request{Tenant: "c", Cost: 100})
		h.inflight = h.inflight[1:]
		a.Release(100)
		a.Release(100)
		a.Release(UnknownCost)
		if s := h.q.Stats(false); s.Inflight != 2 {
			t.Fatalf("double release freed two slots: %+v", s)
		}
		if !h.dispatched[waiting] {
			t.Fatalf("freed slot not reused")
		}
		if got := tenantStats(h.q, "a").Served; got != 100 {
			t.Fatalf("served %v after repeated release, want 100", got)
		}
		h.drain(1)
	})

	t.Run("Release in a defer frees the slot on panic", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 75)
		h.enqueue(Request{Tenant: "a", Cost: 100})
		tk := h.enqueue(Request{Tenant: "b", Cost: 100})
		next := h.enqueue(Request{Tenant: "c", Cost: 100})
		h.completeOldest()
		if !h.dispatched[tk] {
			t.Fatalf("setup")
		}
		h.inflight = h.inflight[:0]
		func() {
			defer func() { _ = recover() }()
			defer tk.Release(UnknownCost)
			if err := tk.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			panic("handler blew up mid-response")
		}()
		if !h.dispatched[next] || h.ended[tk] != EventReleased {
			t.Fatalf("slot not freed by the deferred Release")
		}
		if got := tenantStats(h.q, "b").Served; got != 100 {
			t.Fatalf("UnknownCost changed the charge: %v", got)
		}
		h.drain(1)
	})
}

func tenantStats(q *Queue, name string) TenantStats {
	for _, ts := range q.Stats(true).Tenants {
		if ts.Name == name {
			return ts
		}
	}
	return TenantStats{Name: name}
}

// Test 8: admission caps, each with its reason.
func TestAdmissionCaps(t *testing.T) {
	t.Run("tenant queue cap", func(t *testing.T) {
		cfg := testConfig(1, nil)
		cfg.Tenants["capped"] = TenantConfig{Weight: 1, Class: "batch", MaxQueue: 2}
		h := newHarness(t, cfg, 1, 80)
		h.enqueue(Request{Tenant: "capped", Cost: 1}) // dispatched, not queued
		h.enqueue(Request{Tenant: "capped", Cost: 1})
		h.enqueue(Request{Tenant: "capped", Cost: 1})
		_, err := h.tryEnqueue(Request{Tenant: "capped", Cost: 1})
		rej := wantRejection(t, err, ReasonTenantQueueFull)
		if rej.RetryAfter <= 0 {
			t.Fatalf("no Retry-After hint: %+v", rej)
		}
		// Other tenants are not affected.
		h.enqueue(Request{Tenant: "other", Cost: 1})
		h.drain(1)
	})

	t.Run("global queue cap", func(t *testing.T) {
		cfg := testConfig(1, nil)
		cfg.MaxQueue = 3
		h := newHarness(t, cfg, 1, 81)
		for i := 0; i < 4; i++ { // one runs, three queue
			h.enqueue(Request{Tenant: fmt.Sprint("t", i), Cost: 1})
		}
		_, err := h.tryEnqueue(Request{Tenant: "new", Cost: 1})
		wantRejection(t, err, ReasonQueueFull)
		if w := h.q.Water(); w != 1 {
			t.Fatalf("water %v at a full queue, want 1", w)
		}
		h.drain(1)
	})

	t.Run("global token cap", func(t *testing.T) {
		cfg := testConfig(1, nil)
		cfg.MaxQueueTokens = 1000
		h := newHarness(t, cfg, 1, 82)
		h.enqueue(Request{Tenant: "a", Cost: 1000}) // runs
		h.enqueue(Request{Tenant: "b", Cost: 600})
		_, err := h.tryEnqueue(Request{Tenant: "c", Cost: 401})
		wantRejection(t, err, ReasonQueueFull)
		h.enqueue(Request{Tenant: "c", Cost: 400}) // exactly at the cap
		// The cap counts every token; the water level counts each request
		// at most 1/20 of the cap (Queue.Water): two requests, 0.1.
		if s := h.q.Stats(false); s.QueuedCost != 1000 || s.Water != 0.1 {
			t.Fatalf("queued cost %d water %v", s.QueuedCost, s.Water)
		}
		h.completeOldest()
		h.completeOldest()
		h.completeOldest()
		// Even an empty queue refuses a request larger than the cap.
		_, err = h.tryEnqueue(Request{Tenant: "a", Cost: 1001})
		wantRejection(t, err, ReasonTooLarge)
		h.drain(1)
	})

	t.Run("token caps count tokens with cost_unit requests", func(t *testing.T) {
		cfg := testConfig(10, nil)
		cfg.CostUnit = CostRequests
		cfg.MaxInflightTokens = 1000
		cfg.MaxQueueTokens = 1000
		h := newHarness(t, cfg, 1, 83)
		h.enqueue(Request{Tenant: "a", Cost: 800})
		second := h.enqueue(Request{Tenant: "b", Cost: 800})
		if h.dispatched[second] {
			t.Fatalf("token cap ignored with cost_unit requests")
		}
		if _, err := h.tryEnqueue(Request{Tenant: "c", Cost: 800}); err == nil {
			t.Fatalf("queue token cap ignored with cost_unit requests")
		} else {
			wantRejection(t, err, ReasonQueueFull)
		}
		if second.Cost() != 1 || second.Tokens() != 800 {
			t.Fatalf("cost %d tokens %d, want 1 and 800", second.Cost(), second.Tokens())
		}
		h.drain(1)
	})

	t.Run("no capacity", func(t *testing.T) {
		h := newHarness(t, testConfig(4, nil), 0, 84)
		_, err := h.tryEnqueue(Request{Tenant: "a", Cost: 1})
		wantRejection(t, err, ReasonNoCapacity)
		h.q.SetHealthy(1)
		h.enqueue(Request{Tenant: "a", Cost: 1})
		h.q.SetHealthy(0)
		_, err = h.tryEnqueue(Request{Tenant: "a", Cost: 1})
		wantRejection(t, err, ReasonNoCapacity)
		h.drain(1)
	})

	t.Run("invalid config", func(t *testing.T) {
		bad := []Config{
			{MaxInflight: 0},
			func() Config { c := testConfig(1, nil); c.Default.Weight = 0; return c }(),
			func() Config { c := testConfig(1, nil); c.Default.Class = "nope"; return c }(),
			func() Config { c := testConfig(1, nil); c.MaxQueueTokens = -1; return c }(),
			func() Config { c := testConfig(1, nil); c.Classes = append(c.Classes, c.Classes[0]); return c }(),
		}
		for i, cfg := range bad {
			if _, err := New(cfg, nil); err == nil {
				t.Errorf("config %d accepted", i)
			}
		}
	})
}

// Test 9: capacity changes while queued and in flight lose nothing,
// dispatch nothing twice and never preempt; Reconfigure under load ends
// every ticket exactly once.
func TestCapacityChanges(t *testing.T) {
	h := newHarness(t, testConfig(2, nil), 2, 90)
	for i := 0; i < 4; i++ {
		h.enqueue(Request{Tenant: fmt.Sprint("t", i%2), Cost: 100})
	}
	queued := []*Ticket{}
	for i := 0; i < 6; i++ {
		queued = append(queued, h.enqueue(Request{Tenant: fmt.Sprint("t", i%3), Cost: 100}))
	}
	running := append([]*Ticket(nil), h.inflight...)

	// All upstreams down: nothing is preempted, nothing dropped, nothing
	// dispatched.
	h.q.SetHealthy(0)
	if s := h.q.Stats(false); s.Inflight != 4 || s.Queued != 6 || s.Capacity != 0 {
		t.Fatalf("after going down: %+v", s)
	}
	h.completeOldest()
	if len(h.inflight) != 3 {
		t.Fatalf("dispatched with no capacity")
	}
	// One comes back: capacity 2, still 3 in flight, so nothing starts.
	h.q.SetHealthy(1)
	h.checkConservation()
	if len(h.inflight) != 3 {
		t.Fatalf("dispatched above capacity")
	}
	h.completeOldest()
	h.completeOldest()
	if len(h.inflight) != 2 {
		t.Fatalf("capacity did not come back: %d in flight", len(h.inflight))
	}
	// Both back: capacity 4, two more start at once.
	h.q.SetHealthy(2)
	if len(h.inflight) != 4 {
		t.Fatalf("capacity did not return in full: %d in flight", len(h.inflight))
	}
	for _, tk := range running {
		if _, ok := h.ended[tk]; ok && h.ended[tk] != EventReleased {
			t.Fatalf("in-flight ticket ended as %v", h.ended[tk])
		}
	}
	h.drain(2)
	for _, tk := range queued {
		if h.ended[tk] != EventReleased {
			t.Fatalf("queued ticket ended as %v, want dispatched and released", h.ended[tk])
		}
	}
}

// Test 9b: random capacity changes and reconfigurations under load.
func TestReconfigureUnderLoad(t *testing.T) {
	h := newHarness(t, testConfig(3, nil), 2, 91)
	tenants := []string{"a", "b", "c", "d", "e"}
	var all []*Ticket
	for op := 0; op < 20000; op++ {
		h.clk.Advance(time.Millisecond)
		switch r := h.rng.IntN(100); {
		case r < 50:
			dl := time.Time{}
			if h.rng.IntN(3) == 0 {
				dl = h.clk.Now().Add(time.Duration(h.rng.IntN(2000)) * time.Millisecond)
			}
			tk, err := h.tryEnqueue(Request{Tenant: tenants[h.rng.IntN(len(tenants))],
				Cost: 1 + h.rng.Int64N(3000), Deadline: dl})
			if err != nil {
				var rej *Rejection
				if !errors.As(err, &rej) {
					t.Fatalf("enqueue: %v", err)
				}
				continue
			}
			all = append(all, tk)
		case r < 85:
			if len(h.inflight) > 0 {
				h.completeRandom()
			}
		case r < 90:
			h.q.Tick()
		case r < 95:
			h.q.SetHealthy(h.rng.IntN(4))
		default:
			cfg := testConfig(1+h.rng.IntN(4), nil)
			for _, name := range tenants[:h.rng.IntN(len(tenants))] {
				cfg.Tenants[name] = TenantConfig{Weight: float64(1 + h.rng.IntN(50)),
					Class: "batch", MaxQueue: h.rng.IntN(20)}
			}
			cfg.MaxQueue = h.rng.IntN(60)
			if h.rng.IntN(2) == 0 {
				cfg.MaxInflightTokens = 1000 + h.rng.Int64N(5000)
			}
			if h.rng.IntN(2) == 0 {
				cfg.MaxQueueTokens = 10000 + h.rng.Int64N(50000)
			}
			if err := h.q.Reconfigure(cfg); err != nil {
				t.Fatal(err)
			}
		}
		h.checkConservation()
		h.checkAccounting()
	}
	h.drain(2)
	for _, tk := range all {
		if _, ok := h.ended[tk]; !ok {
			t.Fatalf("ticket never ended")
		}
	}
	if err := h.q.Reconfigure(Config{}); err == nil {
		t.Fatalf("invalid config accepted")
	}
}

// Test 10: the boost lane dispatches ahead of tag order and is charged.
func TestBoostLane(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1, 100)
	h.enqueue(Request{Tenant: "a", Cost: 100}) // runs
	var bs []*Ticket
	for i := 0; i < 3; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 100})
		bs = append(bs, h.enqueue(Request{Tenant: "b", Cost: 100}))
	}
	last := bs[2]
	if !h.q.Promote(last) {
		t.Fatalf("Promote of a queued ticket failed")
	}
	if h.q.Promote(last) {
		t.Fatalf("Promote twice succeeded")
	}
	h.completeOldest()
	if h.inflight[0] != last {
		t.Fatalf("boosted ticket not dispatched first")
	}
	if !last.Boosted() || h.q.Stats(false).BoostedInflight != 1 {
		t.Fatalf("boosted ticket not marked")
	}
	if got := tenantStats(h.q, "b").Served; got != 100 {
		t.Fatalf("boosted ticket not charged: served %v", got)
	}
	h.completeOldest()
	if h.q.Stats(false).BoostedInflight != 0 {
		t.Fatalf("boosted in-flight count not released")
	}
	// Having been charged, b now comes after a in tag order: a's request
	// queued first is next, then b's first.
	if h.inflight[0].Tenant() != "a" {
		t.Fatalf("after the boost, %s went next, want a", h.inflight[0].Tenant())
	}
	if h.q.Promote(h.inflight[0]) {
		t.Fatalf("Promote of an in-flight ticket succeeded")
	}
	h.drain(1)
}

// Test 10b: a paused class yields to every unpaused request, takes slots
// nobody else wants, and resumes in order.
func TestPause(t *testing.T) {
	cfg := testConfig(1, nil)
	cfg.Tenants["i1"] = TenantConfig{Weight: 1, Class: "interactive"}
	cfg.Tenants["i2"] = TenantConfig{Weight: 1, Class: "interactive"}
	h := newHarness(t, cfg, 2, 101)
	h.q.SetPaused("batch", true)
	h.q.SetPaused("nonexistent", true) // ignored

	// A paused class takes a slot nobody else wants.
	b1 := h.enqueue(Request{Tenant: "b1", Cost: 100})
	if !h.dispatched[b1] {
		t.Fatalf("paused class left a slot idle")
	}
	var batch []*Ticket
	for i := 0; i < 3; i++ {
		batch = append(batch, h.enqueue(Request{Tenant: "b1", Cost: 100}),
			h.enqueue(Request{Tenant: "b2", Cost: 100}))
	}
	// Second slot: taken by paused work, since nobody else waits.
	if len(h.inflight) != 2 || h.inflight[1] != batch[0] {
		t.Fatalf("second slot not given to paused work")
	}
	// Interactive work arrives: it goes before all queued batch work.
	var inter []*Ticket
	for i := 0; i < 4; i++ {
		inter = append(inter, h.enqueue(Request{Tenant: fmt.Sprint("i", 1+i%2), Cost: 1000}))
	}
	for range inter {
		h.completeOldest()
		h.checkConservation()
	}
	for _, tk := range inter {
		if !h.dispatched[tk] {
			t.Fatalf("interactive request waited behind a paused class")
		}
	}
	for _, tk := range batch[1:] {
		if h.dispatched[tk] {
			t.Fatalf("paused class dispatched while unpaused work waited")
		}
	}
	// Unpaused: batch resumes in tag order, each tenant in FIFO order.
	h.q.SetPaused("batch", false)
	for len(h.inflight) > 0 {
		h.completeOldest()
	}
	var got []*Ticket
	for _, tk := range h.order {
		if tk.Class() == "batch" && tk != b1 && tk != batch[0] {
			got = append(got, tk)
		}
	}
	want := batch[1:]
	// b1 was served twice (b1, batch[0]) before b2's first: b2 leads.
	if len(got) != len(want) {
		t.Fatalf("resumed %d batch requests, want %d", len(got), len(want))
	}
	for i, tk := range got {
		if tk != want[i] {
			t.Fatalf("batch resumed out of order at %d: %s", i, tk.Tenant())
		}
	}
	h.drain(2)
}

// Test 10c: while a class is paused, its stalled tenants do not hold the
// virtual time back: a tenant returning after a long idle period gets no
// burst against the tenants being served.
func TestPausedClassDoesNotHoldVirtualTime(t *testing.T) {
	cfg := testConfig(1, nil)
	for _, n := range []string{"i1", "i2", "i3"} {
		cfg.Tenants[n] = TenantConfig{Weight: 1, Class: "interactive"}
	}
	h := newHarness(t, cfg, 1, 102)
	cost := func(string) int64 { return 1000 }
	h.keepOrder = false
	runBacklogged(h, []string{"i1", "i2", "i3", "b"}, 2, 100, cost)
	for h.queuedBy["i3"] > 0 || h.inflightOf("i3") > 0 {
		h.completeOldest()
		h.backlog([]string{"i1", "i2", "b"}, 2, cost)
	}
	h.q.SetPaused("batch", true)
	for i := 0; i < 3000; i++ {
		h.clk.Advance(time.Second)
		h.completeOldest()
		h.backlog([]string{"i1", "i2"}, 2, cost)
	}
	base := map[string]float64{"i1": h.charged["i1"], "i2": h.charged["i2"], "i3": h.charged["i3"]}
	for i := 0; i < 30; i++ {
		h.enqueue(Request{Tenant: "i3", Cost: 1000})
	}
	h.onDispatch = func(tk *Ticket) {
		since := func(n string) float64 { return h.charged[n] - base[n] }
		if since("i3") > min(since("i1"), since("i2"))+1000 {
			t.Fatalf("returning tenant burst while batch was paused: %v vs %v, %v", since("i3"), since("i1"), since("i2"))
		}
	}
	for i := 0; i < 60; i++ {
		h.completeOldest()
		h.backlog([]string{"i1", "i2"}, 2, cost)
	}
	h.onDispatch = nil
	h.q.SetPaused("batch", false)
	h.drain(1)
}

// Test 11: deadlines. Tick expires a queued ticket within ExpiryMargin of
// its deadline; nothing is dispatched at or after its deadline.
func TestDeadlines(t *testing.T) {
	t.Run("Tick expires within the margin", func(t *testing.T) {
		cfg := testConfig(1, nil)
		cfg.ExpiryMargin = 500 * time.Millisecond
		h := newHarness(t, cfg, 1, 110)
		h.enqueue(Request{Tenant: "a", Cost: 1})
		deadline := t0.Add(10 * time.Second)
		tk := h.enqueue(Request{Tenant: "b", Cost: 1, Deadline: deadline})
		noDeadline := h.enqueue(Request{Tenant: "c", Cost: 1})
		if tk.Deadline() != deadline || tk.Enqueued() != t0 {
			t.Fatalf("ticket times: %v %v", tk.Deadline(), tk.Enqueued())
		}
		var expiredAt time.Time
		for step := 0; step < 200 && expiredAt.IsZero(); step++ {
			h.clk.Advance(100 * time.Millisecond)
			h.q.Tick()
			if h.ended[tk] == EventExpired {
				expiredAt = h.clk.Now()
			}
		}
		if expiredAt.IsZero() {
			t.Fatalf("never expired")
		}
		if early := deadline.Sub(expiredAt); early < 0 || early > cfg.ExpiryMargin {
			t.Fatalf("expired %v before its deadline, want within (0, %v]", early, cfg.ExpiryMargin)
		}
		wantRejection(t, tk.Err(), ReasonQueueTimeout)
		wantRejection(t, tk.Wait(context.Background()), ReasonQueueTimeout)
		if s := h.q.Stats(false); s.Queued != 1 {
			t.Fatalf("expired ticket still counted: %+v", s)
		}
		h.completeOldest()
		if !h.dispatched[noDeadline] || h.dispatched[tk] {
			t.Fatalf("wrong ticket dispatched after expiry")
		}
		h.drain(1)
	})

	t.Run("never dispatched at or after the deadline", func(t *testing.T) {
		h := newHarness(t, testConfig(1, nil), 1, 111)
		h.enqueue(Request{Tenant: "a", Cost: 1})
		at := h.enqueue(Request{Tenant: "b", Cost: 1, Deadline: t0.Add(time.Second)})
		after := h.enqueue(Request{Tenant: "c", Cost: 1, Deadline: t0.Add(500 * time.Millisecond)})
		ok := h.enqueue(Request{Tenant: "d", Cost: 1, Deadline: t0.Add(2 * time.Second)})
		h.clk.Advance(time.Second) // no Tick: the slot frees exactly at b's deadline
		h.completeOldest()
		if h.dispatched[at] || h.dispatched[after] {
			t.Fatalf("dispatched at or after its deadline")
		}
		if h.ended[at] != EventExpired || h.ended[after] != EventExpired || !h.dispatched[ok] {
			t.Fatalf("expected b, c expired and d dispatched: %v %v %v", h.ended[at], h.ended[after], h.dispatched[ok])
		}
		// A deadline already past at admission never dispatches either.
		h.completeOldest()
		late := h.enqueue(Request{Tenant: "e", Cost: 1, Deadline: h.clk.Now()})
		if h.dispatched[late] || h.ended[late] != EventExpired {
			t.Fatalf("request past its deadline at admission: dispatched %v ended %v", h.dispatched[late], h.ended[late])
		}
		h.drain(1)
	})

	t.Run("random load", func(t *testing.T) {
		// The harness fails on any dispatch at or after a deadline.
		cfg := testConfig(2, nil)
		cfg.ExpiryMargin = 50 * time.Millisecond
		h := newHarness(t, cfg, 2, 112)
		expired := 0
		for op := 0; op < 20000; op++ {
			h.clk.Advance(time.Duration(h.rng.IntN(30)) * time.Millisecond)
			switch r := h.rng.IntN(10); {
			case r < 5:
				h.enqueue(Request{Tenant: fmt.Sprint("t", h.rng.IntN(6)), Cost: 1 + h.rng.Int64N(1000),
					Deadline: h.clk.Now().Add(time.Duration(h.rng.IntN(1500)) * time.Millisecond)})
			case r < 9:
				if len(h.inflight) > 0 {
					h.completeRandom()
				}
			default:
				h.q.Tick()
			}
		}
		for _, ev := range h.ended {
			if ev == EventExpired {
				expired++
			}
		}
		if expired == 0 {
			t.Fatalf("setup: nothing expired")
		}
		h.drain(2)
	})
}

// Observer events come outside the lock, so an observer may call back into
// the queue; a nested call's events are delivered too.
func TestObserverReentrant(t *testing.T) {
	q, err := New(testConfig(1, nil), NewManualClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(1)
	var log []string
	q.SetObserver(func(ev Event, tk *Ticket) {
		log = append(log, fmt.Sprint(ev, tk.Tenant()))
		if ev == EventDispatched {
			tk.Release(UnknownCost) // complete at once, from inside the observer
		}
	})
	for i := 0; i < 3; i++ {
		if _, err := q.Enqueue(Request{Tenant: fmt.Sprint("t", i), Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if len(log) != 6 {
		t.Fatalf("events %v", log)
	}
	if s := q.Stats(false); s.Inflight != 0 || s.Queued != 0 {
		t.Fatalf("%+v", s)
	}
}
