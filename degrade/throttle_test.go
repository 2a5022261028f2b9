package degrade

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func mustRate(t testing.TB, s string) Rate {
	t.Helper()
	r, err := ParseRate(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestThrottleBurst(t *testing.T) {
	tests := []struct {
		rate  string
		burst int
	}{
		{"20/s", 20}, {"1200/m", 20}, {"30/m", 1}, {"2.5/s", 2}, {"5000tok/s", 5000}, {"100tok/m", 1}, {"1e300/s", maxBurst},
	}
	for _, tc := range tests {
		th := NewThrottle(mustRate(t, tc.rate))
		if th.burst != tc.burst {
			t.Errorf("%s: burst %d, want %d", tc.rate, th.burst, tc.burst)
		}
		if th.Rate() != mustRate(t, tc.rate) {
			t.Errorf("%s: Rate() = %v", tc.rate, th.Rate())
		}
	}
	for _, bad := range []Rate{{}, {PerSecond: -1}, {PerSecond: math.NaN()}, {PerSecond: math.Inf(1)}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewThrottle(%+v) did not panic", bad)
				}
			}()
			NewThrottle(bad)
		}()
	}
}

// TestThrottleLongRun offers far more than the rate for 1000 virtual seconds
// and checks that the admitted amount is rate x duration within 1% (the
// initial full bucket and one oversized request are the only excess allowed).
func TestThrottleLongRun(t *testing.T) {
	const dur = 1000 * time.Second
	oversized := func(r *rand.Rand) int { return 1 + r.IntN(12000) }
	tests := []struct {
		rate  string
		tick  time.Duration        // poll interval; 0: the client sleeps exactly retryAfter
		sizes func(*rand.Rand) int // request token estimates
		big   bool                 // sizes include requests larger than the bucket
	}{
		{"20/s", 5 * time.Millisecond, nil, false},
		{"1200/m", 3 * time.Millisecond, nil, false},
		{"30/m", 10 * time.Millisecond, nil, false},
		{"2.5/s", 7 * time.Millisecond, nil, false},
		{"5000tok/s", 2 * time.Millisecond, func(r *rand.Rand) int { return 1 + r.IntN(800) }, false},
		// Mixed sizes up to 2.4x the bucket: oversized requests are admitted
		// on a full bucket and leave a debt. Polling every 1ms, a full
		// bucket overflows for up to 2ms before the poll sees it; a client that
		// honours retryAfter loses nothing.
		{"5000tok/s", 2 * time.Millisecond, oversized, true},
		{"5000tok/s", 0, oversized, true},
		{"20/s", 0, nil, false},
		{"7/m", 0, nil, false},
		{"100tok/m", 100 * time.Millisecond, func(r *rand.Rand) int { return 1 + r.IntN(5) }, false},
	}
	for _, tc := range tests {
		name := tc.rate + "/poll=" + tc.tick.String()
		if tc.tick == 0 {
			name = tc.rate + "/retryAfter"
		}
		if tc.big {
			name += "/oversized"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			r := mustRate(t, tc.rate)
			th := NewThrottle(r)
			var admitted float64
			size := 1
			if tc.sizes != nil {
				size = tc.sizes(rng)
			}
			for now := t0; now.Sub(t0) < dur; {
				ok, retry := th.Admit(now, size)
				if tc.tick > 0 {
					now = now.Add(tc.tick)
				} else {
					now = now.Add(retry) // 0 after an admission: ask again at once
				}
				if ok {
					if r.Tokens {
						admitted += float64(size)
						size = tc.sizes(rng) // next request
					} else {
						admitted++
					}
				} else if retry <= 0 {
					t.Fatalf("refused with retryAfter %v", retry)
				}
			}
			want := r.PerSecond * dur.Seconds()
			t.Logf("admitted %.0f, rate x duration %.0f, deviation %+.3f%%", admitted, want, (admitted-want)/want*100)
			if dev := math.Abs(admitted-want) / want; dev > 0.01 {
				t.Fatalf("admitted %.0f over %v, want %.0f ±1%% (off by %.2f%%)", admitted, dur, want, dev*100)
			}
			if max := want + float64(th.burst) + 12000; admitted > max {
				t.Fatalf("admitted %.0f exceeds rate x duration + burst + largest request = %.0f", admitted, max)
			}
		})
	}
}

func TestThrottleRetryAfter(t *testing.T) {
	type call struct {
		at     time.Duration // after t0
		tokens int
		ok     bool
		retry  time.Duration // expected retryAfter when refused
	}
	tests := []struct {
		name  string
		rate  string
		calls []call
	}{
		{"request rate: empty bucket refills one per 50ms", "20/s", append(
			func() []call { // drain the 20-request bucket
				var c []call
				for range 20 {
					c = append(c, call{0, 0, true, 0})
				}
				return c
			}(),
			call{0, 0, false, 50 * time.Millisecond},
			call{10 * time.Millisecond, 0, false, 40 * time.Millisecond},
			call{50*time.Millisecond - 1, 0, false, 1},
			call{50 * time.Millisecond, 0, true, 0},
			call{50 * time.Millisecond, 0, false, 50 * time.Millisecond},
		)},
		{"request rate ignores tokens", "1/s", []call{
			{0, 1 << 20, true, 0},
			{0, 1, false, time.Second},
		}},
		{"token rate: cost is the estimate", "5000tok/s", []call{
			{0, 3000, true, 0},
			{0, 4000, false, 400 * time.Millisecond}, // 2000 present, 2000 missing
			{0, 2000, true, 0},
			{0, 0, false, 200 * time.Microsecond}, // zero estimate costs 1 token
		}},
		{"token rate: oversized request waits for a full bucket, then leaves a debt", "5000tok/s", []call{
			{0, 1000, true, 0},
			{0, 8000, false, 200 * time.Millisecond}, // needs the full 5000
			{200 * time.Millisecond, 8000, true, 0},  // bucket: 5000 - 8000 = -3000
			{200 * time.Millisecond, 100, false, 620 * time.Millisecond},
			{820 * time.Millisecond, 100, true, 0},
			{820 * time.Millisecond, 5000, false, time.Second},
			{1820 * time.Millisecond, 5000, true, 0},
		}},
		{"slow token rate, burst 1", "100tok/m", []call{
			{0, 30, true, 0}, // bucket 1 -> -29
			{0, 1, false, 18 * time.Second},
			{18 * time.Second, 1, true, 0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			th := NewThrottle(mustRate(t, tc.rate))
			for i, c := range tc.calls {
				ok, retry := th.Admit(t0.Add(c.at), c.tokens)
				if ok != c.ok || retry != c.retry {
					t.Fatalf("call #%d at %v tokens %d: (%v, %v), want (%v, %v)", i, c.at, c.tokens, ok, retry, c.ok, c.retry)
				}
			}
		})
	}
}

// TestThrottleRetryAfterExact: for random traffic, every refusal's
// retryAfter is the exact first instant (to the nanosecond) at which the same
// request would be admitted, and a refusal consumes nothing.
func TestThrottleRetryAfterExact(t *testing.T) {
	for _, rs := range []string{"20/s", "7/m", "3.3/s", "5000tok/s", "100tok/m", "333tok/s"} {
		t.Run(rs, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			th := NewThrottle(mustRate(t, rs))
			now := t0
			refusals := 0
			for range 5000 {
				gap := 200 * time.Millisecond
				if !th.r.Tokens {
					gap = time.Duration(float64(time.Second) / th.r.PerSecond) // about one refill per call: half refused
				}
				now = now.Add(time.Duration(rng.Int64N(int64(gap))))
				n := 1 + rng.IntN(2*th.burst+1)
				before := th.lim.TokensAt(now)
				ok, retry := th.Admit(now, n)
				if ok {
					continue
				}
				refusals++
				if after := th.lim.TokensAt(now); after != before {
					t.Fatalf("refusal changed the bucket: %v -> %v", before, after)
				}
				need := float64(n)
				if !th.r.Tokens {
					need = 1
				}
				need = math.Min(need, float64(th.burst))
				if got := th.lim.TokensAt(now.Add(retry)); got < need {
					t.Fatalf("at now+retryAfter(%v) the bucket holds %v < %v", retry, got, need)
				}
				if got := th.lim.TokensAt(now.Add(retry - 1)); got >= need {
					t.Fatalf("retryAfter %v is not minimal: 1ns earlier the bucket holds %v >= %v", retry, got, need)
				}
				// And Admit agrees, without anything in between.
				if ok, _ := th.Admit(now.Add(retry), n); !ok {
					t.Fatalf("Admit(now+retryAfter=%v, %d) refused", retry, n)
				}
				now = now.Add(retry)
			}
			if refusals < 100 {
				t.Fatalf("only %d refusals: test does not exercise the refusal path", refusals)
			}
		})
	}
}

// TestThrottleRefusalsConsumeNothing: a throttle hammered with extra,
// refused requests admits exactly the same schedule as one left alone.
func TestThrottleRefusalsConsumeNothing(t *testing.T) {
	for _, rs := range []string{"20/s", "5000tok/s", "100tok/m"} {
		t.Run(rs, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			quiet, busy := NewThrottle(mustRate(t, rs)), NewThrottle(mustRate(t, rs))
			hammered := 0
			for tick := range 30000 {
				now := t0.Add(time.Duration(tick) * time.Millisecond)
				n := 1 + rng.IntN(2*quiet.burst)
				okQ, retryQ := quiet.Admit(now, n)
				okB, retryB := busy.Admit(now, n)
				if okQ != okB || retryQ != retryB {
					t.Fatalf("tick %d: quiet (%v, %v), busy (%v, %v)", tick, okQ, retryQ, okB, retryB)
				}
				if okB {
					continue
				}
				// n was refused, so anything at least as large is refused
				// too at this instant: hammer busy with those.
				for range 10 {
					if ok, _ := busy.Admit(now, n+rng.IntN(10000)); ok {
						t.Fatalf("tick %d: a larger request was admitted after a refusal", tick)
					}
					hammered++
				}
			}
			end := t0.Add(30001 * time.Millisecond)
			if a, b := busy.lim.TokensAt(end), quiet.lim.TokensAt(end); a != b {
				t.Fatalf("buckets diverged: %v vs %v", a, b)
			}
			if hammered < 3000 {
				t.Fatalf("only %d refused extra requests", hammered)
			}
		})
	}
}

func TestThrottleTimeBackwards(t *testing.T) {
	th := NewThrottle(mustRate(t, "10/s"))
	later := t0.Add(time.Hour)
	for range 10 {
		if ok, _ := th.Admit(later, 1); !ok {
			t.Fatal("full bucket refused")
		}
	}
	// An earlier time is treated as `later`: empty bucket, 100ms to wait
	// after `later`, reported relative to the caller's t0.
	if ok, retry := th.Admit(t0, 1); ok || retry != time.Hour+100*time.Millisecond {
		t.Fatalf("Admit(earlier) = %v, %v; want false, 1h0m0.1s", ok, retry)
	}
	// And it must not have rewound the bucket's clock (which would refill
	// the hour twice).
	if ok, _ := th.Admit(later.Add(100*time.Millisecond), 1); !ok {
		t.Fatal("refused after the refill")
	}
	if ok, _ := th.Admit(later.Add(100*time.Millisecond), 1); ok {
		t.Fatal("admitted twice: the bucket was refilled by the backwards time")
	}
}

func TestThrottleConcurrent(t *testing.T) {
	th := NewThrottle(mustRate(t, "5000tok/s"))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				if ok, _ := th.Admit(t0, 1+(g+i)%3); ok {
					admitted.Add(int64(1 + (g+i)%3))
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got > 5000 || got < 4998 {
		t.Fatalf("admitted %d tokens at one instant from a 5000 bucket", got)
	}
}

func BenchmarkThrottleAdmit(b *testing.B) {
	th := NewThrottle(Rate{PerSecond: 1000})
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Microsecond)
		th.Admit(now, 1)
	}
}

// An oversized token request leaves at most MaxDebt of refill owing: the
// next request waits a minute at most, not the days its full cost would
// take to refill (10^9 tokens at 100 tokens/s is 115 days).
func TestThrottleDebtCapped(t *testing.T) {
	now := time.Unix(0, 0)
	th := NewThrottle(mustRate(t, "100tok/s"))
	if ok, _ := th.Admit(now, 1e9); !ok {
		t.Fatal("oversized request refused on a full bucket")
	}
	ok, wait := th.Admit(now, 1)
	if ok || wait <= 0 || wait > time.Minute {
		t.Fatalf("after an oversized request: ok %v, retryAfter %v; want a refusal of at most 1m", ok, wait)
	}
	if ok, _ := th.Admit(now.Add(wait), 1); !ok {
		t.Fatalf("refused again after the retryAfter %v", wait)
	}
	// A full bucket's worth after the debt: at most MaxDebt plus 1s.
	th2 := NewThrottle(mustRate(t, "100tok/s"))
	th2.Admit(now, 1e9)
	if _, w := th2.Admit(now, 100); w != MaxDebt+time.Second {
		t.Fatalf("a full bucket after the debt waits %v, want %v", w, MaxDebt+time.Second)
	}
}

// Peek answers as Admit would and consumes nothing, also for a caller whose
// now is behind the latest seen.
func TestThrottlePeek(t *testing.T) {
	now := time.Unix(0, 0)
	th := NewThrottle(mustRate(t, "2/s"))
	for range 5 {
		if ok, _ := th.Peek(now, 1); !ok {
			t.Fatal("Peek refused on a full bucket")
		}
	}
	th.Admit(now, 1)
	th.Admit(now, 1)
	ok, wait := th.Peek(now, 1)
	okA, waitA := th.Admit(now, 1)
	if ok || okA || wait != waitA {
		t.Fatalf("Peek (%v, %v) and Admit (%v, %v) disagree", ok, wait, okA, waitA)
	}
	if _, w := th.Peek(now.Add(-time.Second), 1); w != wait+time.Second {
		t.Fatalf("Peek from 1s behind: %v, want %v", w, wait+time.Second)
	}
}
