package e2e

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestClusterSharedSlotsPerUpstream: three gateways sharing a pool of two
// model servers of 4 slots each, each gateway flooded as if it alone had
// the pool: no model server ever runs a 5th request, that is, no request
// waits in a fake's own queue for one of its 4 slots (a request that does
// waits for a running one to finish, 45 ms or more here; the hand-over of
// a slot, the next request arriving a moment before the fake has counted
// the last one out, is a millisecond or two). Before, the pool's total of
// 8 held while one server ran a 5th: a grant the others left no room for
// on any upstream sent a request to the least loaded one.
func TestClusterSharedSlotsPerUpstream(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fakes := startFakes(t, 2, "cperup", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	_, bases := startSlotGateways(t, rs, 3, "2s", false, fakes)
	flood := startSlotFlood(t, bases)
	flood.waitServed(t, "the flood through all three", 60, 0, 1, 2)
	flood.end()
	t.Logf("served per gateway %v, failed %v; the fakes had at most %d requests at once", flood.served, flood.failed, maxConcurrent(t, fakes...))
	for i, f := range fakes {
		waited, n := 0, 0
		for _, r := range records(t, f) {
			n++
			if r.StartedUnixNano != 0 && time.Duration(r.StartedUnixNano-r.ReceivedUnixNano) > 20*time.Millisecond {
				waited++
			}
		}
		t.Logf("fake %d: %d requests, %d waited for one of its slots; at most %d at once (hand-overs included)", i, n, waited, maxConcurrent(t, f))
		if waited > 0 {
			t.Errorf("fake %d: %d requests waited in its own queue: more were sent to it than its 4 slots", i, waited)
		}
	}
	for g, n := range flood.failed {
		if n > 0 {
			t.Errorf("gateway %d: %d requests failed", g, n)
		}
	}
}
