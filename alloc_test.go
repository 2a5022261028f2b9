package caddyfairqueue

import (
	"testing"
)

// maxOverheadAllocs bounds what fair_queue adds to reverse_proxy's
// allocations for one small served request (BenchmarkProxy's), measured as
// the difference of the two in one process, so Caddy's own allocations
// cancel out. Observed: 8 (admission, with the parsed request in it;
// ticket; body buffer; the body's timer and its func; the placeholders'
// provider; served headers; the request body's closer). Under the race
// detector, which makes sync.Pool drop a share of what is put back, the
// bound is looser.
const maxOverheadAllocs = 9

func overheadAllocsBound() float64 {
	if raceEnabled {
		return maxOverheadAllocs + 10
	}
	return maxOverheadAllocs
}

// TestProxyOverheadAllocs guards the request path's allocations: they are
// deterministic, unlike its time on a shared machine.
func TestProxyOverheadAllocs(t *testing.T) {
	cases, serve := proxyCases(t)
	allocs := make(map[string]float64, len(cases))
	for _, c := range cases {
		if err := serve(c.h); err != nil { // warm: connection, pools, metric children
			t.Fatalf("%s: %v", c.name, err)
		}
		var err error
		allocs[c.name] = testing.AllocsPerRun(200, func() {
			if e := serve(c.h); e != nil && err == nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	for _, name := range []string{"fair_queue", "fair_queue_approx"} {
		if over := allocs[name] - allocs["plain"]; over > overheadAllocsBound() {
			t.Errorf("%s: %.0f allocations per request over plain reverse_proxy's %.0f, want at most %.0f",
				name, over, allocs["plain"], overheadAllocsBound())
		}
	}
	t.Logf("allocations per request: %v", allocs)
}
