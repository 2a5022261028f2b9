package quota

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The scenarios of the stores (Memory, Local, Redis) are in
// internal/quotatest, run by store_test.go here and by package cluster.

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
