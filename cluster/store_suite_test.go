package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// runStoreSuite runs each scenario, as a subtest, against a fresh Harness
// from newHarness: the guarantees of package quota's doc that every Store
// must keep, checked the same way on each.
func runStoreSuite(t *testing.T, newHarness func(t *testing.T) *quotatest.Harness) {
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, h *quotatest.Harness)
	}{
		{"earliest-time-exact", earliestTime},
		{"burst-window", burstWindow},
		{"backlog-peek", backlog},
		{"reconcile", reconcile},
		{"status", status},
		{"expiry", expiry},
		{"joint-atomic", jointAtomic},
		{"meters-off-and-reload", metersOff},
		{"concurrent-frozen-clock", concurrent},
		{"refund", refund},
		{"book", book},
		{"book-lead", bookLead},
		{"long-run-rate", longRunRate},
		{"reconcile-converges", reconcileConverges},
		{"reconcile-large-overestimate", reconcileLargeOverestimate},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, newHarness(t)) })
	}
}

// skipRemote skips a scenario of 10^5 calls on a Remote store.
func skipRemote(t *testing.T, h *quotatest.Harness) {
	if h.Remote {
		t.Skip("10^5 calls: run on in-process stores only")
	}
}

func within(got, want, tol float64) bool {
	return got >= want*(1-tol) && got <= want*(1+tol)
}

// earliestTime is guarantee 4 on random traffic against the seed's three
// meters and each single meter: a refused request's RetryAfter is
// At - now; at the last instant the store's clock can show before At
// (1 ns before on Memory, the microsecond before on Redis) it is refused
// with the same At and reason, and at the first instant at or after At
// (At itself on Memory) it is allowed. Every dimension is seen binding.
func earliestTime(t *testing.T, h *quotatest.Harness) {
	reasons := map[quota.Dimension]int{}
	limits := []*quota.Limits{
		quota.MustCompile(quotatest.SeedCfg),
		// A 50 ms window, which the traffic's 11% excess over 200 qps
		// exhausts in half a second.
		quota.MustCompile(quota.Config{QPS: 200, BurstWindow: time.Second, BurstAllow: 0.05}),
		// Joint binds: 3 request-equivalents a request on average, 100
		// a second.
		quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1, BurstWindow: time.Second, BurstAllow: 0.05}),
	}
	for _, mc := range quotatest.MeterCases() {
		limits = append(limits, mc.Lim)
	}
	calls := 5000
	if h.Remote {
		calls = 600
	}
	for li, l := range limits {
		tenant := "a" + strconv.Itoa(li)
		rng := rand.New(rand.NewPCG(3, uint64(li)))
		for i := 0; i < calls; i++ {
			h.Advance(time.Duration(rng.IntN(10)) * time.Millisecond)
			tokens := int64(rng.IntN(400))
			if rng.IntN(50) == 0 {
				tokens = 20000
			}
			d := h.Charge(t, tenant, l, tokens)
			if d.Allowed {
				if d.Reason != "" || d.RetryAfter != 0 || !d.At.Equal(h.Now()) {
					t.Fatalf("allowed with reason %q, retry %v, at %v (now %v)", d.Reason, d.RetryAfter, d.At, h.Now())
				}
				continue
			}
			reasons[d.Reason]++
			if d.RetryAfter != d.At.Sub(h.Now()) || d.RetryAfter <= 0 {
				t.Fatalf("RetryAfter %v does not match At - now %v", d.RetryAfter, d.At.Sub(h.Now()))
			}
			h.Set(h.Before(d.At))
			if p := h.Peek(t, tenant, l, quota.Backlog{}); p.Allowed || p.Reason != d.Reason || !p.At.Equal(d.At) {
				t.Fatalf("%v before At: %+v, want refused for %q with the same At %v", d.At.Sub(h.Now()), p, d.Reason, d.At)
			}
			h.Set(h.Ceil(d.At))
			if c := h.Charge(t, tenant, l, tokens); !c.Allowed {
				t.Fatalf("retried at its earliest time: refused for %q, %v more", c.Reason, c.RetryAfter)
			}
		}
	}
	for _, dim := range []quota.Dimension{quota.DimQPS, quota.DimTokens, quota.DimJoint} {
		if reasons[dim] == 0 {
			t.Errorf("no refusal for %q: the test did not exercise that meter (%v)", dim, reasons)
		}
	}
}

// sendAt offers requests of mc at mult x the meter's rate from start for
// dur (both ends included), each arrival on the store's clock resolution,
// and returns how many were offered and allowed, the first refused arrival
// and the last allowed one (-1 when none), as offsets from manualclock.Epoch.
func sendAt(t *testing.T, h *quotatest.Harness, tenant string, mc quotatest.MeterCase, mult float64, start, dur time.Duration) (offered, allowed int, firstRefused, lastAllowed time.Duration) {
	t.Helper()
	spacing := 1e9 * mc.Units / (mult * mc.Rate)
	firstRefused, lastAllowed = -1, -1
	for k := 0; ; k++ {
		off := time.Duration(math.Round(float64(k)*spacing/float64(h.Res))) * h.Res
		if off > dur {
			return
		}
		h.Set(manualclock.Epoch.Add(start + off))
		offered++
		if h.Charge(t, tenant, mc.Lim, mc.Tokens).Allowed {
			allowed++
			lastAllowed = start + off
		} else if firstRefused < 0 {
			firstRefused = start + off
		}
	}
}

// burstWindow is guarantees 2 and 3 on each meter with the seed's window
// (1.2x for 10 s):
//
//   - at rest, 1.2x the rate for 10 s: every request is served;
//   - past the window, held at 2x for 5 s (and, on a store not Remote, at
//     1.2x and 5x for 30 s): the first arrival after the window is refused,
//     and the tenant is served its rate within one request;
//   - after a 30 s hold, at 0.8x the debt (tau plus at most one request) is
//     repaid in tau / 0.2 = 10 s plus one request's time / 0.2, all served:
//     what is left is the last request's own charge; then a second 1.2x
//     burst for 10 s is served in full;
//   - Reset later, the tenant is at rest.
func burstWindow(t *testing.T, h *quotatest.Harness) {
	const W = 10 * time.Second
	type hold struct {
		mult    float64
		d       time.Duration
		payback bool
	}
	holds := []hold{{2, 5 * time.Second, false}}
	if !h.Remote {
		holds = append(holds, hold{1.2, 30 * time.Second, true}, hold{5, 30 * time.Second, true})
	}
	for _, mc := range quotatest.MeterCases() {
		for _, hd := range holds {
			t.Run(fmt.Sprintf("%s/%gx", mc.Name, hd.mult), func(t *testing.T) {
				start := h.Now().Sub(manualclock.Epoch)
				tn := fmt.Sprintf("burst-%s-%g", mc.Name, hd.mult)
				fresh := h.Status(t, tn, mc.Lim)
				offered, allowed, refused, _ := sendAt(t, h, tn, mc, 1.2, start, W)
				if allowed != offered || refused >= 0 {
					t.Fatalf("burst at 1.2x for %v: %d of %d served (first refusal at %v), want all", W, allowed, offered, refused)
				}
				spacing := time.Duration(1e9 * mc.Units / (hd.mult * mc.Rate)).Truncate(h.Res)
				_, allowed, refused, last := sendAt(t, h, tn, mc, hd.mult, start+W+spacing, hd.d-spacing)
				if refused != start+W+spacing {
					t.Errorf("held at %gx: first refusal at %v, want the first arrival after the window, %v", hd.mult, refused-start, W+spacing)
				}
				want := mc.Rate * hd.d.Seconds() / mc.Units
				if math.Abs(float64(allowed)-want) > 1 {
					t.Errorf("held at %gx for %v: %d requests served, want the rate's %.1f within one", hd.mult, hd.d, allowed, want)
				}
				if hd.payback {
					paybackAndBurst(t, h, tn, mc, last)
				}
				st := h.Status(t, tn, mc.Lim)
				h.Advance(st.Meter(mc.Dim).Reset)
				if st := h.Status(t, tn, mc.Lim); st != fresh {
					t.Errorf("after Reset: %+v, want the fresh %+v", st, fresh)
				}
			})
		}
	}
}

// paybackAndBurst sends at 0.8x, from one 0.8x spacing after last, until
// the debt is repaid, then a second burst at 1.2x for 10 s (burstWindow).
func paybackAndBurst(t *testing.T, h *quotatest.Harness, tn string, mc quotatest.MeterCase, last time.Duration) {
	inc := mc.Lim.Increment(mc.Dim, mc.Tokens)
	payback := time.Duration(float64(mc.Lim.Tolerance()+inc) / 0.2)
	sp08 := time.Duration(1e9 * mc.Units / (0.8 * mc.Rate)).Truncate(h.Res)
	pbStart := last + sp08
	offered, allowed, refused, _ := sendAt(t, h, tn, mc, 0.8, pbStart, payback)
	if allowed != offered {
		t.Errorf("payback at 0.8x: %d of %d served (first refusal at %v), want all", allowed, offered, refused)
	}
	end := pbStart + payback
	h.Set(h.Ceil(manualclock.Epoch.Add(end)))
	// Repaid: what is left is at most the last request's own charge,
	// which a 0.8x sender always carries.
	st := h.Status(t, tn, mc.Lim)
	if r := st.Meter(mc.Dim).Reset; r > inc {
		t.Errorf("after %v at 0.8x: Reset %v, want at most one request's %v (debt repaid)", payback, r, inc)
	}
	offered, allowed, refused, _ = sendAt(t, h, tn, mc, 1.2, end+sp08, 10*time.Second)
	if allowed != offered {
		t.Errorf("second burst at 1.2x for 10s: %d of %d served (first refusal at %v), want all", allowed, offered, refused)
	}
}

// backlog: Peek behind a backlog predicts, within k/2 ns of rounding
// (each charge is rounded to the nanosecond on its own and the backlog's
// once), when the request is allowed after the k ahead are charged at
// their own earliest times, and it is allowed then; a backlog the window
// absorbs leaves it allowed now.
func backlog(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quota.Config{QPS: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2}) // tau 2 s: 20 requests
	if d := h.Peek(t, "w", l, quota.Backlog{Requests: 20}); !d.Allowed {
		t.Fatalf("behind 20 requests with a 20-request window: refused, at +%v", d.RetryAfter)
	}
	if d := h.Peek(t, "w", l, quota.Backlog{Requests: 21}); d.Allowed || d.RetryAfter != 100*time.Millisecond || d.Reason != quota.DimQPS {
		t.Fatalf("behind 21 requests: %+v, want refused for exactly 100ms on qps", d)
	}
	for _, mc := range quotatest.MeterCases() {
		t.Run(mc.Name, func(t *testing.T) {
			tenant := "b-" + mc.Name
			// A tenant already in debt past its window: every request waits.
			for h.Peek(t, tenant, mc.Lim, quota.Backlog{}).Allowed {
				h.Charge(t, tenant, mc.Lim, mc.Tokens)
			}
			const k = 7
			pred := h.Peek(t, tenant, mc.Lim, quota.Backlog{Requests: k, Tokens: k * mc.Tokens})
			if pred.Allowed || pred.Reason != mc.Dim {
				t.Fatalf("behind %d requests: allowed %v reason %q, want refused on %q", k, pred.Allowed, pred.Reason, mc.Dim)
			}
			for i := 0; i < k; i++ {
				d := h.Peek(t, tenant, mc.Lim, quota.Backlog{})
				h.Set(h.Ceil(d.At))
				if c := h.Charge(t, tenant, mc.Lim, mc.Tokens); !c.Allowed {
					t.Fatalf("request %d refused at its own earliest time", i)
				}
			}
			d := h.Peek(t, tenant, mc.Lim, quota.Backlog{})
			if diff := d.At.Sub(pred.At); diff < -k || diff > k {
				t.Fatalf("predicted %v, allowed at %v (%v apart)", pred.At, d.At, diff)
			}
			h.Set(h.Ceil(d.At))
			if !h.Peek(t, tenant, mc.Lim, quota.Backlog{}).Allowed {
				t.Fatal("not allowed at its earliest time")
			}
		})
	}
}

// reconcile is guarantee 6: extra debt is recorded from now, a partial
// refund moves the meters back by exactly the difference, and a refund
// larger than the debt leaves the tenant at rest, no credit beyond it, and
// forgotten by the store at once.
func reconcile(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quotatest.SeedCfg)
	fresh := h.Status(t, "a", l)
	// Extra debt of 20000 tokens on an unknown tenant: 6 s of tokens, 80 ms
	// (16 request-equivalents) of joint.
	st := h.Reconcile(t, "b", l, 0, 20000)
	if st.Tokens.Reset != 6*time.Second || st.Joint.Reset != 80*time.Millisecond || st.Requests.Reset != 0 {
		t.Errorf("extra debt of 20000 tokens: resets %v / %v / %v, want 6s / 80ms / 0", st.Tokens.Reset, st.Joint.Reset, st.Requests.Reset)
	}
	// Charge 1000 tokens (300 ms, joint 1.8 req-eq = 9 ms), refund 600.
	h.Charge(t, "a", l, 1000)
	st = h.Reconcile(t, "a", l, 1000, 400)
	if st.Tokens.Reset != 120*time.Millisecond || st.Joint.Reset != 6600*time.Microsecond || st.Requests.Reset != 5*time.Millisecond {
		t.Errorf("refund of 600 of 1000 tokens: resets %v / %v / %v, want 120ms / 6.6ms / 5ms", st.Tokens.Reset, st.Joint.Reset, st.Requests.Reset)
	}
	if st := h.Reconcile(t, "a", l, 400, 0); st.Tokens.Reset != 0 {
		t.Errorf("refund of the rest of the charge: token Reset %v, want 0", st.Tokens.Reset)
	}
	h.Reconcile(t, "a", l, 100000, 0)
	st2 := h.Reconcile(t, "a", l, 100000, 0)
	if st2.Tokens != fresh.Tokens || st2.Joint.Remaining != fresh.Joint.Remaining {
		t.Errorf("after refunds: %+v, want the fresh %+v (no credit beyond rest)", st2, fresh)
	}
	// A tokens-only tenant refunded back to rest is forgotten at once.
	tok := quota.MustCompile(quota.Config{TokensPerMin: 1000})
	before := h.Held()
	h.Charge(t, "t", tok, 100)
	if h.Held() != before+1 {
		t.Fatalf("a charged tenant is not held (%d, want %d)", h.Held(), before+1)
	}
	if st := h.Reconcile(t, "t", tok, 100, 0); st.Tokens.Reset != 0 || h.Held() != before {
		t.Errorf("refunded back to rest: Reset %v, %d tenants held, want 0 and %d", st.Tokens.Reset, h.Held(), before)
	}
}

// status: the header view (limits per minute, remaining back-to-back
// units, reset to rest), fresh, after ten requests, back at rest after
// Reset, and with a debt beyond the window.
func status(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quotatest.SeedCfg)
	want := quota.Status{
		// 2 s of window at 200/s, plus the request a debt of exactly tau
		// still admits.
		Requests: quota.MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
		Tokens:   quota.MeterStatus{Enabled: true, Limit: 200000, Remaining: 6666},
		Joint:    quota.MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
	}
	if st := h.Status(t, "a", l); st != want {
		t.Fatalf("fresh status %+v, want %+v", st, want)
	}
	var d quota.Decision
	for i := 0; i < 10; i++ {
		d = h.Charge(t, "a", l, 125) // 1.1 request-equivalents
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
	if st := h.Status(t, "a", l); st != d.Status {
		t.Errorf("Status %+v differs from the last decision's %+v on a still clock", st, d.Status)
	}
	// At now + the longest Reset the tenant is back at rest.
	h.Advance(d.Status.Tokens.Reset)
	if st := h.Status(t, "a", l); st != want {
		t.Errorf("after Reset: %+v, want the fresh %+v", st, want)
	}
	// A meter in debt beyond the window has nothing remaining.
	h.Charge(t, "a", l, 20000)
	st := h.Status(t, "a", l)
	if st.Tokens.Remaining != 0 || st.Tokens.Reset != 6*time.Second {
		t.Errorf("after 20000 tokens: %+v, want 0 remaining, reset 6s", st.Tokens)
	}
	if st.Meter("x") != (quota.MeterStatus{}) {
		t.Error("unknown dimension must have an empty status")
	}
}

// expiry is guarantee 7: 1000 tenants in debt (at most 999 tokens, 0.3 s)
// are all forgotten a minute later (Memory by its sweep, Redis by key
// expiry), a forgotten tenant decides as an unknown one, and a tenant in
// debt is kept.
func expiry(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quotatest.SeedCfg)
	for i := 0; i < 1000; i++ {
		h.Charge(t, quotatest.TenantName(i), l, int64(i))
	}
	if n := h.Held(); n != 1000 {
		t.Fatalf("held %d tenants, want 1000", n)
	}
	h.Charge(t, "big", l, 1_000_000) // 5 min of tokens
	h.Advance(quota.DefaultSweepEvery)
	h.Peek(t, "someone-else", l, quota.Backlog{})
	if n := h.Held(); n != 1 {
		t.Fatalf("a minute later %d tenants held, want 1 (only the one in debt)", n)
	}
	if a, b := h.Status(t, quotatest.TenantName(999), l), h.Status(t, "never-seen", l); a != b {
		t.Errorf("forgotten tenant %+v differs from an unknown one %+v", a, b)
	}
	if st := h.Status(t, "big", l); st.Tokens.Reset != 5*time.Minute-quota.DefaultSweepEvery {
		t.Errorf("tenant in debt: token Reset %v, want %v", st.Tokens.Reset, 5*time.Minute-quota.DefaultSweepEvery)
	}
}

// jointAtomic is guarantee 5 with the joint meter: one 20k-token request
// of a tenant at rest starts (tokens 6 s, joint 85 ms, qps 5 ms of debt);
// the next is refused on tokens, the meter whose earliest time is latest,
// for exactly 4 s (6 s of debt less the 2 s window), charged to no meter,
// and allowed 4 s later.
func jointAtomic(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quotatest.SeedCfg)
	if !h.Charge(t, "a", l, 20000).Allowed {
		t.Fatal("a request of a tenant at rest must start whatever its size")
	}
	before := h.Status(t, "a", l)
	if before.Joint.Reset != 85*time.Millisecond || before.Requests.Reset != 5*time.Millisecond {
		t.Fatalf("after 20000 tokens: joint %v, qps %v of debt, want 85ms, 5ms", before.Joint.Reset, before.Requests.Reset)
	}
	d := h.Charge(t, "a", l, 1)
	if d.Allowed || d.Reason != quota.DimTokens || d.RetryAfter != 4*time.Second {
		t.Fatalf("second request: %+v, want refused for tokens, retry 4s", d)
	}
	if d.Status != before {
		t.Errorf("a refused charge changed the meters: %+v -> %+v", before, d.Status)
	}
	// The joint meter binds alone: 1250 tokens are 2 request-equivalents
	// (10 ms each at 200/s), so its 2 s tolerance admits 200 + 1 requests
	// at once where qps would admit 401.
	lj := quota.MustCompile(quota.Config{QPS: 200, TokenToQPSWeight: 0.0008, JointCap: 1, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	n := 0
	for h.Charge(t, "j", lj, 1250).Allowed {
		n++
	}
	if n != 201 {
		t.Errorf("joint: %d requests of 2 request-equivalents admitted at once, want 201", n)
	}
	h.Advance(d.RetryAfter)
	if !h.Charge(t, "a", l, 1).Allowed {
		t.Error("refused at its earliest time")
	}
}

// metersOff: a meter that is off reports Enabled false and is neither
// tested nor charged; a reload that turns it on finds it at rest, and the
// meters charged before the reload keep their debt.
func metersOff(t *testing.T, h *quotatest.Harness) {
	qpsOnly := quota.MustCompile(quota.Config{QPS: 1})
	st := h.Status(t, "a", qpsOnly)
	if !st.Requests.Enabled || st.Tokens.Enabled || st.Joint.Enabled || st.Tokens != (quota.MeterStatus{}) {
		t.Fatalf("qps-only status %+v, want only requests enabled", st)
	}
	d := h.Charge(t, "a", qpsOnly, 1_000_000)
	if !d.Allowed || d.Status.Requests.Reset != time.Second {
		t.Fatalf("qps-only charge: %+v, want allowed with 1s of debt", d)
	}
	if d := h.Charge(t, "a", qpsOnly, 0); d.Allowed || d.Reason != quota.DimQPS || d.RetryAfter != time.Second {
		t.Fatalf("second qps-only request: %+v, want refused for 1s on qps (no burst window)", d)
	}
	// Reload to the seed's three meters: the million tokens were never
	// charged to the token meter.
	seed := quota.MustCompile(quotatest.SeedCfg)
	st = h.Status(t, "a", seed)
	if st.Tokens.Reset != 0 || st.Tokens.Remaining != 6666 || st.Joint.Reset != 0 || st.Requests.Reset != time.Second {
		t.Errorf("after reload: %+v, want tokens and joint at rest, requests 1s of debt", st)
	}
	if d := h.Charge(t, "a", seed, 10); !d.Allowed {
		t.Errorf("after reload with a 2s window: %+v, want allowed", d)
	}
	// Tokens only: requests are not counted.
	tok := quota.MustCompile(quota.Config{TokensPerMin: 60000, BurstWindow: time.Second, BurstAllow: 1}) // 1000 tokens/s, tau 1 s
	for i := 0; i < 2000; i++ {
		if !h.Charge(t, "t", tok, 0).Allowed {
			t.Fatalf("tokens-only: request %d of 0 tokens refused", i)
		}
	}
	if !h.Charge(t, "t", tok, 1000).Allowed || !h.Charge(t, "t", tok, 1).Allowed || h.Charge(t, "t", tok, 1).Allowed {
		t.Error("tokens-only: want 1000 then 1 allowed (debt exactly tau), the next refused")
	}
}

// concurrent: 8 goroutines charge, peek, reconcile and read shared tenants
// at once on a still clock (4 tenants and every call each time; on a
// Remote store 2 tenants, reads one time in 4): each tenant at rest admits
// exactly floor(tau/T) + 1 = 401 requests at 200 qps with a 2 s window,
// whatever the interleaving, and one second later exactly 200 more.
func concurrent(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quota.Config{QPS: 200, TokensPerMin: 1e9, TokenToQPSWeight: 1e-6, JointCap: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	tenants, calls, readEvery := []string{"a", "b", "c", "d"}, 600, 1
	if h.Remote {
		tenants, calls, readEvery = tenants[:2], 130, 4 // 520 attempts per tenant
	}
	round := func() map[string]int {
		var mu sync.Mutex
		got := map[string]int{}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				for i := 0; i < calls; i++ {
					tn := tenants[(g+i)%len(tenants)]
					d, err := h.Store.Charge(bg, tn, l, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						got[tn]++
						mu.Unlock()
						// A no-op reconcile, racing the charges.
						if _, err := h.Store.Reconcile(bg, tn, l, 10, 10); err != nil {
							t.Error(err)
						}
					}
					if i%readEvery == 0 {
						ahead := quota.Backlog{Requests: int64(i / readEvery % 2)} // none, then one
						if _, err := h.Store.Peek(bg, tn, l, ahead); err != nil {
							t.Error(err)
						}
						if _, err := h.Store.Status(bg, tn, l); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		wg.Wait()
		return got
	}
	for _, tc := range []struct {
		advance time.Duration
		want    int
	}{{0, 401}, {time.Second, 200}} {
		h.Advance(tc.advance)
		got := round()
		for _, tn := range tenants {
			if got[tn] != tc.want {
				t.Errorf("after +%v: tenant %s admitted %d, want exactly %d", tc.advance, tn, got[tn], tc.want)
			}
		}
	}
}

// refund: a refund takes a whole charge back on every meter, the request
// included, and never below rest.
func refund(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quotatest.SeedCfg)
	for i := 0; i < 3; i++ {
		h.Charge(t, "a", l, 1000)
	}
	before := h.Status(t, "a", l)
	h.Charge(t, "a", l, 1000)
	st, err := h.Store.Refund(bg, "a", l, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if st != before {
		t.Fatalf("after charge + refund: %+v, want the status before the charge %+v", st, before)
	}
	for i := 0; i < 5; i++ {
		if st, err = h.Store.Refund(bg, "a", l, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if st.Requests.Reset != 0 || st.Tokens.Reset != 0 || st.Joint.Reset != 0 {
		t.Fatalf("refunds past the charges: %+v, want at rest", st)
	}
	if d := h.Charge(t, "a", l, 1000); !d.Allowed {
		t.Fatal("refused at rest")
	}
}

// book: bookings made at one instant by callers anywhere get the tenant's
// successive earliest times, first come, first served, each exactly the
// time a charge would have been allowed at had the requests before it been
// charged as each started; a booking past maxWait charges nothing and says
// when it could; a refund frees the last place for the next booking; the
// binding meter is named.
func book(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quota.Config{QPS: 10, BurstWindow: time.Second, BurstAllow: 0.2}) // 100 ms a request, tau 200 ms
	book := func(maxWait time.Duration) quota.Decision {
		t.Helper()
		d, err := h.Store.Book(bg, "b", l, 1, maxWait, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	start := h.Now()
	// The burst (tau 200 ms: three requests at once), then 100 ms apart.
	for i, ms := range []time.Duration{0, 0, 0, 100, 200, 300} {
		want := ms * time.Millisecond
		d := book(time.Second)
		if !d.Allowed || !d.At.Equal(start.Add(want)) || d.RetryAfter != want {
			t.Fatalf("booking %d: %+v, want booked at +%v", i, d, want)
		}
		if reason := quota.Dimension(""); want > 0 && d.Reason != quota.DimQPS || want == 0 && d.Reason != reason {
			t.Fatalf("booking %d: reason %q", i, d.Reason)
		}
	}
	// The next place is at +400 ms: not within 350 ms, nothing charged.
	if d := book(350 * time.Millisecond); d.Allowed || !d.At.Equal(start.Add(400*time.Millisecond)) || d.Reason != quota.DimQPS {
		t.Fatalf("past maxWait: %+v, want refused, At +400ms", d)
	}
	if d := h.Peek(t, "b", l, quota.Backlog{}); !d.At.Equal(start.Add(400 * time.Millisecond)) {
		t.Fatalf("a refused booking charged: the next time is %v, want +400ms", d.At.Sub(start))
	}
	// A refund gives the last place back.
	if _, err := h.Store.Refund(bg, "b", l, 1); err != nil {
		t.Fatal(err)
	}
	if d := book(350 * time.Millisecond); !d.Allowed || !d.At.Equal(start.Add(300*time.Millisecond)) {
		t.Fatalf("after a refund: %+v, want booked at +300ms", d)
	}
	// Booked as of its time: at +300 ms the charge is in the past; a
	// request at the time of the last booking is refused until +400 ms, as
	// it would be had each booked request been charged as it started.
	h.Set(h.Ceil(start.Add(300 * time.Millisecond)))
	if d := h.Charge(t, "b", l, 1); d.Allowed || !d.At.Equal(start.Add(400*time.Millisecond)) {
		t.Fatalf("charge at +300ms: %+v, want refused until +400ms", d)
	}
	// maxWait 0 is Charge.
	if d := book(0); d.Allowed {
		t.Fatalf("book(0) allowed while Charge refuses: %+v", d)
	}
}

// bookLead: the longest lead any caller gave for a tenant shortens every
// caller's horizon, for LeadMemory while the tenant stays in debt: a
// caller giving no lead books to the same horizon as one that gave 300 ms
// a moment ago; a lead older than LeadMemory, or one the tenant came to
// rest since, counts no more.
func bookLead(t *testing.T, h *quotatest.Harness) {
	l := quota.MustCompile(quota.Config{QPS: 10}) // 100 ms a request, no burst
	book := func(maxWait, lead time.Duration) quota.Decision {
		t.Helper()
		d, err := h.Store.Book(bg, "c", l, 1, maxWait, lead)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	start := h.Now()
	for i := range 5 { // booked at +0 .. +400 ms
		if d := book(time.Second, 0); !d.Allowed || d.RetryAfter != time.Duration(i)*100*time.Millisecond {
			t.Fatalf("booking %d: %+v", i, d)
		}
	}
	// The next place is +500 ms: within 600 ms, but not within 600 ms less
	// a lead of 300 ms, given by this call...
	if d := book(600*time.Millisecond, 300*time.Millisecond); d.Allowed {
		t.Fatalf("with a lead of 300ms: %+v, want refused (+500ms > 600ms - 300ms)", d)
	}
	// ... nor by another caller's a moment ago.
	if d := book(600*time.Millisecond, 0); d.Allowed {
		t.Fatalf("after another caller's lead of 300ms: %+v, want refused", d)
	}
	if d := book(800*time.Millisecond, 0); !d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("within 800ms less the lead: %+v, want booked at +500ms", d)
	}
	// A minute later (the tenant still in debt: a booking a minute
	// ahead), the lead has lapsed.
	for i := 0; i < 600; i++ {
		book(time.Hour, 0)
	}
	h.Set(h.Ceil(start.Add(quota.LeadMemory + time.Millisecond)))
	d := h.Peek(t, "c", l, quota.Backlog{})
	if d.Allowed {
		t.Fatal("test setup: the tenant is at rest")
	}
	if b := book(d.RetryAfter, 0); !b.Allowed || b.RetryAfter != d.RetryAfter {
		t.Fatalf("a minute after the lead was given: %+v, want booked at its earliest time %v", b, d.RetryAfter)
	}
	// A lead given, then the tenant at rest: forgotten by the next write.
	if d := book(time.Hour, 10*time.Second); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	h.Set(h.Ceil(h.Now().Add(time.Hour)))
	if d := book(0, 0); !d.Allowed || d.RetryAfter != 0 {
		t.Fatalf("at rest: %+v", d)
	}
	if d := book(150*time.Millisecond, 0); !d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("after the tenant came to rest: %+v, want the old lead forgotten: booked at +100ms", d)
	}
}

// longRunRate is guarantee 1: a greedy tenant, always with a request ready
// and retrying at the earliest time it is given, is charged each meter's
// rate within 1% over 10 virtual minutes; an open-loop tenant sending
// Poisson arrivals at 1.5x the rate is too. Neither exceeds the bound
// r x (D + tau) + c_max.
func longRunRate(t *testing.T, h *quotatest.Harness) {
	skipRemote(t, h)
	const D = 10 * time.Minute
	for _, mc := range quotatest.MeterCases() {
		t.Run(mc.Name+"/greedy", func(t *testing.T) {
			start, tn := h.Now(), "greedy-"+mc.Name
			var units float64
			for {
				d := h.Peek(t, tn, mc.Lim, quota.Backlog{})
				if !d.Allowed {
					if d.Reason != mc.Dim {
						t.Fatalf("refused for %q, want %q", d.Reason, mc.Dim)
					}
					if d.At.Sub(start) > D {
						break
					}
					h.Set(h.Ceil(d.At))
				}
				if c := h.Charge(t, tn, mc.Lim, mc.Tokens); !c.Allowed {
					t.Fatalf("at %v: refused at the earliest time Peek gave", h.Now().Sub(start))
				}
				units += mc.Units
			}
			checkRate(t, units, mc, D)
		})
		t.Run(mc.Name+"/poisson-1.5x", func(t *testing.T) {
			start, tn := h.Now(), "poisson-"+mc.Name
			rng := rand.New(rand.NewPCG(1, 2))
			reqRate := 1.5 * mc.Rate / mc.Units
			var units float64
			at := time.Duration(0)
			for {
				at += time.Duration(rng.ExpFloat64() / reqRate * 1e9)
				if at > D {
					break
				}
				h.Set(h.Ceil(start.Add(at)))
				if h.Charge(t, tn, mc.Lim, mc.Tokens).Allowed {
					units += mc.Units
				}
			}
			checkRate(t, units, mc, D)
		})
	}
}

func checkRate(t *testing.T, units float64, mc quotatest.MeterCase, d time.Duration) {
	t.Helper()
	got := units / d.Seconds()
	if !within(got, mc.Rate, 0.01) {
		t.Errorf("long-run rate %.2f units/s, want %.2f within 1%%", got, mc.Rate)
	}
	bound := mc.Rate*(d.Seconds()+mc.Lim.Tolerance().Seconds()) + mc.Units
	if units > bound+1e-9 {
		t.Errorf("charged %.0f units in %v, above the bound r x (D + tau) + c_max = %.0f", units, d, bound)
	}
	t.Logf("%s: %.2f units/s for a limit of %.2f (%.3f%%)", mc.Name, got, mc.Rate, 100*(got/mc.Rate-1))
}

// reconcileConverges is guarantee 6 in the long run: a greedy tenant whose
// estimates are half, twice, or a random 0.25..4x its actual 100..1500
// tokens (so that a refund, at most 4200 tokens = 1.26 s, stays within the
// 2 s window), reconciled four requests after dispatch, uses the token and
// joint rates within 1% over 10 virtual minutes, measured in actual tokens.
func reconcileConverges(t *testing.T, h *quotatest.Harness) {
	skipRemote(t, h)
	const D = 10 * time.Minute
	for _, tc := range []struct {
		name string
		dim  quota.Dimension
		cfg  quota.Config
		rate float64 // meter units per second
	}{
		{"tokens", quota.DimTokens, quota.Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2}, 200000.0 / 60},
		{"joint", quota.DimJoint, quota.Config{QPS: 200, TokenToQPSWeight: 0.0008, JointCap: 1, BurstWindow: 10 * time.Second, BurstAllow: 0.2}, 200},
	} {
		l := quota.MustCompile(tc.cfg)
		for _, est := range []struct {
			name string
			f    func(r *rand.Rand) float64
		}{
			{"under-0.5x", func(*rand.Rand) float64 { return 0.5 }},
			{"over-2x", func(*rand.Rand) float64 { return 2 }},
			{"random-0.25..4x", func(r *rand.Rand) float64 { return math.Pow(2, -2+4*r.Float64()) }},
		} {
			t.Run(tc.name+"/"+est.name, func(t *testing.T) {
				start, tn := h.Now(), tc.name+"/"+est.name
				rng := rand.New(rand.NewPCG(5, 6))
				type req struct{ est, act int64 }
				var inflight []req
				var used float64 // actual units on the meter
				for {
					d := h.Peek(t, tn, l, quota.Backlog{})
					if !d.Allowed {
						if d.At.Sub(start) > D {
							break
						}
						h.Set(h.Ceil(d.At))
					}
					act := int64(100 + rng.IntN(1400))
					r := req{est: int64(math.Round(float64(act) * est.f(rng))), act: act}
					if !h.Charge(t, tn, l, r.est).Allowed {
						t.Fatal("refused at the earliest time")
					}
					inflight = append(inflight, r)
					if len(inflight) > 4 {
						done := inflight[0]
						inflight = inflight[1:]
						h.Reconcile(t, tn, l, done.est, done.act)
						if tc.dim == quota.DimTokens {
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

// reconcileLargeOverestimate: when a refund exceeds the debt at completion
// (20k-token estimates that use 2k, on a 2 s window of 6666 tokens), the
// tenant is held below its rate, never above. The tenant sends whenever
// its quota allows, any number in flight, each running 1 s.
func reconcileLargeOverestimate(t *testing.T, h *quotatest.Harness) {
	skipRemote(t, h)
	const D = 10 * time.Minute
	l := quota.MustCompile(quota.Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	start := h.Now()
	var done []time.Time // completion times, in order (fixed latency)
	var used float64
	for h.Now().Sub(start) <= D {
		d := h.Peek(t, "a", l, quota.Backlog{})
		if d.Allowed {
			if !h.Charge(t, "a", l, 20000).Allowed {
				t.Fatal("refused right after an allowing Peek")
			}
			done = append(done, h.Now().Add(time.Second))
			continue
		}
		next := d.At
		if len(done) > 0 && done[0].Before(next) {
			next = done[0]
		}
		h.Set(h.Ceil(next))
		for len(done) > 0 && !done[0].After(next) {
			done = done[1:]
			h.Reconcile(t, "a", l, 20000, 2000)
			used += 2000
		}
	}
	got, rate := used/D.Seconds(), 200000.0/60
	if got > rate {
		t.Errorf("actual usage %.1f tokens/s above the rate %.1f", got, rate)
	}
	t.Logf("actual usage %.1f tokens/s for a limit of %.1f (held below by its estimates)", got, rate)
}
