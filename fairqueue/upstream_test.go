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
// start, dispatched tokens <= r x (D + burst), with r the account's limit
// spread over 61 s plus the burst, counting each request's own size; and
// a backlogged tenant gets exactly that.
func TestUpstreamQuotaGatesDispatch(t *testing.T) {
	h := newHarness(t, upstreamConfig(60000, time.Second, 0), 1, 1) // 1000 tokens/s drawn at 60/62 of it
	r := 1000 * 60.0 / 62
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
		limit := int64(r * (at.Seconds() + 1))
		if got := tokensBy(h, "", t0.Add(at)); got > limit {
			t.Fatalf("at %v: %d tokens dispatched, more than rate x (time + burst) = %d", at, got, limit)
		}
	}
	// r x 11 s = 10645: 21 requests of 500.
	if got := tokensBy(h, "", t0.Add(10*time.Second)); got != 10500 {
		t.Fatalf("dispatched %d tokens in 10 s, want exactly 10500 (%.1f/s for 10 s + a 1 s burst, whole requests)", got, r)
	}
	if st := h.q.Stats(false); st.Queued != 40-21 {
		t.Fatalf("stats %+v, want 19 queued", st)
	}
}

// TestUpstreamEveryMinuteWithinLimits: whatever the sizes and however the
// load comes (a backlogged flood, a reserved tenant's bursts, idle gaps),
// no window of 61 s (a provider's minute seen up to a second late) holds
// more than the account's TPM and RPM, as the provider counts them (prompt
// + output cap, charged at dispatch), and the flood is sent at the
// account's drawn rate: 60/(61 s + the burst + the reservation's headroom)
// of the limits, to within one request.
func TestUpstreamEveryMinuteWithinLimits(t *testing.T) {
	cfg := upstreamConfig(120000, 0, 0.2) // default burst 2 s; vip's headroom 20% x 6 s
	cfg.UpstreamQuota.RPM = 600
	h := newHarness(t, cfg, 1, 1)
	rng := h.rng
	type sent struct {
		at     time.Time
		tokens int64
	}
	var log []sent
	h.onDispatch = func(tk *Ticket) { log = append(log, sent{h.clk.Now(), tk.Tokens()}) }
	for i := 0; i < 2000; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 100 + rng.Int64N(3900)})
	}
	end := 5 * time.Minute
	for at := time.Duration(0); at <= end; at += 50 * time.Millisecond {
		h.clk.Set(t0.Add(at))
		// vip: bursts of 5 every 40 s, and idle in the fourth minute.
		if at%(40*time.Second) == 0 && (at < 3*time.Minute || at >= 4*time.Minute) {
			for range 5 {
				h.enqueue(Request{Tenant: "vip", Cost: 1000})
			}
		}
		for len(h.inflight) > 0 {
			h.completeOldest()
		}
		h.q.Tick()
	}
	var tokens, reqs int64
	head := 0
	for _, s := range log {
		tokens += s.tokens
		reqs++
		for !log[head].at.Add(61 * time.Second).After(s.at) {
			tokens -= log[head].tokens
			reqs--
			head++
		}
		if tokens > 120000 || reqs > 600 {
			t.Fatalf("the 61 s ending at %v held %d tokens and %d requests; the account allows 120000 and 600", s.at.Sub(t0), tokens, reqs)
		}
	}
	var total int64
	for _, s := range log {
		total += s.tokens
	}
	// The flood never runs dry: the account is sent its drawn rate r for
	// 5 minutes, less one request (the head that does not fit yet), and
	// at most r x (5 min + tau).
	tau := 2*time.Second + time.Duration(0.2*float64(6*time.Second))
	r := 120000 / (61*time.Second + tau).Seconds()
	if lo, hi := r*end.Seconds()-4000, r*(end+tau).Seconds(); float64(total) < lo || float64(total) > hi {
		t.Fatalf("sent %d tokens in %v, want %.0f..%.0f (%.1f/s)", total, end, lo, hi, r)
	}
}

// A reservation: while a flood holds the account at its limit, the
// reserved tenant's requests go at once, on the headroom the flood never
// takes, up to its reservation's burst; while the reserved tenant is idle
// the flood gets the account's whole rate, less that headroom once.
func TestUpstreamReservation(t *testing.T) {
	// 6000 tokens/s; vip reserves 20% with the default 6 s reserve burst:
	// a headroom of 1.2 s, tau 3.2 s, the account drawn at
	// 6000 x 60 / 64.2 = 5607.5/s, vip's reservation at 1121.5/s with
	// 6729 tokens of burst.
	h := newHarness(t, upstreamConfig(360000, 2*time.Second, 0.2), 1, 1)
	r := 6000 * 60 / 64.2
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
	// The flood gets the account's rate for 20 s and its 2 s burst, not
	// the headroom: r x 22 s = 123365.
	if got, want := tokensBy(h, "a", t0.Add(20*time.Second)), int64(r*22); got <= want-600 || got > want {
		t.Fatalf("flood with vip idle: %d tokens in 20 s, want %d (within one request below)", got, want)
	}
	// vip arrives at the account held at its limit: 11 of its requests
	// go at once (6729 tokens of headroom and reservation), the 12th
	// waits.
	var vip []*Ticket
	for range 12 {
		vip = append(vip, h.enqueue(Request{Tenant: "vip", Cost: 600}))
	}
	for i, tk := range vip {
		if went := !tk.Dispatched().IsZero(); went != (i < 11) {
			t.Fatalf("vip's request %d dispatched at once: %v; want the first 11 only", i+1, went)
		}
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
