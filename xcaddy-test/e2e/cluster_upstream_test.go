package e2e

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestClusterSharedSlotsPerUpstream: three gateways sharing a pool of two
// model servers of 4 slots each, each gateway flooded as if it alone had
// the pool: no model server is ever sent a 5th request, that is, no
// request arrives while 4 others are still generating there (started and
// not yet at their last bytes, the fake's GeneratedUnixNano). A request
// arriving as one of the 4 writes its answer is a hand-over, the slot
// already the gateways' to give; on a busy machine the fake may take it
// late, so waiting at the fake is not the test, what was running is.
// Before, the pool's total of 8 held while one server ran a 5th: a grant
// the others left no room for on any upstream sent a request to the least
// loaded one.
func TestClusterSharedSlotsPerUpstream(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	fakes := startFakes(t, 2, "cperup", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	_, bases := startSlotGateways(t, rs, 3, "2s", false, fakes)
	flood := startSlotFlood(t, bases)
	flood.waitServed(t, "the flood through all three", 60, 0, 1, 2)
	flood.end()
	t.Logf("served per gateway %v, failed %v; the fakes had at most %d requests at once (hand-overs included, observed)", flood.served, flood.failed, maxConcurrent(t, fakes...))
	for i, f := range fakes {
		recs := records(t, f)
		over := 0
		for _, r := range recs {
			if n := generatingAt(recs, r); n >= 4 {
				over++
				t.Errorf("fake %d: %s arrived while %d others were generating: more were sent to it than its 4 slots", i, r.TestID, n)
			}
		}
		t.Logf("fake %d: %d requests, %d sent beyond its slots", i, len(recs), over)
	}
	for g, n := range flood.failed {
		if n > 0 {
			t.Errorf("gateway %d: %d requests failed", g, n)
		}
	}
}

// generatingAt counts the requests other than r that had started at r's
// arrival and had not ended their generation.
func generatingAt(recs map[string]harness.FakeRequest, r harness.FakeRequest) int {
	n := 0
	for _, x := range recs {
		end := x.GeneratedUnixNano
		if end == 0 {
			end = x.FinishedUnixNano // it never finished generating
		}
		if x.Seq != r.Seq && x.StartedUnixNano != 0 && x.StartedUnixNano <= r.ReceivedUnixNano &&
			(end == 0 || end > r.ReceivedUnixNano) {
			n++
		}
	}
	return n
}
