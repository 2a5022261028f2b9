package history

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
)

// newClock starts 30 s into a minute, so a test can tell partial minutes
// from whole.
func newClock() *manualclock.Clock {
	return manualclock.New(time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC))
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func tenantOf(t *testing.T, r Report, name string) TenantReport {
	t.Helper()
	for _, tr := range r.Tenants {
		if tr.Name == name {
			return tr
		}
	}
	t.Fatalf("tenant %q not in report (%d tenants)", name, len(r.Tenants))
	return TenantReport{}
}

func TestBuckets(t *testing.T) {
	if got := bucketOf(0); got != 0 {
		t.Errorf("bucketOf(0) = %d", got)
	}
	if got := bucketOf(0.001); got != 0 {
		t.Errorf("bucketOf(1ms) = %d", got)
	}
	for i, b := range bounds {
		if got := bucketOf(b); got != i {
			t.Errorf("bucketOf(bound %d = %g) = %d, want %d", i, b, got, i)
		}
		if got := bucketOf(b * 1.0001); got != i+1 {
			t.Errorf("bucketOf(just above bound %d) = %d, want %d", i, got, i+1)
		}
	}
	if got := bucketOf(1e6); got != NumBuckets-1 {
		t.Errorf("bucketOf(1e6 s) = %d, want the overflow bucket %d", got, NumBuckets-1)
	}
	if b := bounds[NumBuckets-2]; b < 300 || b > 1000 {
		t.Errorf("last bound %g s: want beyond the longest default budget (300 s)", b)
	}

	// Waits 1..1000 ms, one each: quantiles within the bucket factor √2.
	var h [NumBuckets]uint64
	for ms := 1; ms <= 1000; ms++ {
		h[bucketOf(float64(ms)/1000)]++
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.5}, {0.95, 0.95}, {0.99, 0.99}} {
		got := quantile(&h, c.q)
		if got < c.want/math.Sqrt2 || got > c.want*math.Sqrt2 {
			t.Errorf("quantile(%v) = %g s, want within √2 of %g", c.q, got, c.want)
		}
	}
	var empty [NumBuckets]uint64
	if got := quantile(&empty, 0.5); got != 0 {
		t.Errorf("quantile of nothing = %g", got)
	}
}

func TestOutcomesWaitsAndWindows(t *testing.T) {
	c := newClock()
	h := New(c.Now, []string{"alpha", "beta"})
	// Minute 0: alpha 8 served at 100 ms, 1 at 2 s, 1 queue_timeout.
	for range 8 {
		h.Outcome("alpha", Answer{Code: "served", Wait: 100 * time.Millisecond})
	}
	h.Outcome("alpha", Answer{Code: "served", Wait: 2 * time.Second})
	h.Outcome("alpha", Answer{Code: "queue_timeout", Wait: 5 * time.Second})
	h.Outcome("alpha", Answer{Code: "made_up_code"})
	// Ten minutes later: alpha 2 served at 10 ms, beta 1 refused by quota.
	c.Advance(10 * time.Minute)
	h.Outcome("alpha", Answer{Code: "served", Wait: 10 * time.Millisecond})
	h.Outcome("alpha", Answer{Code: "served", Wait: 10 * time.Millisecond})
	h.Outcome("beta", Answer{Code: "quota_exceeded"})

	r5 := h.Query(5*time.Minute, nil)
	a5 := tenantOf(t, r5, "alpha")
	if a5.Requests != 2 || a5.Served != 2 || a5.SuccessRate != 1 || a5.Wait.Count != 2 {
		t.Errorf("5m alpha: %+v, want the last minute's 2 served", a5)
	}
	if a5.Wait.P50 < 0.01/math.Sqrt2 || a5.Wait.P50 > 0.01*math.Sqrt2 {
		t.Errorf("5m alpha p50 %g, want about 10 ms", a5.Wait.P50)
	}
	if b5 := tenantOf(t, r5, "beta"); b5.Requests != 1 || b5.Outcomes["quota_exceeded"] != 1 || b5.SuccessRate != 0 {
		t.Errorf("5m beta: %+v", b5)
	}

	a1 := tenantOf(t, h.Query(time.Hour, nil), "alpha")
	want := map[string]int64{"served": 11, "queue_timeout": 1, "other": 1}
	if fmt.Sprint(a1.Outcomes) != fmt.Sprint(want) || a1.Requests != 13 {
		t.Errorf("1h alpha outcomes %v (%d requests), want %v (13)", a1.Outcomes, a1.Requests, want)
	}
	if !near(a1.SuccessRate, 11.0/13, 1e-12) {
		t.Errorf("1h alpha success rate %g, want 11/13", a1.SuccessRate)
	}
	var hist uint64
	for _, n := range a1.WaitHistogram {
		hist += n
	}
	if hist != 11 || a1.Wait.Count != 11 || len(a1.WaitHistogram) != NumBuckets {
		t.Errorf("1h alpha histogram holds %d waits in %d buckets, want 11 in %d", hist, len(a1.WaitHistogram), NumBuckets)
	}
	// 8 of 11 at 100 ms, 2 at 10 ms, 1 at 2 s: p50 is 100 ms, p99 is 2 s.
	if a1.Wait.P50 < 0.1/math.Sqrt2 || a1.Wait.P50 > 0.1*math.Sqrt2 {
		t.Errorf("1h alpha p50 %g, want about 100 ms", a1.Wait.P50)
	}
	if a1.Wait.P99 < 2/math.Sqrt2 || a1.Wait.P99 > 2*math.Sqrt2 {
		t.Errorf("1h alpha p99 %g, want about 2 s", a1.Wait.P99)
	}
	if !near(a1.Wait.Mean, (0.8+2+0.02)/11, 1e-9) {
		t.Errorf("1h alpha mean wait %g", a1.Wait.Mean)
	}

	// 25 hours on, every minute is stale: the ring wrapped.
	c.Advance(25 * time.Hour)
	if a := tenantOf(t, h.Query(24*time.Hour, nil), "alpha"); a.Requests != 0 || a.Wait.Count != 0 {
		t.Errorf("after 25h alpha still has %d requests", a.Requests)
	}
	// A slot reused for a new minute starts from zero.
	h.Outcome("alpha", Answer{Code: "served", Wait: time.Second})
	if a := tenantOf(t, h.Query(24*time.Hour, nil), "alpha"); a.Requests != 1 {
		t.Errorf("reused slot: %d requests, want 1", a.Requests)
	}
}

func TestUndeclaredTenantsShareOneRing(t *testing.T) {
	c := newClock()
	h := New(c.Now, []string{"alpha"})
	for i := range 1000 {
		h.Outcome(fmt.Sprintf("rotating-%d", i), Answer{Code: "served", Wait: time.Millisecond})
	}
	h.Outcome("alpha", Answer{Code: "served", Wait: time.Millisecond})
	r := h.Query(5*time.Minute, map[string]TenantParams{"alpha": {Weight: 1}, "idle": {Weight: 2}})
	if len(r.Tenants) != 3 {
		t.Fatalf("tenants %v, want alpha, idle (params, no records) and %s", r.Tenants, UnknownTenant)
	}
	if u := tenantOf(t, r, UnknownTenant); u.Served != 1000 {
		t.Errorf("%s served %d, want 1000", UnknownTenant, u.Served)
	}
	if got := h.MemoryBytes(); got != FixedBytes+2*TenantBytes {
		t.Errorf("memory %d, want fixed + 2 rings = %d", got, FixedBytes+2*TenantBytes)
	}
	// A reload that drops alpha drops its ring; its records now go to
	// _unknown.
	h.Declare([]string{"beta"})
	if got := h.MemoryBytes(); got != FixedBytes+TenantBytes {
		t.Errorf("after Declare: memory %d, want fixed + 1 ring", got)
	}
	h.Outcome("alpha", Answer{Code: "served"})
	if u := tenantOf(t, h.Query(5*time.Minute, nil), UnknownTenant); u.Served != 1001 {
		t.Errorf("%s served %d after alpha was undeclared, want 1001", UnknownTenant, u.Served)
	}
}

// Fair shares are what WFQ owes: in each interval between samples, the
// tokens served to the backlogged tenants are owed to them by weight, and
// a tenant with nothing waiting is owed what it used. Jain's index is of
// share over fair share.
func TestSharesAndJain(t *testing.T) {
	c := newClock()
	h := New(c.Now, []string{"a", "b", "idle"})
	params := map[string]TenantParams{"a": {Weight: 3}, "b": {Weight: 1}, "idle": {Weight: 4}, UnknownTenant: {Weight: 1}}
	serve := func(tenant string, tokens int64) {
		h.Outcome(tenant, Answer{Code: "served", Tokens: tokens})
	}
	both := []Backlogged{{"a", 3}, {"b", 1}}
	serve("a", 300)
	serve("b", 100)
	h.Sample(Sample{Backlogged: both})
	r := h.Query(5*time.Minute, params)
	// Both waited the whole interval: owed 3/4 and 1/4, served exactly so.
	a, b := tenantOf(t, r, "a"), tenantOf(t, r, "b")
	if !near(a.Share, 0.75, 1e-12) || !near(a.FairShare, 0.75, 1e-12) || !near(b.Share, 0.25, 1e-12) || !near(b.FairShare, 0.25, 1e-12) {
		t.Errorf("shares a %g/%g b %g/%g, want 0.75/0.75 and 0.25/0.25", a.Share, a.FairShare, b.Share, b.FairShare)
	}
	if r.JainTenants != 2 || !near(r.Jain, 1, 1e-12) {
		t.Errorf("Jain %g over %d tenants, want 1 over 2", r.Jain, r.JainTenants)
	}
	if i := tenantOf(t, r, "idle"); i.FairShare != 0 || i.Share != 0 || i.Weight != 4 {
		t.Errorf("idle: %+v", i)
	}

	// Both waiting, b served 3x what a got: x = (1/3, 3), Jain = (10/3)^2 / (2 (1/9 + 9)) = 100/164.
	c.Advance(time.Hour)
	serve("a", 100)
	serve("b", 300)
	h.Sample(Sample{Backlogged: both})
	r = h.Query(5*time.Minute, params)
	if !near(r.Jain, 100.0/164, 1e-12) || !near(tenantOf(t, r, "a").FairShare, 0.75, 1e-12) {
		t.Errorf("Jain %g (a's fair share %g), want 100/164 = %g (0.75)", r.Jain, tenantOf(t, r, "a").FairShare, 100.0/164)
	}
	// The 5m window is the current minute (30 s so far) and the 4 before.
	if r.Span != 270 {
		t.Errorf("span %g s, want 270", r.Span)
	}
	if tb := tenantOf(t, r, "b"); tb.ServedTokens != 300 || !near(tb.ServedTokensPerSec, 300.0/270, 1e-12) {
		t.Errorf("b served %d tokens at %g/s, want 300 at 300/270", tb.ServedTokens, tb.ServedTokensPerSec)
	}

	// Capacity nobody else wanted: the undeclared tenants take 900 tokens
	// while a, with nothing waiting, uses 100. Each was owed what it used,
	// whatever the weights: no unfairness.
	c.Advance(time.Hour)
	serve("stranger", 900)
	serve("a", 100)
	h.Sample(Sample{Backlogged: []Backlogged{{UnknownTenant, 1}}})
	r = h.Query(5*time.Minute, params)
	u := tenantOf(t, r, UnknownTenant)
	if !near(u.Share, 0.9, 1e-12) || !near(u.FairShare, 0.9, 1e-12) || !near(r.Jain, 1, 1e-12) || r.JainTenants != 2 {
		t.Errorf("idle capacity: _unknown %g of %g owed, Jain %g over %d; want 0.9 of 0.9, 1 over 2", u.Share, u.FairShare, r.Jain, r.JainTenants)
	}
	// Then a waits too: the next interval's 400 tokens are owed 3:1, and
	// b, served 40 with nothing waiting, is owed its 40.
	serve("stranger", 300)
	serve("a", 100)
	serve("b", 40)
	h.Sample(Sample{Backlogged: []Backlogged{{"a", 3}, {UnknownTenant, 1}}})
	h.Sample(Sample{Backlogged: both}) // nothing served since: nothing owed
	r = h.Query(5*time.Minute, params)
	for name, want := range map[string]float64{"a": 100 + 300, UnknownTenant: 900 + 100, "b": 40} {
		if got := tenantOf(t, r, name).FairShare * 1440; !near(got, want, 1e-9) {
			t.Errorf("%s owed %g of 1440 tokens, want %g", name, got, want)
		}
	}

	// Nothing served: no index.
	c.Advance(time.Hour)
	h.Outcome("a", Answer{Code: "queue_timeout"})
	h.Sample(Sample{Backlogged: both})
	if r := h.Query(5*time.Minute, params); r.Jain != 0 || r.JainTenants != 0 {
		t.Errorf("nothing served: Jain %g over %d, want 0 over 0", r.Jain, r.JainTenants)
	}
}

func TestRatesQuotaBoostsETA(t *testing.T) {
	c := newClock()
	h := New(c.Now, []string{"app"})
	// 40 s after the history started, it covers 40 s of any window.
	c.Advance(40 * time.Second)
	dispatches := []Answer{
		{Boosted: true, ETA: 2 * time.Second, Wait: time.Second},  // ratio 2
		{Boosted: false, ETA: time.Second, Wait: 2 * time.Second}, // ratio 1/2
		{Boosted: true, ETA: 0, Wait: time.Second},                // nothing predicted
		{Boosted: true, ETA: time.Second, Wait: 0},                // nothing waited
	}
	for i := range 20 {
		a := Answer{Code: "served"}
		if i < len(dispatches) {
			a = dispatches[i]
			a.Code = "served"
		}
		h.Outcome("app", a)
		h.QuotaCharged("app", 500)
	}
	h.QuotaLimited("app", "tokens", false)
	h.QuotaLimited("app", "tokens", true)
	h.QuotaLimited("app", "joint", true)
	h.QuotaLimited("app", "bogus", true)

	h.QuotaCharged("stranger", 100)
	r := h.Query(time.Hour, map[string]TenantParams{
		"app":         {Weight: 1, QPS: 1, TokensPerMin: 30000, JointPerSec: 2, TokenWeight: 0.001},
		UnknownTenant: {Weight: 1, QPS: 1, PerCaller: true}})
	if r.Span != 40 {
		t.Fatalf("span %g s, want 40", r.Span)
	}
	a := tenantOf(t, r, "app")
	q := a.Quota
	// 20 requests and 10,000 tokens in 40 s: 0.5/s of 1, 15,000/min of
	// 30,000, and (20 + 10,000 x 0.001) / 40 = 0.75 request-equivalents/s
	// of the joint meter's 2.
	if !near(q.ChargedPerSec, 0.5, 1e-12) || !near(q.QPSOccupancy, 0.5, 1e-12) ||
		!near(q.ChargedTokensPerMin, 15000, 1e-9) || !near(q.TokenOccupancy, 0.5, 1e-12) ||
		q.JointLimit != 2 || q.TokenWeight != 0.001 || !near(q.ChargedJointPerSec, 0.75, 1e-12) || !near(q.JointOccupancy, 0.375, 1e-12) {
		t.Errorf("quota %+v, want 0.5/s (0.5 of qps), 15000 tokens/min (0.5), 0.75 joint/s (0.375)", q)
	}
	// The undeclared tenants' limits bind each of them: no occupancy for
	// all of them together.
	if u := tenantOf(t, r, UnknownTenant).Quota; !u.PerCaller || u.QPSLimit != 1 || !near(u.ChargedPerSec, 1.0/40, 1e-12) || u.QPSOccupancy != 0 {
		t.Errorf("_unknown quota %+v, want qps 1 per caller, charged 1/40 per s, no occupancy", u)
	}
	wantHits := map[string]QuotaHits{"tokens": {Delayed: 1, Refused: 1}, "joint": {Refused: 1}}
	if fmt.Sprint(q.Hits) != fmt.Sprint(wantHits) {
		t.Errorf("hits %v, want %v", q.Hits, wantHits)
	}
	if !near(a.RequestsPerSec, 0.5, 1e-12) {
		t.Errorf("requests/s %g, want 0.5", a.RequestsPerSec)
	}
	if a.Boosts != 3 {
		t.Errorf("boosts %d, want 3", a.Boosts)
	}
	if a.ETA.Count != 2 || !near(a.ETA.MeanRatio, 1.25, 1e-12) || !near(a.ETA.MeanAbsLogError, math.Ln2, 1e-12) {
		t.Errorf("eta %+v, want 2 samples, mean ratio 1.25, mean |ln| ln 2", a.ETA)
	}
}

func TestSeriesAndTransitions(t *testing.T) {
	c := newClock()
	h := New(c.Now, nil)
	// Three seconds, 20 ticks each, water rising to a peak in the 2nd.
	for s := range 3 {
		for k := range 20 {
			w := 0.1 * float64(s)
			if s == 1 && k == 10 {
				w = 0.9
			}
			h.Sample(Sample{Capacity: 32, Healthy: 2, Water: w, DegradeLevel: s, CircuitLevel: 0})
			c.Advance(50 * time.Millisecond)
		}
	}
	r := h.Query(5*time.Minute, nil)
	if r.Resolution != 1 || len(r.Series) != 3 {
		t.Fatalf("5m series: %d points at %gs, want 3 at 1s: %+v", len(r.Series), r.Resolution, r.Series)
	}
	p := r.Series[1]
	if p.Capacity != 32 || p.Healthy != 2 || p.Water != 0.1 || p.WaterMax != 0.9 || p.Degrade != 1 {
		t.Errorf("second 2: %+v, want capacity 32, healthy 2, water 0.1 (last) max 0.9, degrade 1", p)
	}
	r = h.Query(time.Hour, nil)
	if r.Resolution != 60 || len(r.Series) != 1 || r.Series[0].WaterMax != 0.9 || r.Series[0].DegradeMax != 2 {
		t.Errorf("1h series %+v at %gs, want one minute, water max 0.9, degrade max 2", r.Series, r.Resolution)
	}

	// Transitions: bounded, filtered by window, oldest first.
	start := c.Now()
	for i := range MaxTransitions + 50 {
		h.Degrade(start.Add(time.Duration(i)*time.Second), "L1", i%2 == 0, i%2, (i+1)%2, 0.7)
	}
	c.Advance(time.Duration(MaxTransitions+50) * time.Second)
	h.Circuit(c.Now(), "low", true, 0, 1, 1.5)
	r = h.Query(24*time.Hour, nil)
	if len(r.Transitions) != MaxTransitions {
		t.Fatalf("%d transitions kept, want %d", len(r.Transitions), MaxTransitions)
	}
	if first := r.Transitions[0]; !first.At.Equal(start.Add(51 * time.Second)) {
		t.Errorf("oldest kept transition at %v, want the 52nd", first.At)
	}
	if last := r.Transitions[MaxTransitions-1]; last.Kind != "circuit" || last.Name != "low" || !last.Up || last.Value != 1.5 || last.To != 1 {
		t.Errorf("newest transition %+v", last)
	}
	// All of the kept ones are in the last 5 minutes.
	if n := len(h.Query(5*time.Minute, nil).Transitions); n != MaxTransitions {
		t.Errorf("%d transitions in 5m, want %d", n, MaxTransitions)
	}
	c.Advance(10 * time.Minute)
	if n := len(h.Query(5*time.Minute, nil).Transitions); n != 0 {
		t.Errorf("%d transitions in the last 5m, 10 min after the last, want 0", n)
	}
}

func TestMemoryCost(t *testing.T) {
	if strconv.IntSize != 64 {
		t.Skip("the stated figures are for 64-bit platforms")
	}
	if got := reflect.TypeFor[tenantMinute]().Size(); got != TenantMinuteBytes {
		t.Errorf("tenant-minute is %d bytes, doc says %d", got, TenantMinuteBytes)
	}
	if got := reflect.TypeFor[gatewaySlot]().Size(); got != gatewaySlotBytes {
		t.Errorf("gateway slot is %d bytes, want %d", got, gatewaySlotBytes)
	}
	if got := reflect.TypeFor[Transition]().Size(); got != transitionBytes {
		t.Errorf("transition is %d bytes, want %d", got, transitionBytes)
	}
	if TenantBytes != 460800 || FixedBytes != 115040 {
		t.Errorf("TenantBytes %d, FixedBytes %d: doc.go says 460,800 and 115,040", TenantBytes, FixedBytes)
	}
	// Ten declared tenants and _unknown, all busy: 5,183,840 bytes.
	c := newClock()
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	h := New(c.Now, names)
	for i := range 100 {
		h.Outcome(fmt.Sprintf("t%d", i%20), Answer{Code: "served", Wait: time.Millisecond})
	}
	if got, want := h.MemoryBytes(), FixedBytes+11*TenantBytes; got != want || got != 5_183_840 {
		t.Errorf("memory %d bytes, want %d = 5,183,840", got, want)
	}
	// Recording allocates nothing once a tenant's ring exists.
	allocs := testing.AllocsPerRun(1000, func() {
		h.Outcome("t1", Answer{Code: "served", Wait: 3 * time.Millisecond, Tokens: 10, Boosted: true, ETA: time.Second})
		h.QuotaLimited("t1", "qps", true)
		h.QuotaCharged("t1", 10)
		h.Sample(Sample{Capacity: 1, Backlogged: []Backlogged{{"t1", 1}, {"t2", 2}}})
	})
	if allocs != 0 {
		t.Errorf("recording allocates %g times, want 0", allocs)
	}
}

func TestConcurrentRecordAndQuery(t *testing.T) {
	c := newClock()
	h := New(c.Now, []string{"a", "b"})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				tenant := []string{"a", "b", "x"}[(g+i)%3]
				h.Outcome(tenant, Answer{Code: "served", Wait: time.Duration(i) * time.Millisecond, Tokens: 10})
				h.Sample(Sample{Capacity: 4, Water: float64(i) / 500})
				if i%100 == 0 {
					c.Advance(time.Second)
					_ = h.Query(time.Hour, map[string]TenantParams{"a": {Weight: 1}})
				}
			}
		})
	}
	wg.Wait()
	var served int64
	for _, tr := range h.Query(time.Hour, nil).Tenants {
		served += tr.Served
	}
	if served != 2000 {
		t.Errorf("served %d, want 2000", served)
	}
}

func TestNilHistoryIgnoresRecords(t *testing.T) {
	var h *History
	h.Outcome("a", Answer{Code: "served", Boosted: true, ETA: 1, Wait: 1})
	h.QuotaLimited("a", "qps", true)
	h.QuotaCharged("a", 1)
	h.Sample(Sample{})
	h.Degrade(time.Time{}, "L1", true, 0, 1, 0.7)
	h.Circuit(time.Time{}, "low", true, 0, 1, 1.4)
	h.Declare(nil)
}

func TestParseWindow(t *testing.T) {
	for name, want := range map[string]time.Duration{"5m": 5 * time.Minute, "1h": time.Hour, "24h": 24 * time.Hour} {
		if got, err := ParseWindow(name); err != nil || got != want {
			t.Errorf("ParseWindow(%q) = %v, %v", name, got, err)
		}
	}
	if _, err := ParseWindow("7d"); err == nil {
		t.Error("ParseWindow(7d): no error")
	}
}

// BenchmarkRecord is the cost the request path pays per answered request:
// one Outcome, the dispatch's facts with it.
func BenchmarkRecord(b *testing.B) {
	c := newClock()
	h := New(c.Now, []string{"a"})
	h.Outcome("a", Answer{Code: "served"})
	b.ReportAllocs()
	for b.Loop() {
		h.Outcome("a", Answer{Code: "served", Wait: 20 * time.Millisecond, Tokens: 100})
	}
}

// BenchmarkSample is the queue's tick: a gateway sample that settles the
// tokens served since the last one among ten declared tenants and
// _unknown, half of them backlogged.
func BenchmarkSample(b *testing.B) {
	c := newClock()
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	h := New(c.Now, names)
	var backlog []Backlogged
	for i, n := range append(names, UnknownTenant) {
		h.Outcome(n, Answer{Code: "served"})
		if i%2 == 0 {
			backlog = append(backlog, Backlogged{Tenant: n, Weight: float64(1 + i)})
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Outcome(names[i%len(names)], Answer{Code: "served", Tokens: 100})
		h.Sample(Sample{Capacity: 4, Healthy: 2, Water: 0.5, Backlogged: backlog})
	}
}
