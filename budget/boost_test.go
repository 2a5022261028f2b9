package budget

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBoostLimit(t *testing.T) {
	// shareMax 0.10 over capacities 1..40: floor(0.1×c), at least 1.
	b := NewBoosts(0.10, 0)
	for c := 1; c <= 40; c++ {
		want := max(c/10, 1)
		if got := b.Limit(c); got != want {
			t.Errorf("Limit(%d) = %d, want %d", c, got, want)
		}
	}
	cases := []struct {
		share float64
		cap   int
		want  int
	}{
		{0.10, 0, 0},    // no capacity
		{0.10, -3, 0},   // nonsense capacity
		{0, 100, 0},     // disabled
		{-1, 100, 0},    // clamped to 0
		{0.29, 100, 29}, // 0.29×100 = 28.999…: the epsilon keeps 29
		{0.07, 100, 7},
		{1, 5, 5},
		{1.5, 5, 5}, // clamped to 1
		{0.5, 3, 1},
		{0.01, 1000, 10},
	}
	for _, c := range cases {
		if got := NewBoosts(c.share, 0).Limit(c.cap); got != c.want {
			t.Errorf("share %v: Limit(%d) = %d, want %d", c.share, c.cap, got, c.want)
		}
	}
}

func TestBoostAllowShare(t *testing.T) {
	b := NewBoosts(0.10, 0)
	cases := []struct {
		inflight, capacity int
		ok                 bool
		reason             string
	}{
		{0, 30, true, ""},
		{2, 30, true, ""},
		{3, 30, false, ReasonShare},
		{0, 5, true, ""}, // at least one
		{1, 5, false, ReasonShare},
		{0, 0, false, ReasonShare}, // no capacity
	}
	for _, c := range cases {
		ok, reason := b.Allow(t0, "a", c.inflight, c.capacity)
		if ok != c.ok || reason != c.reason {
			t.Errorf("Allow(inflight %d, cap %d) = %v %q, want %v %q", c.inflight, c.capacity, ok, reason, c.ok, c.reason)
		}
	}
	if ok, reason := NewBoosts(0, 5).Allow(t0, "a", 0, 100); ok || reason != ReasonDisabled {
		t.Errorf("disabled: Allow = %v %q", ok, reason)
	}
	// Unlimited per tenant: any number of boosts.
	for i := 0; i < 1000; i++ {
		b.Record(t0, "a")
	}
	if ok, _ := b.Allow(t0, "a", 0, 30); !ok || b.Tenants() != 0 {
		t.Errorf("unlimited: refused or stored (%d tenants)", b.Tenants())
	}
}

func TestBoostRollingHour(t *testing.T) {
	const n = 3
	b := NewBoosts(0.5, n)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	allow := func(d time.Duration, tenant string) bool {
		ok, _ := b.Allow(at(d), tenant, 0, 10)
		return ok
	}
	for i, d := range []time.Duration{0, 10 * time.Minute, 20 * time.Minute} {
		if !allow(d, "a") {
			t.Fatalf("boost %d refused", i+1)
		}
		b.Record(at(d), "a")
	}
	steps := []struct {
		at     time.Duration
		tenant string
		ok     bool
	}{
		{30 * time.Minute, "a", false},                             // the (N+1)th within the hour
		{time.Hour - time.Nanosecond, "a", false},                  // oldest still counts
		{30 * time.Minute, "b", true},                              // other tenants unaffected
		{time.Hour, "a", true},                                     // oldest aged out exactly at +1h
		{time.Hour + 10*time.Minute - time.Nanosecond, "a", false}, // after recording at +1h
	}
	for _, s := range steps {
		ok, reason := b.Allow(at(s.at), s.tenant, 0, 10)
		if ok != s.ok {
			t.Fatalf("Allow(+%v, %s) = %v %q, want %v", s.at, s.tenant, ok, reason, s.ok)
		}
		if !ok && reason != ReasonTenantHourly {
			t.Fatalf("reason %q", reason)
		}
		if ok && s.tenant == "a" {
			b.Record(at(s.at), "a")
		}
	}
	if got := b.Count(at(time.Hour), "a"); got != n {
		t.Fatalf("Count = %d, want %d", got, n)
	}
	// The share check comes before the tenant check.
	if _, reason := b.Allow(at(time.Hour), "a", 5, 10); reason != ReasonShare {
		t.Fatalf("reason %q, want %q", reason, ReasonShare)
	}
}

func TestBoostRollingHourProperty(t *testing.T) {
	// Random attempts over 6 hours; boost whenever allowed. Exactness: every
	// half-open 60-minute window ending at a boost holds at most N boosts,
	// and every refusal happens with exactly N boosts in (now-1h, now].
	for _, n := range []int{1, 2, 5, 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := NewBoosts(1, n)
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			var done []time.Time
			now := t0
			inHour := func(now time.Time) int {
				c := 0
				for _, d := range done {
					if d.After(now.Add(-time.Hour)) && !d.After(now) {
						c++
					}
				}
				return c
			}
			refused := 0
			for now.Before(t0.Add(6 * time.Hour)) {
				now = now.Add(time.Duration(rng.Int64N(int64(40*time.Minute/time.Duration(n))) + 1))
				ok, _ := b.Allow(now, "t", 0, 1)
				c := inHour(now)
				if ok != (c < n) {
					t.Fatalf("at +%v: Allow = %v with %d boosts in the last hour (N=%d)", now.Sub(t0), ok, c, n)
				}
				if ok {
					b.Record(now, "t")
					done = append(done, now)
				} else {
					refused++
				}
				if got := b.Count(now, "t"); got != inHour(now) {
					t.Fatalf("Count = %d, want %d", got, inHour(now))
				}
			}
			if refused == 0 {
				t.Fatalf("test setup: never hit the limit")
			}
		})
	}
}

func TestBoostUpdateKeepsCounts(t *testing.T) {
	b := NewBoosts(0.1, 5)
	for i := 0; i < 4; i++ {
		b.Record(t0.Add(time.Duration(i)*time.Minute), "a")
	}
	now := t0.Add(10 * time.Minute)
	if ok, _ := b.Allow(now, "a", 0, 10); !ok {
		t.Fatal("4 of 5: refused")
	}
	// Share change only: counts untouched.
	b.Update(0.2, 5)
	if got := b.Count(now, "a"); got != 4 || b.Limit(10) != 2 {
		t.Fatalf("after share update: Count %d Limit %d", got, b.Limit(10))
	}
	// Lower the limit below the count: newest 3 kept, refused.
	b.Update(0.2, 3)
	if got := b.Count(now, "a"); got != 3 {
		t.Fatalf("after 5->3: Count = %d, want 3", got)
	}
	if ok, reason := b.Allow(now, "a", 0, 10); ok || reason != ReasonTenantHourly {
		t.Fatalf("after 5->3: Allow = %v %q", ok, reason)
	}
	// The oldest kept is the one at +1m: allowed again at +61m.
	if ok, _ := b.Allow(t0.Add(61*time.Minute), "a", 0, 10); !ok {
		t.Fatal("after 5->3: not allowed when the oldest kept aged out")
	}
	// Raise the limit: counts kept, 7 more allowed.
	b.Update(0.2, 10)
	if got := b.Count(now, "a"); got != 3 {
		t.Fatalf("after 3->10: Count = %d, want 3", got)
	}
	for i := 0; i < 7; i++ {
		if ok, _ := b.Allow(now, "a", 0, 10); !ok {
			t.Fatalf("after 3->10: boost %d refused", i+1)
		}
		b.Record(now, "a")
	}
	if ok, _ := b.Allow(now, "a", 0, 10); ok {
		t.Fatal("after 3->10: 11th allowed")
	}
	// To unlimited: counts dropped, always allowed (share permitting).
	b.Update(0.2, 0)
	if ok, _ := b.Allow(now, "a", 0, 10); !ok || b.Tenants() != 0 || b.Count(now, "a") != 0 {
		t.Fatal("unlimited: refused or counts kept")
	}
	// Disable.
	b.Update(0, 0)
	if ok, reason := b.Allow(now, "a", 0, 10); ok || reason != ReasonDisabled {
		t.Fatalf("disabled: %v %q", ok, reason)
	}
	if b.ShareMax() != 0 || b.PerTenantHourly() != 0 {
		t.Fatal("getters")
	}
}

func TestBoostPrune(t *testing.T) {
	b := NewBoosts(0.1, 4)
	for i := 0; i < 100; i++ {
		b.Record(t0, fmt.Sprint("t", i))
	}
	if b.Tenants() != 100 {
		t.Fatalf("Tenants = %d", b.Tenants())
	}
	if got := b.Prune(t0.Add(59 * time.Minute)); got != 0 {
		t.Fatalf("Prune before the hour dropped %d", got)
	}
	// Lazy sweep: each Record checks two tenants, so 50 Records an hour
	// later drop all 100 idle ones (the recording tenant stays).
	later := t0.Add(time.Hour)
	for i := 0; i < 60; i++ {
		b.Record(later, "busy")
	}
	if b.Tenants() != 1 {
		t.Fatalf("after sweeping: Tenants = %d, want 1", b.Tenants())
	}
	// Explicit Prune.
	for i := 0; i < 10; i++ {
		b.Record(later, fmt.Sprint("u", i))
	}
	if got := b.Prune(later.Add(time.Hour)); got != 11 || b.Tenants() != 0 {
		t.Fatalf("Prune dropped %d, %d left", got, b.Tenants())
	}
	// Counts after pruning start from zero, and the index stays consistent.
	b.Record(later.Add(time.Hour), "busy")
	if b.Count(later.Add(time.Hour), "busy") != 1 {
		t.Fatal("count after prune")
	}
}

func BenchmarkBoostsAllow(b *testing.B) {
	bs := NewBoosts(0.1, 20)
	for i := 0; i < 1000; i++ {
		for j := 0; j < 20; j++ {
			bs.Record(t0.Add(time.Duration(j)*time.Second), fmt.Sprint("tenant-", i))
		}
	}
	now := t0.Add(30 * time.Minute)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprint("tenant-", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		bs.Allow(now, names[i%len(names)], 3, 100)
		i++
	}
}

func BenchmarkBoostsRecord(b *testing.B) {
	bs := NewBoosts(0.1, 20)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprint("tenant-", i)
		bs.Record(t0, names[i])
	}
	now := t0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		bs.Record(now, names[i%len(names)])
		i++
	}
}

func TestBoostForget(t *testing.T) {
	now := time.Unix(0, 0)
	b := NewBoosts(1, 1)
	b.Record(now, "a")
	b.Record(now, "b")
	if ok, _ := b.Allow(now, "a", 0, 10); ok {
		t.Fatal("a allowed past its hourly limit")
	}
	b.Forget("a")
	b.Forget("missing")
	if b.Tenants() != 1 || b.Count(now, "a") != 0 || b.Count(now, "b") != 1 {
		t.Fatalf("after Forget: %d tenants, a %d, b %d", b.Tenants(), b.Count(now, "a"), b.Count(now, "b"))
	}
	if ok, _ := b.Allow(now, "a", 0, 10); !ok {
		t.Fatal("a forgotten but still refused")
	}
}

// ShareMax returns the configured share (after clamping).
func (b *Boosts) ShareMax() float64 { return b.share }

// Prune drops every tenant whose boosts have all aged out, and returns how
// many it dropped. O(tenants).
func (b *Boosts) Prune(now time.Time) int {
	cut := b.cutoff(now)
	dropped := 0
	for i := 0; i < len(b.list); {
		if e := b.list[i]; e.newest() <= cut {
			b.remove(e) // moves the last entry to i
			dropped++
		} else {
			i++
		}
	}
	return dropped
}
