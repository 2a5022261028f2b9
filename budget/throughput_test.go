package budget

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// within reports whether got is within tol (relative) of want.
func within(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol*math.Abs(want)
}

// steady drives tp with one completion of cost every interval from start
// (exclusive) to end (inclusive), healthy upstreams, and returns the last
// completion time.
func steady(tp *Throughput, start, end time.Time, interval time.Duration, cost float64, healthy int) time.Time {
	at := start
	for {
		next := at.Add(interval)
		if next.After(end) {
			return at
		}
		at = next
		tp.Observe(at, cost, healthy)
	}
}

func TestThroughputSteadyConvergence(t *testing.T) {
	// Saturated throughout, prior off by 10x: after two windows the rate is
	// within 5% of the true completion rate, and stays there.
	cases := []struct {
		name     string
		interval time.Duration
		cost     float64
		healthy  int
	}{
		{"dense", 50 * time.Millisecond, 100, 2},
		{"per-second", time.Second, 500, 1},
		{"odd", 333 * time.Millisecond, 7, 3},
		{"sparse 0.4/s", 2500 * time.Millisecond, 1000, 1},
		{"very sparse 0.1/s", 10 * time.Second, 2000, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.cost / c.interval.Seconds()
			tp := NewThroughput(ThroughputConfig{Prior: 10 * want / float64(c.healthy)})
			tp.SetBusy(t0, true)
			last := steady(tp, t0, t0.Add(2*DefaultWindow), c.interval, c.cost, c.healthy)
			for i := 0; i < 60; i++ { // check once a second for another minute
				now := t0.Add(2*DefaultWindow + time.Duration(i)*time.Second)
				last = steady(tp, last, now, c.interval, c.cost, c.healthy)
				if got := tp.Rate(now, c.healthy); !within(got, want, 0.05) {
					t.Fatalf("at +%v: Rate = %.3f, want %.3f ±5%% (stats %+v)", now.Sub(t0), got, want, tp.Stats(now, c.healthy))
				}
			}
		})
	}
}

// longTail simulates slots continuously busy (saturated) with long-tailed
// request durations (Pareto, alpha 1.5) and costs proportional to duration;
// it returns the true long-run rate and the rates read every second after
// the first two windows.
func longTail(t *testing.T, seed uint64, slots int, minDur, maxDur, dur time.Duration) (mean float64, rates []float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	next := make([]time.Time, slots) // completion time of the slot's current request
	cost := make([]float64, slots)   // its cost
	draw := func(from time.Time) (time.Time, float64) {
		d := time.Duration(float64(minDur) / math.Pow(1-rng.Float64(), 1/1.5))
		d = min(d, maxDur)                   // max_tokens bounds a generation
		return from.Add(d), d.Seconds() * 40 // 40 tokens/s of generation
	}
	for i := range next {
		next[i], cost[i] = draw(t0)
	}
	var total float64
	end := t0.Add(dur)
	tick := t0.Add(2 * DefaultWindow)
	for {
		// Earliest completion.
		k := 0
		for i := range next {
			if next[i].Before(next[k]) {
				k = i
			}
		}
		for !tick.After(next[k]) && !tick.After(end) {
			rates = append(rates, tp.Rate(tick, 1))
			tick = tick.Add(time.Second)
		}
		if next[k].After(end) {
			break
		}
		tp.Observe(next[k], cost[k], 1)
		total += cost[k]
		next[k], cost[k] = draw(next[k])
	}
	return total / dur.Seconds(), rates
}

func TestThroughputLongTailIsPessimisticNotZero(t *testing.T) {
	// 4 slots, request durations Pareto(alpha 1.5, min 2s, capped at 45s):
	// heavy tail, so many 5s buckets see no completion while saturated. The low
	// quantile must stay below the true mean most of the time (pessimistic),
	// never fall to 0, and not collapse far below the mean.
	// The modelled throughput is exactly 4×40 = 160 units/s (cost is
	// proportional to duration, max_tokens caps a duration at 45s); only the
	// timing of completions is lumpy. Tolerances: median reading in
	// [0.6, 1.0]×mean, every reading in [0.3, 1.3]×mean, at least 95% of
	// readings <= 1.05×mean.
	for _, seed := range []uint64{1, 2, 3, 4, 5} {
		mean, rates := longTail(t, seed, 4, 2*time.Second, 45*time.Second, 2*time.Hour)
		var below int
		lo, hi := math.Inf(1), 0.0
		for _, r := range rates {
			lo, hi = math.Min(lo, r), math.Max(hi, r)
			if r <= 1.05*mean {
				below++
			}
		}
		sorted := append([]float64(nil), rates...)
		med := quantile(sorted, 0.5)
		frac := float64(below) / float64(len(rates))
		t.Logf("seed %d: mean %.1f, readings min %.2f med %.2f max %.2f (×mean), <=1.05×mean %.0f%%",
			seed, mean, lo/mean, med/mean, hi/mean, 100*frac)
		if lo < 0.3*mean || hi > 1.3*mean || med < 0.6*mean || med > mean || frac < 0.95 {
			t.Errorf("seed %d: out of tolerance", seed)
		}
	}
}

func TestThroughputBurstyCompletions(t *testing.T) {
	// Saturated, completions arrive in clumps: bursts of 10..14 completions
	// at irregular gaps of 6..16s (seeded). Most 5s buckets hold no
	// completion, so a plain per-bucket 25th percentile would be 0; the
	// grouped samples give a rate that is pessimistic but not collapsed.
	// Readings every second after 20 minutes. Tolerances, against the
	// long-run mean: every reading >= 0.4×, median in [0.6, 1.0]×. Against
	// the rate realised in the estimator's own window (which swings with the
	// random gaps): every reading in [0.4, 1.3]×, median in [0.6, 1.0]×, at
	// most 5% of readings above 1.05×.
	const cost = 300.0
	dur := time.Hour
	rng := rand.New(rand.NewPCG(42, 42))
	type burst struct {
		at time.Time
		n  int
	}
	var bursts []burst
	var total float64
	perBucket := map[int64]int{}
	for at := t0.Add(6 * time.Second); !at.After(t0.Add(dur)); at = at.Add(time.Duration(6000+rng.IntN(10001)) * time.Millisecond) {
		n := 10 + rng.IntN(5)
		bursts = append(bursts, burst{at, n})
		total += float64(n) * cost
		perBucket[int64(at.Sub(t0)/(5*time.Second))] += n
	}
	mean := total / dur.Seconds()
	buckets := int(dur / (5 * time.Second))
	emptyBuckets := 0
	for k := 0; k < buckets; k++ {
		if perBucket[int64(k)] == 0 {
			emptyBuckets++
		}
	}
	if float64(emptyBuckets)/float64(buckets) <= 2*DefaultQuantile {
		t.Fatalf("test setup: only %d/%d buckets empty", emptyBuckets, buckets)
	}
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	var readings, vsWindow []float64
	i := 0
	for now := t0; !now.After(t0.Add(dur)); now = now.Add(time.Second) {
		for ; i < len(bursts) && !bursts[i].at.After(now); i++ {
			for j := 0; j < bursts[i].n; j++ {
				tp.Observe(bursts[i].at, cost, 1)
			}
		}
		if now.Sub(t0) >= 20*time.Minute {
			r := tp.Rate(now, 1)
			readings = append(readings, r/mean)
			// The rate realised in the window the estimator looks at: the
			// 12 complete 5s buckets before the current one.
			end := t0.Add(now.Sub(t0).Truncate(5 * time.Second))
			start := end.Add(-DefaultWindow)
			var c float64
			for _, b := range bursts {
				if !b.at.Before(start) && b.at.Before(end) {
					c += float64(b.n) * cost
				}
			}
			vsWindow = append(vsWindow, r/(c/DefaultWindow.Seconds()))
		}
	}
	lo, hi := slices.Min(readings), slices.Max(readings)
	med := quantile(readings, 0.5)
	t.Logf("empty buckets %d/%d; readings min %.2f med %.2f max %.2f ×mean", emptyBuckets, buckets, lo, med, hi)
	wlo, whi := slices.Min(vsWindow), slices.Max(vsWindow)
	wmed := quantile(vsWindow, 0.5)
	above := 0
	for _, x := range vsWindow {
		if x > 1.05 {
			above++
		}
	}
	t.Logf("vs the window's realised rate: min %.2f med %.2f max %.2f, above 1.05: %d/%d", wlo, wmed, whi, above, len(vsWindow))
	if lo < 0.4 || med < 0.6 || med > 1 {
		t.Errorf("vs the long-run mean: out of tolerance")
	}
	if wlo < 0.4 || wmed < 0.6 || wmed > 1 || whi > 1.3 || float64(above) > 0.05*float64(len(vsWindow)) {
		t.Errorf("vs the window's realised rate: out of tolerance")
	}
}

func TestThroughputIdleDoesNotCollapse(t *testing.T) {
	const want = 200.0 // 20 units every 100ms
	tp := NewThroughput(ThroughputConfig{Prior: 5})
	tp.SetBusy(t0, true)
	last := steady(tp, t0, t0.Add(2*time.Minute), 100*time.Millisecond, 20, 1)
	now := t0.Add(2 * time.Minute)
	if got := tp.Rate(now, 1); !within(got, want, 0.05) {
		t.Fatalf("saturated: Rate = %.2f, want %.2f ±5%%", got, want)
	}

	// Ten idle minutes with a trickle of completions at a tenth of the rate
	// (demand-bound): ignored, the rate holds (the window empties, and the
	// learned rate is used, not the prior).
	tp.SetBusy(now, false)
	for i := 1; i <= 600; i++ {
		now = t0.Add(2*time.Minute + time.Duration(i)*time.Second)
		if i%2 == 0 {
			tp.Observe(now, 40, 1) // 20 units/s
		}
		if got := tp.Rate(now, 1); !within(got, want, 0.05) {
			t.Fatalf("idle +%ds: Rate = %.2f, want %.2f ±5%%", i, got, want)
		}
	}

	// Half-busy buckets: 2.5s saturated at the same rate, 2.5s idle with no
	// completions, for 3 minutes. Busy time, not wall time, is the
	// denominator: the rate stays at 200, not 100.
	start := now
	for cycle := 0; cycle < 36; cycle++ {
		tp.SetBusy(now, true)
		last = steady(tp, now, now.Add(2500*time.Millisecond), 100*time.Millisecond, 20, 1)
		now = now.Add(2500 * time.Millisecond)
		tp.SetBusy(now, false)
		now = now.Add(2500 * time.Millisecond)
		if now.Sub(start) > DefaultWindow {
			if got := tp.Rate(now, 1); !within(got, want, 0.05) {
				t.Fatalf("half-busy at +%v: Rate = %.2f, want %.2f ±5%%", now.Sub(start), got, want)
			}
		}
	}
	_ = last
}

func TestThroughputHealthyScaling(t *testing.T) {
	// Two upstreams, 150 units/s each.
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	last := steady(tp, t0, t0.Add(2*time.Minute), 100*time.Millisecond, 30, 2)
	now := t0.Add(2 * time.Minute)
	two := tp.Rate(now, 2)
	if !within(two, 300, 0.05) {
		t.Fatalf("Rate(2) = %.2f, want 300 ±5%%", two)
	}
	if one := tp.Rate(now, 1); one != two/2 {
		t.Fatalf("Rate(1) = %v, want exactly half of %v", one, two)
	}
	if back := tp.Rate(now, 2); back != two {
		t.Fatalf("Rate(2) again = %v, want %v", back, two)
	}
	if z := tp.Rate(now, 0); z != 0 {
		t.Fatalf("Rate(0) = %v, want 0", z)
	}
	// One upstream is down for two minutes: completions halve, but they are
	// normalised by healthy=1, so Rate(1) stays at 150 throughout (no
	// poisoning of the window by the capacity change)...
	start := now
	for i := 1; i <= 120; i++ {
		now = start.Add(time.Duration(i) * time.Second)
		last = steady(tp, last, now, 200*time.Millisecond, 30, 1)
		if got := tp.Rate(now, 1); !within(got, 150, 0.05) {
			t.Fatalf("one down +%ds: Rate(1) = %.2f, want 150 ±5%%", i, got)
		}
	}
	// ...and when it comes back, Rate(2) is 300 at once.
	if got := tp.Rate(now, 2); !within(got, 300, 0.05) {
		t.Fatalf("restored: Rate(2) = %.2f, want 300 ±5%%", got)
	}
}

func TestThroughputColdStart(t *testing.T) {
	// Prior 50/s per upstream; true rate 100/s per upstream. Warmup is
	// Window/4 = 15s = 3 buckets, so the measurement weight is the busy time
	// covered / 15s.
	tp := NewThroughput(ThroughputConfig{Prior: 50})
	if got := tp.Rate(t0, 3); got != 150 {
		t.Fatalf("no data: Rate(3) = %v, want prior×3 = 150", got)
	}
	if s := tp.Stats(t0, 3); s.Samples != 0 || s.PriorWeight != 1 {
		t.Fatalf("no data: stats %+v", s)
	}
	tp.SetBusy(t0, true)
	last := t0
	cases := []struct {
		at   time.Duration
		want float64 // expected per-upstream rate
		w    float64 // expected prior weight
	}{
		{4 * time.Second, 50, 1},                         // no complete bucket yet
		{5 * time.Second, 50 + (100-50)*1.0/3, 2.0 / 3},  // 1 bucket of 3
		{10 * time.Second, 50 + (100-50)*2.0/3, 1.0 / 3}, // 2 buckets of 3
		{15 * time.Second, 100, 0},                       // warm
		{50 * time.Second, 100, 0},
	}
	for _, c := range cases {
		now := t0.Add(c.at)
		last = steady(tp, last, now, 100*time.Millisecond, 10, 1)
		s := tp.Stats(now, 1)
		// ±3%: the first bucket misses the completion at its very start.
		if !within(s.Rate, c.want, 0.03) || math.Abs(s.PriorWeight-c.w) > 1e-9 {
			t.Errorf("at %v: rate %.2f weight %.3f, want %.2f ±3%% weight %.3f (%+v)", c.at, s.Rate, s.PriorWeight, c.want, c.w, s)
		}
	}

	// No prior: 0 until data, then the measurement alone.
	np := NewThroughput(ThroughputConfig{})
	np.SetBusy(t0, true)
	if got := np.Rate(t0.Add(time.Second), 1); got != 0 {
		t.Fatalf("no prior, no data: Rate = %v, want 0", got)
	}
	steady(np, t0, t0.Add(5*time.Second), 100*time.Millisecond, 10, 1)
	if got := np.Rate(t0.Add(5*time.Second), 1); !within(got, 100, 0.03) {
		t.Fatalf("no prior, one bucket: Rate = %.2f, want 100 ±3%%", got)
	}
}

func TestThroughputStall(t *testing.T) {
	// Saturated and then nothing completes for a whole window: the rate falls
	// to 0 (the upstreams are stalled; every ETA is Never and requests fail
	// fast). A zero is never learned: after an idle spell the rate resumes
	// from the last non-zero warmed-up measurement (taken as the stall set
	// in, so lower than before it, but not 0).
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	steady(tp, t0, t0.Add(2*time.Minute), 100*time.Millisecond, 10, 1)
	now := t0.Add(2 * time.Minute)
	if got := tp.Rate(now, 1); !within(got, 100, 0.05) {
		t.Fatalf("before stall: Rate = %.2f", got)
	}
	prev := tp.Rate(now, 1)
	for i := 5; i <= 65; i += 5 {
		now = t0.Add(2*time.Minute + time.Duration(i)*time.Second)
		got := tp.Rate(now, 1)
		if got > prev {
			t.Fatalf("stall +%ds: rate rose %.2f -> %.2f", i, prev, got)
		}
		prev = got
	}
	if prev != 0 {
		t.Fatalf("after a window of stall: Rate = %.2f, want 0", prev)
	}
	learned := tp.Stats(now, 1).Learned
	if !(learned > 0 && learned < 100) {
		t.Fatalf("learned %v, want in (0, 100)", learned)
	}
	tp.SetBusy(now, false)
	now = now.Add(2 * DefaultWindow)
	if got := tp.Rate(now, 1); got != learned {
		t.Fatalf("after idle: Rate = %v, want the learned %v", got, learned)
	}
}

func TestThroughputClockEdges(t *testing.T) {
	tp := NewThroughput(ThroughputConfig{Prior: 10})
	tp.SetBusy(t0, true)
	steady(tp, t0, t0.Add(time.Minute), 100*time.Millisecond, 10, 1)
	// Time going backwards is treated as the latest time seen.
	tp.Observe(t0, 10, 1)
	if got := tp.Rate(t0, 1); !within(got, 100, 0.05) {
		t.Fatalf("backwards: Rate = %.2f", got)
	}
	// A jump of a day while not busy: the window is empty, learned rate
	// holds. Garbage costs are ignored.
	tp.SetBusy(t0.Add(time.Minute), false)
	for _, c := range []float64{-1, math.NaN(), math.Inf(1)} {
		tp.Observe(t0.Add(time.Minute), c, 1)
	}
	if got := tp.Rate(t0.Add(24*time.Hour), 1); !within(got, 100, 0.05) {
		t.Fatalf("after a day idle: Rate = %.2f", got)
	}
	// Defaults and clamps.
	d := NewThroughput(ThroughputConfig{Quantile: 7, Buckets: -1, Window: -time.Second})
	if d.width != 5*time.Second || d.q != 1 || d.minN != DefaultMinCompletions || d.warmup != 15*time.Second {
		t.Fatalf("defaults: width %v q %v minN %v warmup %v", d.width, d.q, d.minN, d.warmup)
	}
}

func TestMeanCost(t *testing.T) {
	tp := NewThroughput(ThroughputConfig{})
	if got := tp.MeanCost(t0); got != 0 {
		t.Fatalf("empty MeanCost = %v", got)
	}
	tp.Observe(t0.Add(time.Second), 100, 1) // not busy: still counts
	tp.Observe(t0.Add(2*time.Second), 300, 1)
	if got := tp.MeanCost(t0.Add(3 * time.Second)); got != 200 {
		t.Fatalf("MeanCost = %v, want 200", got)
	}
	if got := tp.MeanCost(t0.Add(time.Hour)); got != 200 {
		t.Fatalf("MeanCost after the window = %v, want the last mean 200", got)
	}
}

func TestQuantile(t *testing.T) {
	cases := []struct {
		xs   []float64
		q    float64
		want float64
	}{
		{nil, 0.25, 0},
		{[]float64{7}, 0.25, 7},
		{[]float64{4, 1, 3, 2}, 0.25, 1.75},
		{[]float64{4, 1, 3, 2}, 1, 4},
		{[]float64{5, 1, 2, 3, 4}, 0.25, 2},
		{[]float64{5, 1, 2, 3, 4}, 0.5, 3},
	}
	for _, c := range cases {
		if got := quantile(append([]float64(nil), c.xs...), c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile(%v, %v) = %v, want %v", c.xs, c.q, got, c.want)
		}
	}
}

func BenchmarkThroughputObserve(b *testing.B) {
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	now := t0
	tp.SetBusy(now, true)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		tp.Observe(now, 100, 2)
	}
}

func BenchmarkThroughputRate(b *testing.B) {
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	now := steady(tp, t0, t0.Add(2*time.Minute), 10*time.Millisecond, 100, 2)
	b.ReportAllocs()
	var sink float64
	for b.Loop() {
		now = now.Add(time.Millisecond) // a new bucket every 5000 calls
		sink += tp.Rate(now, 2)
	}
	_ = sink
}

func BenchmarkThroughputRateNewBucketEveryCall(b *testing.B) {
	// Worst case: each call lands in a new bucket and recomputes.
	tp := NewThroughput(ThroughputConfig{Prior: 1})
	tp.SetBusy(t0, true)
	now := steady(tp, t0, t0.Add(2*time.Minute), 10*time.Millisecond, 100, 2)
	b.ReportAllocs()
	var sink float64
	for b.Loop() {
		now = now.Add(5 * time.Second)
		tp.Observe(now, 100, 2)
		sink += tp.Rate(now, 2)
	}
	_ = sink
}
