package quota

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestLongRunRate: a greedy tenant, always with a request ready and retrying
// at the earliest time it is given, is charged each meter's rate within 1%
// over 10 virtual minutes; an open-loop tenant sending Poisson arrivals at
// 1.5x the rate is too. Neither exceeds guarantee 1's bound
// r x (D + tau) + c_max.
func TestLongRunRate(t *testing.T) {
	const D = 10 * time.Minute
	for _, mc := range meterCases() {
		t.Run(mc.name+"/greedy", func(t *testing.T) {
			clk := newVclock()
			m := NewMemory(clk.Now)
			var units float64
			for {
				d := mustPeek(t, m, "a", mc.lim)
				if !d.Allowed {
					if d.Reason != mc.dim {
						t.Fatalf("refused for %q, want %q", d.Reason, mc.dim)
					}
					if d.At.Sub(epoch0) > D {
						break
					}
					clk.Set(d.At)
				}
				if c := mustCharge(t, m, "a", mc.lim, mc.tokens); !c.Allowed {
					t.Fatalf("at %v: refused at the earliest time Peek gave", clk.Now().Sub(epoch0))
				}
				units += mc.units
			}
			checkRate(t, units, mc, D)
		})
		t.Run(mc.name+"/poisson-1.5x", func(t *testing.T) {
			clk := newVclock()
			m := NewMemory(clk.Now)
			rng := rand.New(rand.NewPCG(1, 2))
			reqRate := 1.5 * mc.rate / mc.units
			var units float64
			at := time.Duration(0)
			for {
				at += time.Duration(rng.ExpFloat64() / reqRate * 1e9)
				if at > D {
					break
				}
				clk.Set(epoch0.Add(at))
				if mustCharge(t, m, "a", mc.lim, mc.tokens).Allowed {
					units += mc.units
				}
			}
			checkRate(t, units, mc, D)
		})
	}
}

func checkRate(t *testing.T, units float64, mc meterCase, d time.Duration) {
	t.Helper()
	got := units / d.Seconds()
	if !within(got, mc.rate, 0.01) {
		t.Errorf("long-run rate %.2f units/s, want %.2f within 1%%", got, mc.rate)
	}
	bound := mc.rate*(d.Seconds()+mc.lim.Tolerance().Seconds()) + mc.units
	if units > bound+1e-9 {
		t.Errorf("charged %.0f units in %v, above the bound r x (D + tau) + c_max = %.0f", units, d, bound)
	}
	t.Logf("%s: %.2f units/s for a limit of %.2f (%.3f%%)", mc.name, got, mc.rate, 100*(got/mc.rate-1))
}

// sendAt offers requests of mc at mult x the meter's rate from start for
// dur (both ends included, arrivals at start + k x spacing), and returns how
// many were offered and allowed, the first refused arrival and the last
// allowed one (-1 when none).
func sendAt(t *testing.T, clk *vclock, m *Memory, mc meterCase, mult float64, start, dur time.Duration) (offered, allowed int, firstRefused, lastAllowed time.Duration) {
	t.Helper()
	spacing := 1e9 * mc.units / (mult * mc.rate)
	firstRefused, lastAllowed = -1, -1
	for k := 0; ; k++ {
		off := time.Duration(math.Round(float64(k) * spacing))
		if off > dur {
			return
		}
		clk.Set(epoch0.Add(start + off))
		offered++
		if mustCharge(t, m, "a", mc.lim, mc.tokens).Allowed {
			allowed++
			lastAllowed = start + off
		} else if firstRefused < 0 {
			firstRefused = start + off
		}
	}
}

// TestBurstWindow checks guarantees 2 and 3 of the package doc, on each
// meter, with the seed's window (burst_allow 0.2, burst_window 10 s):
//
//   - at rest, 1.2x the rate for 10 s: every request is served;
//   - past the window, still at 1.2x (and at 5x): the first arrival after
//     the window is refused, and the tenant is served exactly its rate,
//     within one request, over the next 30 s;
//   - at 0.8x, the debt (tau plus at most one request) is repaid in
//     tau / 0.2 = 10 s plus one request's time / 0.2, all served: what is
//     left is the last request's own charge;
//   - then a second 1.2x burst for 10 s is fully served again.
func TestBurstWindow(t *testing.T) {
	const (
		W    = 10 * time.Second
		hold = 30 * time.Second
	)
	for _, mc := range meterCases() {
		for _, heldMult := range []float64{1.2, 5} {
			t.Run(mc.name, func(t *testing.T) {
				clk := newVclock()
				m := NewMemory(clk.Now)

				offered, allowed, refused, _ := sendAt(t, clk, m, mc, 1.2, 0, W)
				if allowed != offered || refused >= 0 {
					t.Fatalf("burst at 1.2x for %v: %d of %d served (first refusal at %v), want all", W, allowed, offered, refused)
				}

				spacing := time.Duration(1e9 * mc.units / (heldMult * mc.rate))
				_, allowed, refused, last := sendAt(t, clk, m, mc, heldMult, W+spacing, hold-spacing)
				if refused != W+spacing {
					t.Errorf("held at %.1fx: first refusal at %v, want the first arrival after the window, %v", heldMult, refused, W+spacing)
				}
				want := mc.rate * hold.Seconds() / mc.units
				if math.Abs(float64(allowed)-want) > 1 {
					t.Errorf("held at %.1fx for %v: %d requests served, want the rate's %.1f within one", heldMult, hold, allowed, want)
				}

				// Payback at 0.8x, starting one 0.8x spacing after the last
				// request served.
				inc := mc.lim.Increment(mc.dim, mc.tokens)
				payback := time.Duration(float64(mc.lim.Tolerance()+inc) / 0.2)
				sp08 := time.Duration(1e9 * mc.units / (0.8 * mc.rate))
				pbStart := last + sp08
				offered, allowed, refused, _ = sendAt(t, clk, m, mc, 0.8, pbStart, payback)
				if allowed != offered {
					t.Errorf("payback at 0.8x: %d of %d served (first refusal at %v), want all", allowed, offered, refused)
				}
				end := pbStart + payback
				clk.Set(epoch0.Add(end))
				st, _ := m.Status(bg, "a", mc.lim)
				// Repaid: what is left is at most the last request's own
				// charge, which a 0.8x sender always carries.
				if r := st.Meter(mc.dim).Reset; r > inc {
					t.Errorf("after %v at 0.8x: Reset %v, want at most one request's %v (debt repaid)", payback, r, inc)
				}

				offered, allowed, refused, _ = sendAt(t, clk, m, mc, 1.2, end+sp08, W)
				if allowed != offered {
					t.Errorf("second burst at 1.2x for %v: %d of %d served (first refusal at %v), want all", W, allowed, offered, refused)
				}
			})
		}
	}
}

// TestEarliestTimeExact checks guarantee 4 on random traffic (mostly small
// requests, some of 20k tokens) against each single-meter config and the
// seed's three meters: a refused request is refused 1 ns before its At, for
// the same reason, and allowed at At. Every dimension is seen binding.
func TestEarliestTimeExact(t *testing.T) {
	reasons := map[Dimension]int{}
	limits := []*Limits{MustCompile(seedCfg)}
	for _, mc := range meterCases() {
		limits = append(limits, mc.lim)
	}
	for li, l := range limits {
		clk := newVclock()
		m := NewMemory(clk.Now)
		rng := rand.New(rand.NewPCG(3, uint64(li)))
		for i := 0; i < 5000; i++ {
			clk.Advance(time.Duration(rng.IntN(10)) * time.Millisecond)
			tokens := int64(rng.IntN(400))
			if rng.IntN(50) == 0 {
				tokens = 20000
			}
			d := mustCharge(t, m, "a", l, tokens)
			if d.Allowed {
				if d.Reason != "" || d.RetryAfter != 0 || !d.At.Equal(clk.Now()) {
					t.Fatalf("allowed with reason %q, retry %v, at %v", d.Reason, d.RetryAfter, d.At)
				}
				continue
			}
			reasons[d.Reason]++
			if d.RetryAfter != d.At.Sub(clk.Now()) || d.RetryAfter <= 0 {
				t.Fatalf("RetryAfter %v does not match At - now %v", d.RetryAfter, d.At.Sub(clk.Now()))
			}
			clk.Set(d.At.Add(-1))
			if p := mustPeek(t, m, "a", l); p.Allowed || p.Reason != d.Reason || !p.At.Equal(d.At) {
				t.Fatalf("1ns before At: %+v, want refused for %q with the same At", p, d.Reason)
			}
			clk.Set(d.At)
			if c := mustCharge(t, m, "a", l, tokens); !c.Allowed {
				t.Fatalf("retried at its earliest time: refused for %q, %v more", c.Reason, c.RetryAfter)
			}
		}
	}
	for _, dim := range []Dimension{DimQPS, DimTokens, DimJoint} {
		if reasons[dim] == 0 {
			t.Errorf("no refusal for %q: the test did not exercise that meter (%v)", dim, reasons)
		}
	}
}

// TestReconcileConverges checks guarantee 6: a greedy tenant whose estimates
// are half, twice, or a random 0.25..4x its actual 100..1500 tokens (so that
// a refund, at most 4200 tokens = 1.26 s, stays within the 2 s window),
// reconciled four requests after dispatch, uses the token and joint rates
// within 1% over 10 virtual minutes, measured in actual tokens.
func TestReconcileConverges(t *testing.T) {
	const D = 10 * time.Minute
	for _, tc := range []struct {
		name string
		dim  Dimension
		cfg  Config
		rate float64 // meter units per second
	}{
		{"tokens", DimTokens, Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2}, 200000.0 / 60},
		{"joint", DimJoint, Config{QPS: 200, TokenToQPSWeight: 0.0008, JointCap: 1, BurstWindow: 10 * time.Second, BurstAllow: 0.2}, 200},
	} {
		l := MustCompile(tc.cfg)
		for _, est := range []struct {
			name string
			f    func(r *rand.Rand) float64
		}{
			{"under-0.5x", func(*rand.Rand) float64 { return 0.5 }},
			{"over-2x", func(*rand.Rand) float64 { return 2 }},
			{"random-0.25..4x", func(r *rand.Rand) float64 { return math.Pow(2, -2+4*r.Float64()) }},
		} {
			t.Run(tc.name+"/"+est.name, func(t *testing.T) {
				clk := newVclock()
				m := NewMemory(clk.Now)
				rng := rand.New(rand.NewPCG(5, 6))
				type req struct{ est, act int64 }
				var inflight []req
				var used float64 // actual units on the meter
				for {
					d := mustPeek(t, m, "a", l)
					if !d.Allowed {
						if d.At.Sub(epoch0) > D {
							break
						}
						clk.Set(d.At)
					}
					act := int64(100 + rng.IntN(1400))
					r := req{est: int64(math.Round(float64(act) * est.f(rng))), act: act}
					if !mustCharge(t, m, "a", l, r.est).Allowed {
						t.Fatal("refused at the earliest time")
					}
					inflight = append(inflight, r)
					if len(inflight) > 4 {
						done := inflight[0]
						inflight = inflight[1:]
						if _, err := m.Reconcile(bg, "a", l, done.est, done.act); err != nil {
							t.Fatal(err)
						}
						if tc.dim == DimTokens {
							used += float64(done.act)
						} else {
							used += 1 + float64(done.act)*0.0008
						}
					}
				}
				got := used / D.Seconds()
				if !within(got, tc.rate, 0.01) {
					t.Errorf("actual usage %.2f units/s, want %.2f within 1%%", got, tc.rate)
				}
				t.Logf("actual usage %.2f units/s for a limit of %.2f (%.3f%%)", got, tc.rate, 100*(got/tc.rate-1))
			})
		}
	}
}

// TestReconcileRefundStopsAtRest: a refund larger than the debt leaves the
// tenant at rest, with no extra credit beyond the window.
func TestReconcileRefundStopsAtRest(t *testing.T) {
	l := MustCompile(seedCfg)
	clk := newVclock()
	m := NewMemory(clk.Now)
	fresh, _ := m.Status(bg, "a", l)
	mustCharge(t, m, "a", l, 100)
	st, _ := m.Reconcile(bg, "a", l, 100, 0)
	st2, _ := m.Reconcile(bg, "a", l, 100000, 0)
	if st2.Tokens != fresh.Tokens || st2.Joint.Remaining != fresh.Joint.Remaining {
		t.Errorf("after refunds: %+v, want the fresh %+v (no credit beyond rest)", st2, fresh)
	}
	if st.Tokens.Reset != 0 {
		t.Errorf("refund of the whole charge: token Reset %v, want 0", st.Tokens.Reset)
	}
	// A tokens-only tenant refunded back to rest is forgotten at once.
	tok := MustCompile(Config{TokensPerMin: 1000})
	mustCharge(t, m, "t", tok, 100)
	if _, err := m.Reconcile(bg, "t", tok, 100, 0); err != nil || m.Len() != 1 {
		t.Errorf("a tenant refunded back to rest is still held (%d tenants, want only a)", m.Len())
	}
	// Extra debt on an unknown tenant is recorded.
	st, _ = m.Reconcile(bg, "b", l, 0, 20000)
	if st.Tokens.Reset != 6*time.Second || st.Joint.Reset != 80*time.Millisecond {
		t.Errorf("extra debt of 20000 tokens: resets %v / %v, want 6s / 80ms", st.Tokens.Reset, st.Joint.Reset)
	}
}

// TestAtomicCharge checks guarantee 5: a request refused by one meter is
// charged to none, and the binding meter is the one whose earliest time is
// latest.
func TestAtomicCharge(t *testing.T) {
	l := MustCompile(seedCfg)
	clk := newVclock()
	m := NewMemory(clk.Now)
	// One 20k-token request: tokens debt 6 s, joint 85 ms, qps 5 ms.
	if !mustCharge(t, m, "a", l, 20000).Allowed {
		t.Fatal("a request of a tenant at rest must start whatever its size")
	}
	before, _ := m.Status(bg, "a", l)
	d := mustCharge(t, m, "a", l, 1)
	if d.Allowed || d.Reason != DimTokens || d.RetryAfter != 4*time.Second {
		t.Fatalf("second request: %+v, want refused for tokens, retry 4s (6s debt - 2s window)", d)
	}
	if d.Status != before {
		t.Errorf("a refused charge changed the meters: %+v -> %+v", before, d.Status)
	}
	clk.Advance(d.RetryAfter)
	if !mustCharge(t, m, "a", l, 1).Allowed {
		t.Error("refused at its earliest time")
	}
}

// TestStatusHeaders checks the header view: limits per minute, remaining
// back-to-back units, reset to rest.
func TestStatusHeaders(t *testing.T) {
	l := MustCompile(seedCfg)
	clk := newVclock()
	m := NewMemory(clk.Now)
	st, _ := m.Status(bg, "a", l)
	want := Status{
		// 2 s of window at 200/s, plus the request a debt of exactly tau
		// still admits.
		Requests: MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
		Tokens:   MeterStatus{Enabled: true, Limit: 200000, Remaining: 6666},
		Joint:    MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
	}
	if st != want {
		t.Fatalf("fresh status %+v, want %+v", st, want)
	}
	var d Decision
	for i := 0; i < 10; i++ {
		d = mustCharge(t, m, "a", l, 125) // 1.1 request-equivalents
	}
	if r := d.Status.Requests; r.Remaining != 391 || r.Reset != 50*time.Millisecond {
		t.Errorf("after 10 requests: requests %+v, want remaining 391, reset 50ms", r)
	}
	if j := d.Status.Joint; j.Remaining != 390 || j.Reset != 55*time.Millisecond {
		t.Errorf("after 10 requests of 1.1: joint %+v, want remaining 390, reset 55ms", j)
	}
	if k := d.Status.Tokens; k.Remaining != 6666-1250 || k.Reset != 375*time.Millisecond {
		t.Errorf("after 1250 tokens: tokens %+v, want remaining 5416, reset 375ms", k)
	}
	// At now + the longest Reset the tenant is back at rest.
	clk.Advance(d.Status.Tokens.Reset)
	if st, _ := m.Status(bg, "a", l); st != want {
		t.Errorf("after Reset: %+v, want the fresh %+v", st, want)
	}
	// A meter in debt beyond the window has nothing remaining.
	mustCharge(t, m, "a", l, 20000)
	st, _ = m.Status(bg, "a", l)
	if st.Tokens.Remaining != 0 || st.Tokens.Reset != 6*time.Second {
		t.Errorf("after 20000 tokens: %+v, want 0 remaining, reset 6s", st.Tokens)
	}
	if st.Meter("x") != (MeterStatus{}) {
		t.Error("unknown dimension must have an empty status")
	}
	if off, _ := m.Status(bg, "a", MustCompile(Config{QPS: 1})); off.Tokens.Enabled || off.Joint.Enabled {
		t.Error("meters off must report Enabled false")
	}
}

// TestForgetRested checks guarantee 7: tenants at rest are forgotten by the
// sweep, and a forgotten tenant decides exactly as one never seen.
func TestForgetRested(t *testing.T) {
	l := MustCompile(seedCfg)
	clk := newVclock()
	m := NewMemory(clk.Now)
	for i := 0; i < 1000; i++ {
		mustCharge(t, m, tenantName(i), l, int64(i))
	}
	if m.Len() != 1000 {
		t.Fatalf("held %d tenants, want 1000", m.Len())
	}
	// The biggest debt is 999 tokens = 0.2997 s; a sweep is due after
	// DefaultSweepEvery.
	clk.Advance(DefaultSweepEvery)
	mustPeek(t, m, "someone-else", l)
	if m.Len() != 0 {
		t.Fatalf("after a sweep %d tenants held, want 0 (all at rest)", m.Len())
	}
	a, _ := m.Status(bg, tenantName(999), l)
	b, _ := m.Status(bg, "never-seen", l)
	if a != b {
		t.Errorf("forgotten tenant %+v differs from an unknown one %+v", a, b)
	}
	// A tenant still in debt is kept.
	mustCharge(t, m, "big", l, 1_000_000) // 5 min of tokens
	clk.Advance(DefaultSweepEvery)
	mustPeek(t, m, "x", l)
	if m.Len() != 1 {
		t.Errorf("tenant in debt forgotten: held %d, want 1", m.Len())
	}
}

func tenantName(i int) string {
	const digits = "0123456789"
	b := []byte("tenant-00000")
	for j := len(b) - 1; i > 0; j-- {
		b[j] = digits[i%10]
		i /= 10
	}
	return string(b)
}

// TestReconcileLargeOverestimate: when a refund exceeds the debt at
// completion (20k-token estimates that use 2k, on a 2 s window of 6666
// tokens), the tenant is held below its rate, never above. The tenant sends
// whenever its quota allows, any number in flight, each running 1 s.
func TestReconcileLargeOverestimate(t *testing.T) {
	const D = 10 * time.Minute
	l := MustCompile(Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	clk := newVclock()
	m := NewMemory(clk.Now)
	var done []time.Time // completion times, in order (fixed latency)
	var used float64
	for clk.Now().Sub(epoch0) <= D {
		d := mustPeek(t, m, "a", l)
		if d.Allowed {
			if !mustCharge(t, m, "a", l, 20000).Allowed {
				t.Fatal("refused right after an allowing Peek")
			}
			done = append(done, clk.Now().Add(time.Second))
			continue
		}
		next := d.At
		if len(done) > 0 && done[0].Before(next) {
			next = done[0]
		}
		clk.Set(next)
		for len(done) > 0 && !done[0].After(next) {
			done = done[1:]
			if _, err := m.Reconcile(bg, "a", l, 20000, 2000); err != nil {
				t.Fatal(err)
			}
			used += 2000
		}
	}
	got, rate := used/D.Seconds(), 200000.0/60
	if got > rate {
		t.Errorf("actual usage %.1f tokens/s above the rate %.1f", got, rate)
	}
	t.Logf("actual usage %.1f tokens/s for a limit of %.1f (held below by its estimates)", got, rate)
}

// TestConcurrent checks, under -race, that concurrent Charge, Peek,
// Reconcile and Status on shared tenants admit exactly what the meters
// allow: on a frozen clock a tenant at rest admits floor(tau/T) + 1 = 401
// requests at 200 qps with a 2 s window, whatever the interleaving, and one
// second later exactly 200 more.
func TestConcurrent(t *testing.T) {
	l := MustCompile(Config{QPS: 200, TokensPerMin: 1e9, TokenToQPSWeight: 1e-6, JointCap: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	clk := newVclock()
	m := NewMemory(clk.Now)
	tenants := []string{"a", "b", "c", "d"}
	round := func() map[string]int {
		var mu sync.Mutex
		got := map[string]int{}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 600; i++ {
					tn := tenants[(g+i)%len(tenants)]
					d, err := m.Charge(bg, tn, l, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						got[tn]++
						mu.Unlock()
						// A no-op reconcile and reads, racing the charges.
						if _, err := m.Reconcile(bg, tn, l, 10, 10); err != nil {
							t.Error(err)
						}
					}
					if _, err := m.Peek(bg, tn, l, Backlog{}); err != nil {
						t.Error(err)
					}
					if _, err := m.Status(bg, tn, l); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		return got
	}
	for _, tc := range []struct {
		advance time.Duration
		want    int
	}{{0, 401}, {time.Second, 200}} {
		clk.Advance(tc.advance)
		got := round()
		for _, tn := range tenants {
			if got[tn] != tc.want {
				t.Errorf("after +%v: tenant %s admitted %d, want exactly %d", tc.advance, tn, got[tn], tc.want)
			}
		}
	}
}

// TestBookHoldsToTheRate: a tenant whose requests all book (as a cluster's
// gateways do at admission, however many instances make them) is held to
// its rate at the booked times, as one charged as each starts is
// (guarantee 1): over any span of the booked times, no more than r x (D +
// tau) + one request; and every booked time is the earliest its request
// could have been charged at.
func TestBookHoldsToTheRate(t *testing.T) {
	l := MustCompile(Config{QPS: 5, TokensPerMin: 30000, BurstWindow: 2 * time.Second, BurstAllow: 0.5}) // tau 1 s
	rng := rand.New(rand.NewPCG(11, 12))
	var ts TATs
	now := int64(0)
	ts = Fresh(now)
	var at []int64
	var tok []int64
	for i := 0; i < 3000; i++ {
		now += int64(rng.IntN(100)) * int64(time.Millisecond) // ~20/s offered: 4x qps
		tokens := int64(rng.IntN(200))
		before := ts
		ok, when, _ := Book(&ts, l, now, tokens, int64(5*time.Second))
		if !ok {
			if ts != before {
				t.Fatal("a refused booking changed the meters")
			}
			continue
		}
		// Charged as of when: exactly what a charge at when would do.
		want := before
		if allowed, e, _ := Decide(&want, l, when, Backlog{}); !allowed || e != when {
			t.Fatalf("booking %d at %v: a charge at its booked time %v would be refused", i, now, when)
		}
		Charge(&want, l, when, tokens)
		if want != ts {
			t.Fatalf("booking %d: meters %v, want those of a charge at %v: %v", i, ts, when, want)
		}
		at = append(at, when)
		tok = append(tok, tokens)
	}
	// Over every span [at[i], at[j]] of the booked times.
	tau := 1.0
	for i := range at {
		n, sum := 0, int64(0)
		for j := i; j < len(at); j++ {
			n++
			sum += tok[j]
			d := time.Duration(at[j] - at[i]).Seconds()
			if float64(n) > 5*(d+tau)+1 || float64(sum) > 500*(d+tau)+200 {
				t.Fatalf("%d requests, %d tokens booked over %.3fs: more than the rate allows", n, sum, d)
			}
		}
	}
	if span := time.Duration(now).Seconds(); float64(len(at)) < 0.95*5*span {
		t.Fatalf("only %d bookings over %.0fs: the test did not run the meters at their rate", len(at), span)
	}
}
