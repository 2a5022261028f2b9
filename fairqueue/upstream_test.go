package fairqueue

import (
	"context"
	"testing"
	"time"
)

// upstreamConfig: 100 slots, tenants a and b (weight 1), vip with reserve
// vipShare of an account of tpm tokens per minute with the given burst.
func upstreamConfig(tpm float64, burst time.Duration, vipShare float64) Config {
	cfg := testConfig(100, map[string]float64{"a": 1, "b": 1, "vip": 1})
	cfg.UpstreamQuota = &UpstreamQuota{TPM: tpm, Burst: burst}
	if vipShare > 0 {
		v := cfg.Tenants["vip"]
		v.Reserve = vipShare
		cfg.Tenants["vip"] = v
	}
	return cfg
}

// tokensBy sums the estimated tokens of tenant's tickets dispatched by at.
func tokensBy(h *harness, tenant string, at time.Time) int64 {
	var n int64
	for tk := range h.dispatched {
		if (tenant == "" || tk.Tenant() == tenant) && !tk.Dispatched().After(at) {
			n += tk.Tokens()
		}
	}
	return n
}

// The account is never drawn beyond its rate: over any time D from the
// start, dispatched tokens <= rate x D + burst, counting each request's
// own size; and a backlogged tenant gets exactly that.
func TestUpstreamQuotaGatesDispatch(t *testing.T) {
	h := newHarness(t, upstreamConfig(60000, time.Second, 0), 1, 1) // 1000 tokens/s, burst 1000
	for i := 0; i < 40; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 500})
	}
	step := 50 * time.Millisecond
	for at := time.Duration(0); at <= 10*time.Second; at += step {
		h.clk.Set(t0.Add(at))
		for len(h.inflight) > 0 {
			h.completeOldest()
		}
		h.q.Tick()
		limit := int64(1000*at.Seconds()) + 1000
		if got := tokensBy(h, "", t0.Add(at)); got > limit {
			t.Fatalf("at %v: %d tokens dispatched, more than rate x time + burst = %d", at, got, limit)
		}
	}
	// 2 at once (1000 tokens of burst), then one each 500 ms.
	if got := tokensBy(h, "", t0.Add(10*time.Second)); got != 11000 {
		t.Fatalf("dispatched %d tokens in 10 s, want exactly 11000 (1000/s for 10 s + 1000 burst)", got)
	}
	if st := h.q.Stats(false); st.Queued != 40-22 {
		t.Fatalf("stats %+v, want 18 queued", st)
	}
}

// A reservation: while a flood holds the shared pool exhausted, the
// reserved tenant's requests go at once on their own meter; while the
// reserved tenant is idle, the flood borrows its rate but never the half
// of its burst that is held back.
func TestUpstreamReservation(t *testing.T) {
	// 6000 tokens/s; vip reserves 20% (1200/s, burst 2 s = 2400 tokens,
	// 1200 held back); the pool is 4800/s with a 2 s burst.
	h := newHarness(t, upstreamConfig(360000, 2*time.Second, 0.2), 1, 1)
	for i := 0; i < 400; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 600})
	}
	run := func(from, to time.Duration) {
		for at := from; at <= to; at += 50 * time.Millisecond {
			h.clk.Set(t0.Add(at))
			for len(h.inflight) > 0 {
				h.completeOldest()
			}
			h.q.Tick()
		}
	}
	run(0, 20*time.Second)
	// The flood gets the whole account while vip is idle: the pool's
	// 4800/s and vip's 1200/s lent, plus the pool's burst and the half of
	// vip's burst that is lent.
	if got, want := tokensBy(h, "a", t0.Add(20*time.Second)), int64(20*6000+9600+1200); got < want-600 || got > want {
		t.Fatalf("flood with vip idle: %d tokens in 20 s, want %d (within one request below)", got, want)
	}
	// vip arrives into the exhausted pool: its first requests go at once,
	// from the half of its burst held back (1200 tokens: two of 600).
	v1 := h.enqueue(Request{Tenant: "vip", Cost: 600})
	v2 := h.enqueue(Request{Tenant: "vip", Cost: 600})
	if v1.Dispatched().IsZero() || v2.Dispatched().IsZero() {
		t.Fatal("vip's first requests waited while a flood holds the pool")
	}
	h.checkConservation()
}

// The provider's word: nothing goes to an exhausted account before the
// time it gave.
func TestUpstreamAccountExhausted(t *testing.T) {
	h := newHarness(t, upstreamConfig(6e6, time.Second, 0), 1, 1)
	h.q.AccountExhausted(t0.Add(2 * time.Second))
	tk := h.enqueue(Request{Tenant: "a", Cost: 10})
	h.clk.Set(t0.Add(2*time.Second - time.Millisecond))
	h.q.Tick()
	if !tk.Dispatched().IsZero() {
		t.Fatal("dispatched to an exhausted account")
	}
	h.clk.Set(t0.Add(2 * time.Second))
	h.q.Tick()
	if tk.Dispatched().IsZero() {
		t.Fatal("not dispatched once the account was back")
	}
}

// Requeue: a request the provider refused goes back to the head of its
// tenant's queue, uncharged, frees its slot, and is dispatched again.
func TestRequeue(t *testing.T) {
	cfg := upstreamConfig(6e6, time.Second, 0)
	cfg.MaxInflight = 1
	h := newHarness(t, cfg, 1, 1)
	first := h.enqueue(Request{Tenant: "a", Cost: 100})
	second := h.enqueue(Request{Tenant: "a", Cost: 100})
	served := h.q.Stats(true).Tenants[0].Served
	h.q.AccountExhausted(t0.Add(time.Second))
	if !first.Requeue() {
		t.Fatal("Requeue of an in-flight ticket reported false")
	}
	h.inflight = h.inflight[:0]
	delete(h.dispatched, first) // the harness would call its second dispatch a double
	if st := h.q.Stats(true); st.Inflight != 0 || st.Queued != 2 || st.Tenants[0].Served != served-100 {
		t.Fatalf("after Requeue: %+v, want 2 queued, nothing in flight, the charge refunded", st)
	}
	h.clk.Set(t0.Add(time.Second))
	h.q.Tick()
	if err := first.Wait(context.Background()); err != nil || first.Dispatched() != t0.Add(time.Second) {
		t.Fatalf("requeued ticket: wait %v, dispatched %v; want dispatched again first, at 1 s", err, first.Dispatched())
	}
	if !second.Dispatched().IsZero() {
		t.Fatal("the request behind the requeued one went first")
	}
}

// A slot limit caps the capacity below what the healthy upstreams allow;
// at 0, requests still queue (another gateway holds the slots for now),
// and a raised limit dispatches them at once.
func TestSlotLimit(t *testing.T) {
	h := newHarness(t, testConfig(4, nil), 2, 1) // 8 slots
	h.q.SetSlotLimit(0)
	tk := h.enqueue(Request{Tenant: "a", Cost: 10})
	if !tk.Dispatched().IsZero() {
		t.Fatal("dispatched with a slot limit of 0")
	}
	h.q.SetSlotLimit(3)
	for i := 0; i < 5; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 10})
	}
	if st := h.q.Stats(false); st.Inflight != 3 || st.Capacity != 3 {
		t.Fatalf("stats %+v, want 3 in flight at a limit of 3", st)
	}
	h.q.SetSlotLimit(-1)
	if st := h.q.Stats(false); st.Inflight != 6 || st.Capacity != 8 {
		t.Fatalf("stats %+v, want all 6 in flight without a limit (8 slots)", st)
	}
}

// BackloggedWeight counts the declared tenants with requests queued and
// the undeclared group once; a request in flight does not count.
func TestBackloggedWeight(t *testing.T) {
	h := newHarness(t, testConfig(1, map[string]float64{"a": 3, "b": 2}), 1, 1)
	if w := h.q.BackloggedWeight(); w != 0 {
		t.Fatalf("idle: %v", w)
	}
	h.enqueue(Request{Tenant: "b", Cost: 1}) // in flight
	h.enqueue(Request{Tenant: "a", Cost: 1})
	h.enqueue(Request{Tenant: "x", Cost: 1})
	h.enqueue(Request{Tenant: "y", Cost: 1})
	if w := h.q.BackloggedWeight(); w != 3+1 {
		t.Fatalf("a and two undeclared queued, b in flight: %v, want 4 (3 + the group's 1)", w)
	}
}
