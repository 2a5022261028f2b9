package degrade_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

func Example() {
	var steps []degrade.Step
	for _, line := range []string{
		"L1 trigger 0.70 recover 0.60 pause batch",
		"L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048",
		"L3 trigger 0.95 recover 0.90 throttle realtime 20/s",
	} {
		s, err := degrade.ParseStep(strings.Fields(line))
		if err != nil {
			panic(err)
		}
		steps = append(steps, s)
	}
	l, err := degrade.NewLadder(steps, 10*time.Second, []string{"realtime", "interactive", "batch"})
	if err != nil {
		panic(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, o := range []struct {
		after time.Duration
		water float64
	}{
		{0, 0.50},
		{1 * time.Second, 0.97},  // jump: all three engage at once
		{2 * time.Second, 0.30},  // within the hold: nothing moves
		{11 * time.Second, 0.80}, // hold elapsed: L3 releases, L2 stays (0.80 >= 0.75)
		{12 * time.Second, 0.55}, // L2 and L1 release
	} {
		for _, tr := range l.Observe(start.Add(o.after), o.water) {
			fmt.Println(o.after, tr)
		}
	}
	fmt.Println("level", l.Level(), "active", l.Active())
	// Output:
	// 1s degrade L1 engaged (level 0 -> 1, water 0.970)
	// 1s degrade L2 engaged (level 1 -> 2, water 0.970)
	// 1s degrade L3 engaged (level 2 -> 3, water 0.970)
	// 11s degrade L3 released (level 3 -> 2, water 0.800)
	// 12s degrade L2 released (level 2 -> 1, water 0.550)
	// 12s degrade L1 released (level 1 -> 0, water 0.550)
	// level 0 active []
}

func ExampleThrottle_Admit() {
	r, _ := degrade.ParseRate("5000tok/s")
	th := degrade.NewThrottle(r)
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	fmt.Println(th.Admit(now, 8000)) // larger than the 5000 bucket: admitted on a full bucket, leaves a 3000 debt
	fmt.Println(th.Admit(now, 500))  // must wait for the debt plus 500 tokens
	// Output:
	// true 0s
	// false 700ms
}

func ExampleCircuit() {
	c, err := degrade.NewCircuit(degrade.CircuitConfig{Order: []string{"low", "mid", "high"}}) // trigger 1.3, recover 1.0, hold 10s, window 10s
	if err != nil {
		panic(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	const capacity = 100 // units/s the upstreams can serve
	for ms := 100; ms <= 60_000; ms += 100 {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		load := 1.5 // demand / capacity: 40 % low, 30 % mid, 30 % high
		if ms > 30_000 {
			load = 0.8
		}
		admitted := 0.0
		for _, a := range []struct {
			tier  string
			share float64
		}{{"low", 0.4}, {"mid", 0.3}, {"high", 0.3}} {
			c.Arrive(now, a.tier, load*capacity*a.share/10) // every arrival, shed ones included
			if !c.Shed(a.tier) {
				admitted += load * a.share
			}
		}
		// The upstreams are saturated, with requests waiting, while what
		// is admitted exceeds what they serve.
		c.Saturated(now, admitted > 1)
		for _, tr := range c.Observe(now, capacity) {
			fmt.Println(now.Sub(start), tr)
		}
	}
	fmt.Println("shed low:", c.Shed("low"))
	// The fresh window fills: 1.5x reads over 1.3 after 8.7 s, and the
	// upstreams have been saturated for 90% of the window half a second later; mid
	// and high (0.9x) stay. From 30 s the window drains toward 0.8x; low
	// comes back once demand with it readmitted reads under 1.0.

	// Output:
	// 9.2s circuit shed tier low (level 0 -> 1, demand 1.380x capacity, saturated 91% of the window)
	// 37.4s circuit readmitted tier low (level 1 -> 0, demand 0.997x capacity, saturated 0% of the window)
	// shed low: false
}
