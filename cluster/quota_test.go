package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// storeHarness is one Store on a virtual clock, for the test table that runs
// against both Memory and Redis (on miniredis, whose TIME follows SetTime
// and whose TTLs, with ClockTTL, run on the same clock).
type storeHarness struct {
	name  string
	store quota.Store
	// res is the resolution of the store's clock: 1 ns for Memory, 1 us
	// for Redis, whose TIME gives microseconds.
	res  time.Duration
	now  func() time.Time
	set  func(time.Time)
	held func() int // tenants the store keeps
}

func (h *storeHarness) advance(d time.Duration) { h.set(h.now().Add(d)) }

// ceil is the first instant the store's clock can show at or after t.
func (h *storeHarness) ceil(t time.Time) time.Time {
	if c := t.Truncate(h.res); c.Before(t) {
		return c.Add(h.res)
	}
	return t
}

// before is the last instant the store's clock can show before t.
func (h *storeHarness) before(t time.Time) time.Time { return t.Add(-1).Truncate(h.res) }

func (h *storeHarness) peek(t testing.TB, tenant string, l *quota.Limits, ahead quota.Backlog) quota.Decision {
	t.Helper()
	d, err := h.store.Peek(bg, tenant, l, ahead)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (h *storeHarness) charge(t testing.TB, tenant string, l *quota.Limits, tokens int64) quota.Decision {
	t.Helper()
	d, err := h.store.Charge(bg, tenant, l, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (h *storeHarness) reconcile(t testing.TB, tenant string, l *quota.Limits, est, act int64) quota.Status {
	t.Helper()
	s, err := h.store.Reconcile(bg, tenant, l, est, act)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (h *storeHarness) status(t testing.TB, tenant string, l *quota.Limits) quota.Status {
	t.Helper()
	s, err := h.store.Status(bg, tenant, l)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMemoryHarness() *storeHarness {
	clk := newVclock()
	m := quota.NewMemory(clk.Now)
	return &storeHarness{name: "memory", store: m, res: time.Nanosecond, now: clk.Now, set: clk.Set, held: m.Len}
}

// newMiniredis starts a miniredis whose TIME and TTLs follow its SetTime
// clock, set to epoch0, and a client on it without retries.
func newMiniredis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	mr := miniredis.RunT(t)
	mr.SetTime(epoch0)
	mr.ClockTTL(true)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return mr, c
}

func newRedisHarness(t testing.TB) (*storeHarness, *QuotaStore, *miniredis.Miniredis) {
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, DefaultPrefix, 0)
	clk := newVclock()
	set := func(at time.Time) {
		clk.Set(at)
		mr.SetTime(at)
	}
	held := func() int { return len(mr.Keys()) }
	return &storeHarness{name: "redis", store: r, res: time.Microsecond, now: clk.Now, set: set, held: held}, r, mr
}

// TestStoreTable runs each case against Memory and against Redis on
// miniredis: the same assertions hold for both stores.
func TestStoreTable(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, h *storeHarness)
	}{
		{"earliest-time-exact", tableEarliestTime},
		{"burst-window", tableBurstWindow},
		{"backlog-peek", tableBacklog},
		{"reconcile", tableReconcile},
		{"status", tableStatus},
		{"expiry", tableExpiry},
		{"joint-atomic", tableJointAtomic},
		{"meters-off-and-reload", tableMetersOff},
		{"concurrent-frozen-clock", tableConcurrent},
		{"refund", tableRefund},
		{"book", tableBook},
		{"book-lead", tableBookLead},
	}
	for _, tc := range cases {
		t.Run(tc.name+"/memory", func(t *testing.T) { tc.run(t, newMemoryHarness()) })
		t.Run(tc.name+"/redis", func(t *testing.T) {
			h, _, _ := newRedisHarness(t)
			tc.run(t, h)
		})
	}
}

// tableEarliestTime is guarantee 4 on random traffic against the seed's
// three meters and each single meter: a refused request's RetryAfter is
// At - now; at the last instant the store's clock can show before At
// (1 ns before on Memory, the microsecond before on Redis) it is refused
// with the same At and reason, and at the first instant at or after At
// (At itself on Memory) it is allowed. Every dimension is seen binding.
func tableEarliestTime(t *testing.T, h *storeHarness) {
	reasons := map[quota.Dimension]int{}
	limits := []*quota.Limits{
		quota.MustCompile(seedCfg),
		// A 50 ms window, which the traffic's 11% excess over 200 qps
		// exhausts in half a second.
		quota.MustCompile(quota.Config{QPS: 200, BurstWindow: time.Second, BurstAllow: 0.05}),
		// Joint binds: 3 request-equivalents a request on average, 100
		// a second.
		quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1, BurstWindow: time.Second, BurstAllow: 0.05}),
	}
	for _, mc := range meterCases() {
		limits = append(limits, mc.lim)
	}
	for li, l := range limits {
		tenant := "a" + strconv.Itoa(li)
		rng := rand.New(rand.NewPCG(3, uint64(li)))
		for i := 0; i < 600; i++ {
			h.advance(time.Duration(rng.IntN(10)) * time.Millisecond)
			tokens := int64(rng.IntN(400))
			if rng.IntN(50) == 0 {
				tokens = 20000
			}
			d := h.charge(t, tenant, l, tokens)
			if d.Allowed {
				if d.Reason != "" || d.RetryAfter != 0 || !d.At.Equal(h.now()) {
					t.Fatalf("allowed with reason %q, retry %v, at %v (now %v)", d.Reason, d.RetryAfter, d.At, h.now())
				}
				continue
			}
			reasons[d.Reason]++
			if d.RetryAfter != d.At.Sub(h.now()) || d.RetryAfter <= 0 {
				t.Fatalf("RetryAfter %v does not match At - now %v", d.RetryAfter, d.At.Sub(h.now()))
			}
			h.set(h.before(d.At))
			if p := h.peek(t, tenant, l, quota.Backlog{}); p.Allowed || p.Reason != d.Reason || !p.At.Equal(d.At) {
				t.Fatalf("%v before At: %+v, want refused for %q with the same At %v", d.At.Sub(h.now()), p, d.Reason, d.At)
			}
			h.set(h.ceil(d.At))
			if c := h.charge(t, tenant, l, tokens); !c.Allowed {
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

// sendAtH offers requests of mc at mult x the meter's rate from start for
// dur (both ends included), each arrival on the store's clock resolution,
// and returns how many were offered and allowed, the first refused arrival
// and the last allowed one (-1 when none), as offsets from epoch0.
func sendAtH(t *testing.T, h *storeHarness, tenant string, mc meterCase, mult float64, start, dur time.Duration) (offered, allowed int, firstRefused, lastAllowed time.Duration) {
	t.Helper()
	spacing := 1e9 * mc.units / (mult * mc.rate)
	firstRefused, lastAllowed = -1, -1
	for k := 0; ; k++ {
		off := time.Duration(math.Round(float64(k)*spacing/float64(h.res))) * h.res
		if off > dur {
			return
		}
		h.set(epoch0.Add(start + off))
		offered++
		if h.charge(t, tenant, mc.lim, mc.tokens).Allowed {
			allowed++
			lastAllowed = start + off
		} else if firstRefused < 0 {
			firstRefused = start + off
		}
	}
}

// tableBurstWindow is guarantees 2 and 3 on each meter with the seed's
// window (1.2x for 10 s): at rest, 1.2x for 10 s is served in full; then,
// at 2x for 5 s, the first arrival after the window is refused and the
// tenant is served its rate within one request; Reset later it is at rest.
func tableBurstWindow(t *testing.T, h *storeHarness) {
	const (
		W    = 10 * time.Second
		hold = 5 * time.Second
	)
	for _, mc := range meterCases() {
		t.Run(mc.name, func(t *testing.T) {
			start := h.now().Sub(epoch0)
			tn := "burst-" + mc.name
			fresh := h.status(t, tn, mc.lim)
			offered, allowed, refused, _ := sendAtH(t, h, tn, mc, 1.2, start, W)
			if allowed != offered || refused >= 0 {
				t.Fatalf("burst at 1.2x for %v: %d of %d served (first refusal at %v), want all", W, allowed, offered, refused)
			}
			spacing := time.Duration(1e9 * mc.units / (2 * mc.rate)).Truncate(h.res)
			_, allowed, refused, _ = sendAtH(t, h, tn, mc, 2, start+W+spacing, hold-spacing)
			if refused != start+W+spacing {
				t.Errorf("held at 2x: first refusal at %v, want the first arrival after the window, %v", refused-start, W+spacing)
			}
			want := mc.rate * hold.Seconds() / mc.units
			if math.Abs(float64(allowed)-want) > 1 {
				t.Errorf("held at 2x for %v: %d requests served, want the rate's %.1f within one", hold, allowed, want)
			}
			st := h.status(t, tn, mc.lim)
			h.advance(st.Meter(mc.dim).Reset)
			if st := h.status(t, tn, mc.lim); st != fresh {
				t.Errorf("after Reset: %+v, want the fresh %+v", st, fresh)
			}
		})
	}
}

// tableBacklog: Peek behind a backlog predicts, within k/2 ns of rounding,
// when the request is allowed after the k ahead are charged at their own
// earliest times; a backlog the window absorbs leaves it allowed now.
func tableBacklog(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(quota.Config{QPS: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2}) // tau 2 s: 20 requests
	if d := h.peek(t, "w", l, quota.Backlog{Requests: 20}); !d.Allowed {
		t.Fatalf("behind 20 requests with a 20-request window: refused, at +%v", d.RetryAfter)
	}
	if d := h.peek(t, "w", l, quota.Backlog{Requests: 21}); d.Allowed || d.RetryAfter != 100*time.Millisecond || d.Reason != quota.DimQPS {
		t.Fatalf("behind 21 requests: %+v, want refused for exactly 100ms on qps", d)
	}
	for _, mc := range meterCases() {
		t.Run(mc.name, func(t *testing.T) {
			tenant := "b-" + mc.name
			for h.peek(t, tenant, mc.lim, quota.Backlog{}).Allowed {
				h.charge(t, tenant, mc.lim, mc.tokens)
			}
			const k = 7
			pred := h.peek(t, tenant, mc.lim, quota.Backlog{Requests: k, Tokens: k * mc.tokens})
			if pred.Allowed || pred.Reason != mc.dim {
				t.Fatalf("behind %d requests: allowed %v reason %q, want refused on %q", k, pred.Allowed, pred.Reason, mc.dim)
			}
			for i := 0; i < k; i++ {
				d := h.peek(t, tenant, mc.lim, quota.Backlog{})
				h.set(h.ceil(d.At))
				if c := h.charge(t, tenant, mc.lim, mc.tokens); !c.Allowed {
					t.Fatalf("request %d refused at its own earliest time", i)
				}
			}
			d := h.peek(t, tenant, mc.lim, quota.Backlog{})
			if diff := d.At.Sub(pred.At); diff < -k || diff > k {
				t.Fatalf("predicted %v, allowed at %v (%v apart)", pred.At, d.At, diff)
			}
		})
	}
}

// tableReconcile is guarantee 6: extra debt is recorded from now, a partial
// refund moves the meters back by exactly the difference, and a refund
// larger than the debt leaves the tenant at rest, no credit beyond it, and
// forgotten by the store at once.
func tableReconcile(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(seedCfg)
	fresh := h.status(t, "a", l)
	// Extra debt of 20000 tokens on an unknown tenant: 6 s of tokens, 80 ms
	// (16 request-equivalents) of joint.
	st := h.reconcile(t, "b", l, 0, 20000)
	if st.Tokens.Reset != 6*time.Second || st.Joint.Reset != 80*time.Millisecond || st.Requests.Reset != 0 {
		t.Errorf("extra debt of 20000 tokens: resets %v / %v / %v, want 6s / 80ms / 0", st.Tokens.Reset, st.Joint.Reset, st.Requests.Reset)
	}
	// Charge 1000 tokens (300 ms, joint 1.8 req-eq = 9 ms), refund 600.
	h.charge(t, "a", l, 1000)
	st = h.reconcile(t, "a", l, 1000, 400)
	if st.Tokens.Reset != 120*time.Millisecond || st.Joint.Reset != 6600*time.Microsecond || st.Requests.Reset != 5*time.Millisecond {
		t.Errorf("refund of 600 of 1000 tokens: resets %v / %v / %v, want 120ms / 6.6ms / 5ms", st.Tokens.Reset, st.Joint.Reset, st.Requests.Reset)
	}
	h.reconcile(t, "a", l, 100000, 0)
	st2 := h.reconcile(t, "a", l, 100000, 0)
	if st2.Tokens != fresh.Tokens || st2.Joint.Remaining != fresh.Joint.Remaining {
		t.Errorf("after refunds: %+v, want the fresh %+v (no credit beyond rest)", st2, fresh)
	}
	// A tokens-only tenant refunded back to rest is forgotten at once.
	tok := quota.MustCompile(quota.Config{TokensPerMin: 1000})
	before := h.held()
	h.charge(t, "t", tok, 100)
	if h.held() != before+1 {
		t.Fatalf("a charged tenant is not held (%d, want %d)", h.held(), before+1)
	}
	if st := h.reconcile(t, "t", tok, 100, 0); st.Tokens.Reset != 0 || h.held() != before {
		t.Errorf("refunded back to rest: Reset %v, %d tenants held, want 0 and %d", st.Tokens.Reset, h.held(), before)
	}
}

// tableStatus: the header view, fresh, after ten requests, back at rest
// after Reset, and with a debt beyond the window.
func tableStatus(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(seedCfg)
	want := quota.Status{
		Requests: quota.MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
		Tokens:   quota.MeterStatus{Enabled: true, Limit: 200000, Remaining: 6666},
		Joint:    quota.MeterStatus{Enabled: true, Limit: 12000, Remaining: 401},
	}
	if st := h.status(t, "a", l); st != want {
		t.Fatalf("fresh status %+v, want %+v", st, want)
	}
	var d quota.Decision
	for i := 0; i < 10; i++ {
		d = h.charge(t, "a", l, 125)
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
	if st := h.status(t, "a", l); st != d.Status {
		t.Errorf("Status %+v differs from the last decision's %+v on a still clock", st, d.Status)
	}
	h.advance(d.Status.Tokens.Reset)
	if st := h.status(t, "a", l); st != want {
		t.Errorf("after Reset: %+v, want the fresh %+v", st, want)
	}
	h.charge(t, "a", l, 20000)
	if st := h.status(t, "a", l); st.Tokens.Remaining != 0 || st.Tokens.Reset != 6*time.Second {
		t.Errorf("after 20000 tokens: %+v, want 0 remaining, reset 6s", st.Tokens)
	}
}

// tableExpiry is guarantee 7: 1000 tenants in debt (at most 999 tokens,
// 0.3 s) are all forgotten a minute later (Memory by its sweep, Redis by key
// expiry), a forgotten tenant decides as an unknown one, and a tenant in
// debt is kept.
func tableExpiry(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(seedCfg)
	for i := 0; i < 1000; i++ {
		h.charge(t, tenantName(i), l, int64(i))
	}
	if n := h.held(); n != 1000 {
		t.Fatalf("held %d tenants, want 1000", n)
	}
	h.charge(t, "big", l, 1_000_000) // 5 min of tokens
	h.advance(quota.DefaultSweepEvery)
	h.peek(t, "someone-else", l, quota.Backlog{})
	if n := h.held(); n != 1 {
		t.Fatalf("a minute later %d tenants held, want 1 (only the one in debt)", n)
	}
	if a, b := h.status(t, tenantName(999), l), h.status(t, "never-seen", l); a != b {
		t.Errorf("forgotten tenant %+v differs from an unknown one %+v", a, b)
	}
	if st := h.status(t, "big", l); st.Tokens.Reset != 5*time.Minute-quota.DefaultSweepEvery {
		t.Errorf("tenant in debt: token Reset %v, want %v", st.Tokens.Reset, 5*time.Minute-quota.DefaultSweepEvery)
	}
}

// tableJointAtomic is guarantee 5 with the joint meter: one 20k-token
// request of a tenant at rest starts (tokens 6 s, joint 85 ms, qps 5 ms of
// debt); the next is refused on tokens for exactly 4 s, charged to no
// meter, and allowed 4 s later.
func tableJointAtomic(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(seedCfg)
	if !h.charge(t, "a", l, 20000).Allowed {
		t.Fatal("a request of a tenant at rest must start whatever its size")
	}
	before := h.status(t, "a", l)
	if before.Joint.Reset != 85*time.Millisecond || before.Requests.Reset != 5*time.Millisecond {
		t.Fatalf("after 20000 tokens: joint %v, qps %v of debt, want 85ms, 5ms", before.Joint.Reset, before.Requests.Reset)
	}
	d := h.charge(t, "a", l, 1)
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
	for h.charge(t, "j", lj, 1250).Allowed {
		n++
	}
	if n != 201 {
		t.Errorf("joint: %d requests of 2 request-equivalents admitted at once, want 201", n)
	}
	h.advance(d.RetryAfter)
	if !h.charge(t, "a", l, 1).Allowed {
		t.Error("refused at its earliest time")
	}
}

// tableMetersOff: a meter that is off reports Enabled false and is neither
// tested nor charged; a reload that turns it on finds it at rest, and the
// meters charged before the reload keep their debt.
func tableMetersOff(t *testing.T, h *storeHarness) {
	qpsOnly := quota.MustCompile(quota.Config{QPS: 1})
	st := h.status(t, "a", qpsOnly)
	if !st.Requests.Enabled || st.Tokens.Enabled || st.Joint.Enabled || st.Tokens != (quota.MeterStatus{}) {
		t.Fatalf("qps-only status %+v, want only requests enabled", st)
	}
	d := h.charge(t, "a", qpsOnly, 1_000_000)
	if !d.Allowed || d.Status.Requests.Reset != time.Second {
		t.Fatalf("qps-only charge: %+v, want allowed with 1s of debt", d)
	}
	if d := h.charge(t, "a", qpsOnly, 0); d.Allowed || d.Reason != quota.DimQPS || d.RetryAfter != time.Second {
		t.Fatalf("second qps-only request: %+v, want refused for 1s on qps (no burst window)", d)
	}
	// Reload to the seed's three meters: the million tokens were never
	// charged to the token meter.
	seed := quota.MustCompile(seedCfg)
	st = h.status(t, "a", seed)
	if st.Tokens.Reset != 0 || st.Tokens.Remaining != 6666 || st.Joint.Reset != 0 || st.Requests.Reset != time.Second {
		t.Errorf("after reload: %+v, want tokens and joint at rest, requests 1s of debt", st)
	}
	if d := h.charge(t, "a", seed, 10); !d.Allowed {
		t.Errorf("after reload with a 2s window: %+v, want allowed", d)
	}
	// Tokens only: requests are not counted.
	tok := quota.MustCompile(quota.Config{TokensPerMin: 60000, BurstWindow: time.Second, BurstAllow: 1}) // 1000 tokens/s, tau 1 s
	for i := 0; i < 2000; i++ {
		if !h.charge(t, "t", tok, 0).Allowed {
			t.Fatalf("tokens-only: request %d of 0 tokens refused", i)
		}
	}
	if !h.charge(t, "t", tok, 1000).Allowed || !h.charge(t, "t", tok, 1).Allowed || h.charge(t, "t", tok, 1).Allowed {
		t.Error("tokens-only: want 1000 then 1 allowed (debt exactly tau), the next refused")
	}
}

// tableConcurrent: 8 goroutines charge, peek, reconcile and read 2 tenants
// at once on a still clock: each tenant at rest admits exactly
// floor(tau/T) + 1 = 401 requests at 200 qps with a 2 s window, whatever
// the interleaving, and one second later exactly 200 more.
func tableConcurrent(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(quota.Config{QPS: 200, TokensPerMin: 1e9, TokenToQPSWeight: 1e-6, JointCap: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2})
	tenants := []string{"a", "b"}
	round := func() map[string]int {
		var mu sync.Mutex
		got := map[string]int{}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				for i := 0; i < 130; i++ { // 520 attempts per tenant
					tn := tenants[(g+i)%len(tenants)]
					d, err := h.store.Charge(bg, tn, l, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						got[tn]++
						mu.Unlock()
						if _, err := h.store.Reconcile(bg, tn, l, 10, 10); err != nil {
							t.Error(err)
						}
					}
					if i%4 == 0 {
						if _, err := h.store.Peek(bg, tn, l, quota.Backlog{Requests: 1}); err != nil {
							t.Error(err)
						}
						if _, err := h.store.Status(bg, tn, l); err != nil {
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
		h.advance(tc.advance)
		got := round()
		for _, tn := range tenants {
			if got[tn] != tc.want {
				t.Errorf("after +%v: tenant %s admitted %d, want exactly %d", tc.advance, tn, got[tn], tc.want)
			}
		}
	}
}

// diffLimits are the configurations of the differential tests: the seed's,
// each single meter, fractional intervals (3 qps: 333333333.3 ns per
// request), extreme rates, and last a slow one whose charges exceed 2^53 ns
// (104 days) or hit the cap of 2^60 ns, where float arithmetic on
// nanoseconds would not be exact.
func diffLimits() []*quota.Limits {
	ls := []*quota.Limits{
		quota.MustCompile(seedCfg),
		quota.MustCompile(quota.Config{QPS: 3, TokensPerMin: 7000, TokenToQPSWeight: 0.0013, JointCap: 0.7, BurstWindow: 3 * time.Second, BurstAllow: 0.37}),
		quota.MustCompile(quota.Config{TokensPerMin: 1e13}),
		quota.MustCompile(quota.Config{QPS: 1e9}),
		// Joint binds: a 1000-token request is 11 request-equivalents of
		// 100 per second, no burst.
		quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1}),
	}
	for _, mc := range meterCases() {
		ls = append(ls, mc.lim)
	}
	return append(ls, quota.MustCompile(quota.Config{QPS: 1e-6, TokensPerMin: 6e-5, BurstWindow: 24 * time.Hour, BurstAllow: 100}))
}

// sameDecision compares two decisions field by field (At as an instant).
func sameDecision(a, b quota.Decision) bool {
	return a.Allowed == b.Allowed && a.At.Equal(b.At) && a.RetryAfter == b.RetryAfter && a.Reason == b.Reason && a.Status == b.Status
}

// randomOp is one step of a differential trace.
type randomOp struct {
	kind     int // 0 charge, 1 peek, 2 reconcile, 3 status, 4 book
	maxWait  time.Duration
	lead     time.Duration
	tenant   string
	lim      *quota.Limits
	tokens   int64 // charged, or actual when reconciling
	estimate int64
	ahead    quota.Backlog
}

// nextOp draws a call: each configuration has two tenants of its own, one
// call in 20 is made with another configuration (a reload; never the slow
// last one, whose debts would block a tenant for days), one in 40 charges
// 2^40 tokens to a tenant kept for such charges. Reconciles stay small, and
// refund only on the slow configuration: extra debt is not bounded by the
// conformance test, and Memory's int64 would overflow after centuries of
// it (the script clamps instead).
func nextOp(rng *rand.Rand, ls []*quota.Limits) randomOp {
	li := rng.IntN(len(ls))
	op := randomOp{
		kind:     rng.IntN(5),
		maxWait:  time.Duration(rng.IntN(5000)) * time.Millisecond,
		lead:     time.Duration(rng.IntN(3)*rng.IntN(1000)) * time.Millisecond,
		tenant:   "t" + strconv.Itoa(li) + "-" + strconv.Itoa(rng.IntN(2)),
		lim:      ls[li],
		tokens:   int64(rng.IntN(2000)),
		estimate: int64(rng.IntN(3000)),
	}
	if rng.IntN(20) == 0 {
		op.lim = ls[rng.IntN(len(ls)-1)]
	}
	switch {
	case op.kind == 0 && rng.IntN(40) == 0:
		op.tokens = 1 << 40
		op.tenant = "huge" + strconv.Itoa(li)
	case op.kind == 0 && rng.IntN(40) == 0:
		op.tokens = 20000
	case op.kind == 2 && li == len(ls)-1:
		op.tokens = min(op.tokens, op.estimate)
	}
	if rng.IntN(2) == 0 {
		op.ahead = quota.Backlog{Requests: int64(rng.IntN(50)), Tokens: int64(rng.IntN(50000))}
	}
	return op
}

// apply runs op on s and renders its result for comparison.
func apply(t testing.TB, s quota.Store, op randomOp) (quota.Decision, error) {
	switch op.kind {
	case 0:
		return s.Charge(bg, op.tenant, op.lim, op.tokens)
	case 1:
		return s.Peek(bg, op.tenant, op.lim, op.ahead)
	case 2:
		st, err := s.Reconcile(bg, op.tenant, op.lim, op.estimate, op.tokens)
		return quota.Decision{Status: st}, err
	case 4:
		return s.Book(bg, op.tenant, op.lim, op.tokens, op.maxWait, op.lead)
	}
	st, err := s.Status(bg, op.tenant, op.lim)
	return quota.Decision{Status: st}, err
}

// TestRedisMatchesMemory is the differential proof of exactness: 10000
// random calls (charges, peeks with backlogs, reconciles, status; three
// tenants; limits switched at random between the configurations of
// diffLimits, including charges beyond 2^53 ns) on Memory and on Redis,
// each at the same microsecond of a shared virtual clock, give identical
// results, field by field. Allowed, refused and every dimension binding
// are all seen.
func TestRedisMatchesMemory(t *testing.T) {
	mh := newMemoryHarness()
	rh, _, _ := newRedisHarness(t)
	ls := diffLimits()
	rng := rand.New(rand.NewPCG(7, 8))
	seen := map[string]int{}
	for i := 0; i < 10000; i++ {
		if rng.IntN(3) == 0 {
			// Mostly small steps, sometimes long ones past a window.
			step := time.Duration(rng.IntN(20000)) * time.Microsecond
			if rng.IntN(100) == 0 {
				step = time.Duration(rng.IntN(600)) * time.Second
			}
			mh.advance(step)
			rh.advance(step)
		}
		op := nextOp(rng, ls)
		md, err := apply(t, mh.store, op)
		if err != nil {
			t.Fatal(err)
		}
		rd, err := apply(t, rh.store, op)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(md, rd) {
			t.Fatalf("call %d %+v at %v:\nmemory %+v\nredis  %+v", i, op, mh.now(), md, rd)
		}
		if op.kind == 4 && md.Allowed && md.RetryAfter > 0 {
			seen["booked ahead"]++
		}
		if op.kind <= 1 || op.kind == 4 {
			if md.Allowed {
				seen["allowed"]++
			} else {
				seen[string(md.Reason)]++
			}
		}
	}
	for _, k := range []string{"allowed", "qps", "tokens", "joint", "booked ahead"} {
		if seen[k] < 100 {
			t.Errorf("only %d decisions %q in the trace, want at least 100 (%v)", seen[k], k, seen)
		}
	}
	t.Logf("decisions: %v", seen)
}

// TestRedisExpiry: a key's TTL is the time to rest rounded up to the
// millisecond plus the margin, exactly; the key is there 1 ms before and
// gone 1 ms after; a refund to rest deletes it; Peek and Status write
// nothing.
func TestRedisExpiry(t *testing.T) {
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, "p:", 0)
	r.margin = "250" // ms
	// 1500001 ns per request.
	l := quota.MustCompile(quota.Config{QPS: 1e9 / 1500001.0})
	if inc := l.Increment(quota.DimQPS, 0); inc != 1500001 {
		t.Fatalf("increment %v, want 1500001ns", inc)
	}
	if _, err := r.Peek(bg, "a", l, quota.Backlog{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Status(bg, "a", l); err != nil {
		t.Fatal(err)
	}
	if mr.Exists("p:t{a}") {
		t.Fatal("Peek or Status wrote a key")
	}
	if d, err := r.Charge(bg, "a", l, 0); err != nil || !d.Allowed {
		t.Fatalf("charge: %+v, %v", d, err)
	}
	if ttl := mr.TTL("p:t{a}"); ttl != 252*time.Millisecond {
		t.Errorf("TTL %v, want 1.500001 ms rounded up to 2 ms, plus 250 ms", ttl)
	}
	mr.SetTime(epoch0.Add(251 * time.Millisecond))
	if !mr.Exists("p:t{a}") {
		t.Error("key gone 1 ms before its TTL")
	}
	mr.SetTime(epoch0.Add(253 * time.Millisecond))
	if mr.Exists("p:t{a}") {
		t.Error("key still there 1 ms after its TTL")
	}
	tok := quota.MustCompile(quota.Config{TokensPerMin: 6000})
	if _, err := r.Charge(bg, "b", tok, 10); err != nil || !mr.Exists("p:t{b}") {
		t.Fatalf("charge of 10 tokens: key %v, %v", mr.Exists("p:t{b}"), err)
	}
	if _, err := r.Reconcile(bg, "b", tok, 10, 0); err != nil || mr.Exists("p:t{b}") {
		t.Errorf("refund to rest: key still there (%v)", err)
	}
}

// TestRedisKeyLayout: one hash per tenant, its name the prefix, "t" and the
// tenant in braces (its Cluster hash tag), fields q, t and j holding Unix
// nanoseconds; the default prefix; TIME read to the microsecond.
func TestRedisKeyLayout(t *testing.T) {
	mr, c := newMiniredis(t)
	mr.SetTime(epoch0.Add(1234567891)) // 1.234567891 s: TIME shows 1.234567
	r := NewQuotaStore(c, DefaultPrefix, 0)
	if k := r.Key("acme"); k != "fq:quota:t{acme}" {
		t.Fatalf("key %q, want fq:quota:t{acme}", k)
	}
	// The caller's own meters, named with a NUL first, in a namespace of
	// their own; a tenant spelling one lands in the tenants'.
	if k := r.Key("\x00upstream"); k != "fq:quota:i{upstream}" {
		t.Errorf("internal meter's key %q, want fq:quota:i{upstream}", k)
	}
	if k := r.Key("i{upstream}"); k != "fq:quota:t{i{upstream}}" {
		t.Errorf("tenant i{upstream}'s key %q, want fq:quota:t{i{upstream}}", k)
	}
	if got, want := c.ClusterKeySlot(bg, r.Key("acme")).Val(), c.ClusterKeySlot(bg, "acme").Val(); got != want {
		t.Errorf("slot %d: the key's slot is not the tenant's, %d", got, want)
	}
	l := quota.MustCompile(seedCfg)
	d, err := r.Charge(bg, "acme", l, 1000)
	if err != nil {
		t.Fatal(err)
	}
	now := epoch0.Add(1234567000)
	if !d.At.Equal(now) {
		t.Errorf("At %v, want Redis TIME %v (microseconds)", d.At, now)
	}
	h, err := c.HGetAll(bg, "fq:quota:t{acme}").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"q": strconv.FormatInt(now.UnixNano()+5_000_000, 10),
		"t": strconv.FormatInt(now.UnixNano()+300_000_000, 10),
		"j": strconv.FormatInt(now.UnixNano()+9_000_000, 10),
	}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("hash %v, want %v", h, want)
	}
}

// TestRedisGarbledState: a hash with missing, garbled, negative or
// out-of-range fields is read as a tenant at rest on those meters (no error,
// no panic) and the next charge writes it whole; a key of another type is an
// error.
func TestRedisGarbledState(t *testing.T) {
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, DefaultPrefix, 0)
	l := quota.MustCompile(seedCfg)
	fresh, err := r.Status(bg, "nobody", l)
	if err != nil {
		t.Fatal(err)
	}
	for _, vals := range [][]string{
		{"q", "garbage", "t", "", "j", "12abc"},
		{"q", "-5", "t", "99999999999999999999", "j", "9223372036854775807"},
		{"t", "1.5e18"},
		{"x", "1"},
	} {
		mr.Del("fq:quota:t{g}")
		mr.HSet("fq:quota:t{g}", vals...)
		st, err := r.Status(bg, "g", l)
		if err != nil || st != fresh {
			t.Errorf("hash %v: status %+v, %v; want the fresh %+v", vals, st, err, fresh)
		}
		d, err := r.Charge(bg, "g", l, 100)
		if err != nil || !d.Allowed {
			t.Errorf("hash %v: charge %+v, %v; want allowed", vals, d, err)
		}
		for _, f := range []string{"q", "t", "j"} {
			if _, err := strconv.ParseInt(mr.HGet("fq:quota:t{g}", f), 10, 64); err != nil {
				t.Errorf("hash %v: field %s after a charge: %v", vals, f, err)
			}
		}
	}
	mr.Del("fq:quota:t{g}")
	mr.Set("fq:quota:t{g}", "a string")
	if _, err := r.Charge(bg, "g", l, 1); err == nil {
		t.Error("a key of the wrong type: no error")
	}
	// The Go side of the reply.
	for _, res := range [][]any{
		nil,
		{"1", "2", "3", "4"},
		{"1", "2", "3", "4", "5", "6", int64(7)},
		{"1", "2", "3", "4", "5", "6", "x"},
		{"1", "2", "3", "4", "5", "6", "4"},
	} {
		if _, _, _, _, _, err := parseReply(res); !errors.Is(err, errReply) {
			t.Errorf("reply %v: error %v, want errReply", res, err)
		}
	}
}

// TestRedisErrors: a cancelled context, a server that never answers (with
// the call's Timeout and a client with ContextTimeoutEnabled) and a server
// gone are errors, returned, for the caller to fail open.
func TestRedisErrors(t *testing.T) {
	l := quota.MustCompile(seedCfg)
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, DefaultPrefix, 0)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := r.Charge(ctx, "a", l, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want context.Canceled", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns sync.WaitGroup
	conns.Go(func() {
		// Accept and never answer.
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	})
	silent := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true, Protocol: 2})
	defer silent.Close()
	rs := NewQuotaStore(silent, DefaultPrefix, 50*time.Millisecond)
	_, err = rs.Charge(bg, "a", l, 1)
	var ne net.Error
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("silent server: %v, want a timeout", err)
	}
	// The caller's own deadline, without the store's timeout.
	ctx, cancel = context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	_, err = NewQuotaStore(silent, DefaultPrefix, 0).Peek(ctx, "a", l, quota.Backlog{})
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("silent server, caller's deadline: %v, want a timeout", err)
	}
	ln.Close()
	conns.Wait()

	mr.Close()
	if _, err := r.Peek(bg, "a", l, quota.Backlog{}); err == nil {
		t.Error("server gone: Peek gave no error")
	}
	if _, err := r.Reconcile(bg, "a", l, 1, 2); err == nil {
		t.Error("server gone: Reconcile gave no error")
	}
	if _, err := r.Status(bg, "a", l); err == nil {
		t.Error("server gone: Status gave no error")
	}
}

// roundTrips counts the commands a client sends (a go-redis process hook
// sees each command once; a pipeline is one round trip), leaving out a new
// connection's handshake (HELLO, CLIENT SETINFO), which is no decision's.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "hello" && n != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if n := cmd.Name(); n != "hello" && n != "client" {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestRedisOneRoundTrip: after Load, Peek, Charge (allowed or refused),
// Reconcile and Status each send exactly one command; without Load the
// first call on a server sends two (EVALSHA refused with NOSCRIPT, then
// EVAL) and every later one, one.
func TestRedisOneRoundTrip(t *testing.T) {
	l := quota.MustCompile(quota.Config{QPS: 1})
	for _, load := range []bool{true, false} {
		t.Run(fmt.Sprintf("load=%v", load), func(t *testing.T) {
			_, c := newMiniredis(t)
			var rt roundTrips
			c.AddHook(&rt)
			r := NewQuotaStore(c, DefaultPrefix, 0)
			if load {
				if err := r.Load(bg); err != nil {
					t.Fatal(err)
				}
				rt.n.Store(0)
			}
			calls := []struct {
				name string
				f    func() error
			}{
				{"Charge (allowed)", func() error { _, err := r.Charge(bg, "a", l, 1); return err }},
				{"Charge (refused)", func() error { _, err := r.Charge(bg, "a", l, 1); return err }},
				{"Peek", func() error { _, err := r.Peek(bg, "a", l, quota.Backlog{Requests: 3}); return err }},
				{"Reconcile", func() error { _, err := r.Reconcile(bg, "a", l, 1, 2); return err }},
				{"Status", func() error { _, err := r.Status(bg, "a", l); return err }},
			}
			for i, call := range calls {
				before := rt.n.Load()
				if err := call.f(); err != nil {
					t.Fatal(err)
				}
				want := int64(1)
				if i == 0 && !load {
					want = 2
				}
				if got := rt.n.Load() - before; got != want {
					t.Errorf("%s: %d round trips, want %d", call.name, got, want)
				}
			}
		})
	}
}

// TestRedisCluster: through a ClusterClient (miniredis answers CLUSTER
// SLOTS as a one-node cluster), Load reaches the node and decisions equal
// Memory's.
func TestRedisCluster(t *testing.T) {
	mr, _ := newMiniredis(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{mr.Addr()}, MaxRetries: -1})
	defer cc.Close()
	r := NewQuotaStore(cc, DefaultPrefix, 0)
	if err := r.Load(bg); err != nil {
		t.Fatal(err)
	}
	mh := newMemoryHarness()
	l := quota.MustCompile(seedCfg)
	for i := 0; i < 50; i++ {
		md := mh.charge(t, "a", l, 3000)
		rd, err := r.Charge(bg, "a", l, 3000)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(md, rd) {
			t.Fatalf("charge %d: memory %+v, redis %+v", i, md, rd)
		}
	}
}

// realRedis returns a client on the redis-server at $REDIS_ADDR (which the
// CI script starts), or skips the test when it is unset.
func realRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		tb.Skip("REDIS_ADDR not set: no redis-server to test against")
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	if err := c.Ping(bg).Err(); err != nil {
		tb.Fatalf("REDIS_ADDR=%s: %v", addr, err)
	}
	return c
}

// testPrefix is a key prefix of its own for each run against a shared
// server; cleanup deletes its keys.
func testPrefix(tb testing.TB, c *redis.Client) string {
	p := fmt.Sprintf("fqtest:%d:%d:", time.Now().UnixNano(), rand.Uint32())
	tb.Cleanup(func() { deleteKeys(c, p) })
	return p
}

// TestRedisServer runs against a real redis-server (its Lua 5.1, TIME and
// expiry), when $REDIS_ADDR names one:
//
//   - matches-memory: 3000 random calls give the results Memory gives when
//     its clock reads the Redis time each call saw;
//   - concurrent: two clients (two gateways) with 4 goroutines each, 300
//     charges per goroutine for one tenant at 1000 qps with a 10 ms window:
//     the charges admitted over the window D between the first and the last
//     (on Redis's clock) never exceed the GCRA bound r x (D + tau) + 1, and
//     the tenant's TAT accounts for every one of them;
//   - layout: the key has the TTL of its debt plus the margin, and a refund
//     to rest deletes it; one round trip per call.
func TestRedisServer(t *testing.T) {
	c := realRedis(t)
	prefix := testPrefix(t, c)

	t.Run("matches-memory", func(t *testing.T) {
		r := NewQuotaStore(c, prefix+"m:", 0)
		var cur int64
		r.onNow = func(now int64) { cur = now }
		m := quota.NewMemory(func() time.Time { return time.Unix(0, cur) })
		// Rates low enough that real time refuses often.
		ls := []*quota.Limits{
			quota.MustCompile(quota.Config{QPS: 20, TokensPerMin: 6000, TokenToQPSWeight: 0.01, JointCap: 1, BurstWindow: time.Second, BurstAllow: 0.1}),
			quota.MustCompile(quota.Config{QPS: 3, TokensPerMin: 700, TokenToQPSWeight: 0.0013, JointCap: 0.7, BurstWindow: 3 * time.Second, BurstAllow: 0.37}),
			quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1}),         // joint binds
			quota.MustCompile(quota.Config{QPS: 1e-6, TokensPerMin: 6e-5, BurstWindow: 24 * time.Hour, BurstAllow: 100}), // slow: last
		}
		rng := rand.New(rand.NewPCG(9, 10))
		seen := map[string]int{}
		for i := 0; i < 3000; i++ {
			op := nextOp(rng, ls)
			rd, err := apply(t, r, op)
			if err != nil {
				t.Fatal(err)
			}
			md, _ := apply(t, m, op)
			if !sameDecision(md, rd) {
				t.Fatalf("call %d %+v at %d:\nmemory %+v\nredis  %+v", i, op, cur, md, rd)
			}
			if op.kind <= 1 {
				if md.Allowed {
					seen["allowed"]++
				} else {
					seen[string(md.Reason)]++
				}
			}
		}
		if seen["allowed"] == 0 || seen["qps"]+seen["tokens"]+seen["joint"] == 0 {
			t.Errorf("trace saw %v, want both allowed and refused decisions", seen)
		}
		t.Logf("decisions: %v", seen)
	})

	t.Run("concurrent", func(t *testing.T) {
		l := quota.MustCompile(quota.Config{QPS: 1000, BurstWindow: time.Second, BurstAllow: 0.01}) // T 1 ms, tau 10 ms
		c2 := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true})
		defer c2.Close()
		stores := []*QuotaStore{NewQuotaStore(c, prefix+"c:", 0), NewQuotaStore(c2, prefix+"c:", 0)}
		var (
			mu          sync.Mutex
			allowed     int64
			first, last int64 = math.MaxInt64, math.MinInt64
			wg          sync.WaitGroup
		)
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				s := stores[g%2]
				for i := 0; i < 300; i++ {
					d, err := s.Charge(bg, "hot", l, 0)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						at := d.At.UnixNano()
						mu.Lock()
						allowed++
						first, last = min(first, at), max(last, at)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if allowed == 0 {
			t.Fatal("no charge admitted")
		}
		D := last - first
		T := int64(l.Increment(quota.DimQPS, 0))
		tau := int64(l.Tolerance())
		// GCRA: the k-th charge after the first needs first + k T <= its
		// time + tau, so (allowed - 1) T <= D + tau.
		if (allowed-1)*T > D+tau {
			t.Errorf("%d charges admitted over %v: above the bound r x (D + tau) + 1 = %d", allowed, time.Duration(D), (D+tau)/T+1)
		}
		raw, err := c.HGet(bg, stores[0].Key("hot"), "q").Result()
		if err != nil {
			t.Fatal(err)
		}
		tat, _ := strconv.ParseInt(raw, 10, 64)
		if tat < first+allowed*T || tat > last+tau+T {
			t.Errorf("TAT %d not within [first + n T, last + tau + T] = [%d, %d]", tat, first+allowed*T, last+tau+T)
		}
		t.Logf("%d of 2400 charges admitted over %v (bound %d)", allowed, time.Duration(D), (D+tau)/T+1)
	})

	t.Run("layout", func(t *testing.T) {
		lc := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true})
		defer lc.Close()
		var rt roundTrips
		lc.AddHook(&rt)
		r := NewQuotaStore(lc, prefix+"l:", 0)
		r.margin = "3600000" // an hour, in ms
		if err := r.Load(bg); err != nil {
			t.Fatal(err)
		}
		l := quota.MustCompile(quota.Config{TokensPerMin: 60}) // a token per second
		rt.n.Store(0)
		if d, err := r.Charge(bg, "a", l, 600); err != nil || !d.Allowed {
			t.Fatalf("charge: %+v, %v", d, err)
		}
		if n := rt.n.Load(); n != 1 {
			t.Errorf("charge: %d round trips, want 1", n)
		}
		// 10 min of debt plus an hour of margin, counted down since.
		if ttl := lc.PTTL(bg, r.Key("a")).Val(); ttl > 70*time.Minute || ttl < 69*time.Minute {
			t.Errorf("TTL %v, want 70 min (10 min of debt + 1 h margin) less the time since", ttl)
		}
		rt.n.Store(0)
		if _, err := r.Reconcile(bg, "a", l, 600, 0); err != nil {
			t.Fatal(err)
		}
		if n := rt.n.Load(); n != 1 {
			t.Errorf("reconcile: %d round trips, want 1", n)
		}
		if n := lc.Exists(bg, r.Key("a")).Val(); n != 0 {
			t.Error("refund to rest: key still there")
		}
	})
}

// BenchmarkRedisCharge measures one Charge through the Redis store, the
// call at dispatch, against miniredis and, when $REDIS_ADDR is set, a real
// redis-server, with the seed's three meters at rates that admit
// everything: over 1 and 10k tenants from one goroutine (the latency of a
// decision), and over 10k tenants from GOMAXPROCS x 4 goroutines (the
// decisions per second one server sustains). It reports round trips per
// decision (a go-redis hook counts the commands sent; 1 after Load).
func BenchmarkRedisCharge(b *testing.B) {
	cfg := seedCfg
	cfg.QPS = 1e6
	cfg.TokensPerMin = 1e12
	l := quota.MustCompile(cfg)
	servers := []struct {
		name   string
		client func(b testing.TB) *redis.Client
	}{
		{"miniredis", func(b testing.TB) *redis.Client {
			mr := miniredis.RunT(b)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
			b.Cleanup(func() { c.Close() })
			return c
		}},
		{"redis-server", realRedis},
	}
	for _, srv := range servers {
		for _, bc := range []struct {
			tenants  int
			parallel bool
		}{{1, false}, {10000, false}, {10000, true}} {
			name := fmt.Sprintf("%s/tenants=%d", srv.name, bc.tenants)
			if bc.parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				c := srv.client(b)
				var rt roundTrips
				c.AddHook(&rt)
				r := NewQuotaStore(c, fmt.Sprintf("fqbench:%d:", time.Now().UnixNano()), 0)
				b.Cleanup(func() { deleteKeys(c, r.prefix) })
				if err := r.Load(bg); err != nil {
					b.Fatal(err)
				}
				names := make([]string, bc.tenants)
				for i := range names {
					names[i] = "tenant-" + strconv.Itoa(i)
				}
				var refused atomic.Int64
				charge := func(i int) {
					d, err := r.Charge(bg, names[i%len(names)], l, 100)
					if err != nil {
						b.Fatal(err)
					}
					if !d.Allowed {
						refused.Add(1)
					}
				}
				rt.n.Store(0)
				b.ReportAllocs()
				b.ResetTimer()
				if bc.parallel {
					b.SetParallelism(4)
					var next atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							charge(int(next.Add(1)))
						}
					})
				} else {
					for i := 0; b.Loop(); i++ {
						charge(i)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(rt.n.Load())/float64(b.N), "roundtrips/op")
				if refused.Load() > 0 {
					b.Fatalf("%d charges refused at rates meant to admit all", refused.Load())
				}
			})
		}
	}
}

// deleteKeys removes the keys under prefix (a benchmark's, on a shared
// server).
func deleteKeys(c *redis.Client, prefix string) {
	var cursor uint64
	for {
		keys, next, err := c.Scan(bg, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return
		}
		if len(keys) > 0 {
			c.Del(bg, keys...)
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// tableRefund: a refund takes a whole charge back on every meter, the
// request included, and never below rest.
func tableRefund(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(seedCfg)
	for i := 0; i < 3; i++ {
		h.charge(t, "a", l, 1000)
	}
	before := h.status(t, "a", l)
	h.charge(t, "a", l, 1000)
	st, err := h.store.Refund(bg, "a", l, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if st != before {
		t.Fatalf("after charge + refund: %+v, want the status before the charge %+v", st, before)
	}
	for i := 0; i < 5; i++ {
		if st, err = h.store.Refund(bg, "a", l, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if st.Requests.Reset != 0 || st.Tokens.Reset != 0 || st.Joint.Reset != 0 {
		t.Fatalf("refunds past the charges: %+v, want at rest", st)
	}
	if d := h.charge(t, "a", l, 1000); !d.Allowed {
		t.Fatal("refused at rest")
	}
}

// tableBook: bookings made at one instant by callers anywhere get the
// tenant's successive earliest times, first come, first served, each
// exactly the time a charge would have been allowed at had the requests
// before it been charged as each started; a booking past maxWait charges
// nothing and says when it could; a refund frees the last place for the
// next booking; the binding meter is named.
func tableBook(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(quota.Config{QPS: 10, BurstWindow: time.Second, BurstAllow: 0.2}) // 100 ms a request, tau 200 ms
	book := func(maxWait time.Duration) quota.Decision {
		t.Helper()
		d, err := h.store.Book(bg, "b", l, 1, maxWait, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	start := h.now()
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
	if d := h.peek(t, "b", l, quota.Backlog{}); !d.At.Equal(start.Add(400 * time.Millisecond)) {
		t.Fatalf("a refused booking charged: the next time is %v, want +400ms", d.At.Sub(start))
	}
	// A refund gives the last place back.
	if _, err := h.store.Refund(bg, "b", l, 1); err != nil {
		t.Fatal(err)
	}
	if d := book(350 * time.Millisecond); !d.Allowed || !d.At.Equal(start.Add(300*time.Millisecond)) {
		t.Fatalf("after a refund: %+v, want booked at +300ms", d)
	}
	// Booked as of its time: at +300 ms the charge is in the past; a
	// request at the time of the last booking is refused until +400 ms, as
	// it would be had each booked request been charged as it started.
	h.set(h.ceil(start.Add(300 * time.Millisecond)))
	if d := h.charge(t, "b", l, 1); d.Allowed || !d.At.Equal(start.Add(400*time.Millisecond)) {
		t.Fatalf("charge at +300ms: %+v, want refused until +400ms", d)
	}
	// maxWait 0 is Charge.
	if d := book(0); d.Allowed {
		t.Fatalf("book(0) allowed while Charge refuses: %+v", d)
	}
}

// tableBookLead: the longest lead any caller gave for a tenant shortens
// every caller's horizon, for LeadMemory while the tenant stays in debt: a
// caller giving no lead books to the same horizon as one that gave 300 ms
// a moment ago; a lead older than LeadMemory, or one the tenant came to
// rest since, counts no more.
func tableBookLead(t *testing.T, h *storeHarness) {
	l := quota.MustCompile(quota.Config{QPS: 10}) // 100 ms a request, no burst
	book := func(maxWait, lead time.Duration) quota.Decision {
		t.Helper()
		d, err := h.store.Book(bg, "c", l, 1, maxWait, lead)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	start := h.now()
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
	h.set(h.ceil(start.Add(quota.LeadMemory + time.Millisecond)))
	d := h.peek(t, "c", l, quota.Backlog{})
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
	h.set(h.ceil(h.now().Add(time.Hour)))
	if d := book(0, 0); !d.Allowed || d.RetryAfter != 0 {
		t.Fatalf("at rest: %+v", d)
	}
	if d := book(150*time.Millisecond, 0); !d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("after the tenant came to rest: %+v, want the old lead forgotten: booked at +100ms", d)
	}
}
