package budget

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestColdRate(t *testing.T) {
	var c ColdRate
	if r := c.Rate(t0, 4); r != 0 {
		t.Fatalf("nothing dispatched: Rate %v, want 0 (unknown)", r)
	}
	for i := 0; i < 4; i++ {
		c.Start(t0, 100)
	}
	if r := c.Rate(t0, 4); r != 0 {
		t.Fatalf("ages 0: Rate %v, want 0 (unknown)", r)
	}
	// Four requests running for 2 s: each takes at least 2 s, so 4 slots
	// do at most 4 x 100 / 2 = 200 units/s.
	if r := c.Rate(t0.Add(2*time.Second), 4); r != 200 {
		t.Fatalf("after 2 s: Rate %v, want 200", r)
	}
	// One completes at 3 s (service 3 s): times 3, 3, 3, 3 -> 133.3.
	c.Finish(t0.Add(3*time.Second), t0, 100)
	if r := c.Rate(t0.Add(3*time.Second), 4); math.Abs(r-400.0/3) > 1e-9 {
		t.Fatalf("after a completion: Rate %v, want 133.33", r)
	}
	if c.Completions() != 1 {
		t.Fatalf("Completions %d", c.Completions())
	}
	// Slots scale the bound; none means no rate.
	if r := c.Rate(t0.Add(3*time.Second), 8); math.Abs(r-800.0/3) > 1e-9 {
		t.Fatalf("8 slots: Rate %v", r)
	}
	if r := c.Rate(t0.Add(3*time.Second), 0); r != 0 {
		t.Fatalf("0 slots: Rate %v", r)
	}
	// A Finish without a Start is ignored.
	var d ColdRate
	d.Finish(t0, t0, 100)
	if d.Completions() != 0 {
		t.Fatal("Finish without Start counted")
	}
}

// The cold bound is an upper bound of the rate of busy slots from the first
// moment: slots kept busy with random service times (uniform 2..8 s) and
// costs; at every second the bound is >= the rate realised so far and
// converges to the long-run rate.
func TestColdRateBoundsTheRate(t *testing.T) {
	const slots = 8
	rng := rand.New(rand.NewPCG(3, 9))
	var c ColdRate
	end := make([]time.Time, slots)
	start := make([]time.Time, slots)
	cost := make([]float64, slots)
	var totalCost, totalTime float64
	draw := func(i int, at time.Time) {
		d := 2*time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
		start[i], end[i], cost[i] = at, at.Add(d), 100+float64(rng.IntN(900))
		totalCost += cost[i]
		totalTime += d.Seconds()
		c.Start(at, cost[i])
	}
	for i := range end {
		draw(i, t0)
	}
	// The long-run rate of this process: slots x E[cost] / E[service].
	want := slots * 550.0 / 5.0
	done := 0.0 // cost completed
	for s := 1; s <= 600; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for i := range end {
			for !end[i].After(now) {
				c.Finish(end[i], start[i], cost[i])
				done += cost[i]
				draw(i, end[i])
			}
		}
		r := c.Rate(now, slots)
		if realised := done / float64(s); r < realised {
			t.Fatalf("at %ds: bound %.1f below the rate realised so far %.1f", s, r, realised)
		}
		if s >= 300 && math.Abs(r-want)/want > 0.08 {
			t.Fatalf("at %ds: bound %.1f, want the long-run rate %.1f within 8%%", s, r, want)
		}
	}
}

func TestThroughputMean(t *testing.T) {
	// Saturated at 100 units/s per upstream, 2 upstreams: the window mean
	// is the rate; it is 0 without samples and at least the low quantile.
	tp := NewThroughput(ThroughputConfig{})
	tp.SetBusy(t0, true)
	if s := tp.Stats(t0, 2); s.Mean != 0 {
		t.Fatalf("no samples: Mean %v", s.Mean)
	}
	steady(tp, t0, t0.Add(2*time.Minute), 100*time.Millisecond, 20, 2)
	s := tp.Stats(t0.Add(2*time.Minute), 2)
	if !within(s.Mean, 100, 0.03) || s.Mean < s.Measured-1e-9 {
		t.Fatalf("Mean %.2f (Measured %.2f), want 100 ±3%% and >= Measured", s.Mean, s.Measured)
	}
}
