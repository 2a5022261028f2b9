package e2e

import (
	"fmt"
	"strings"
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
// late, so waiting at the fake is not the test, what was running is
// (TestClusterSharedSlotsPerUpstream failed so, with two busy loops
// beside it, on a hand-over the fake took 20 ms to see).
//
// The flood's start is checked too, when every gateway renews at once:
// within a gateway, concurrent dispatches see one another's places in
// Select (placements in selection.go), and across gateways a renewal tells
// the others what the gateway may have on each upstream until its next
// one, and the gateway places within exactly that during the call
// (beginRenewal). With the placements alone, with two busy loops beside
// the test, 4 and 5 of 15 runs had a request reach a server as its 5th,
// 95 to 190 ms into the flood; with both, 0 of 20. Before the
// per-upstream targets, the pool's total of 8 held while one server ran a
// 5th.
func TestClusterSharedSlotsPerUpstream(t *testing.T) {
	t.Parallel()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cperup", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	_, bases := startSlotGateways(t, rs, 3, "2s", false, fakes)
	floodAt := time.Now().UnixNano()
	flood := startSlotFlood(t, bases)
	flood.waitServed(t, "the flood through all three", 60, 0, 1, 2)
	// Ending the flood cancels the requests in flight: a gateway frees
	// their slots at once, and a model server notices a moment later, so
	// what arrives from then on is not checked.
	stopAt := time.Now().UnixNano()
	flood.end()
	t.Logf("served per gateway %v, failed %v; the fakes had at most %d requests at once (hand-overs included, observed)", flood.served, flood.failed, maxConcurrent(t, fakes...))
	for i, f := range fakes {
		recs := records(t, f)
		over := 0
		for _, r := range recs {
			if r.ReceivedUnixNano >= stopAt {
				continue
			}
			if n := generatingAt(recs, r); n >= 4 {
				over++
				t.Errorf("fake %d: %s arrived %v into the flood while %d others were generating: more were sent to it than its 4 slots (%s)",
					i, r.TestID, time.Duration(r.ReceivedUnixNano-floodAt), n, generatingList(recs, r, floodAt))
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

// generatingList names the requests generatingAt counts, each with its
// arrival and end of generation since the flood's start, for a failure's
// message.
func generatingList(recs map[string]harness.FakeRequest, r harness.FakeRequest, floodAt int64) string {
	var b strings.Builder
	for _, x := range generating(recs, r) {
		fmt.Fprintf(&b, "%s %v-%v; ", x.TestID, time.Duration(x.ReceivedUnixNano-floodAt), time.Duration(generationEnd(x)-floodAt))
	}
	return b.String()
}

// generatingAt counts the requests other than r that had started at r's
// arrival and had not ended their generation.
func generatingAt(recs map[string]harness.FakeRequest, r harness.FakeRequest) int {
	return len(generating(recs, r))
}

// generating is the requests other than r that had started at r's
// arrival and had not ended their generation.
func generating(recs map[string]harness.FakeRequest, r harness.FakeRequest) []harness.FakeRequest {
	var out []harness.FakeRequest
	for _, x := range recs {
		end := generationEnd(x)
		if x.Seq != r.Seq && x.StartedUnixNano != 0 && x.StartedUnixNano <= r.ReceivedUnixNano &&
			(end == 0 || end > r.ReceivedUnixNano) {
			out = append(out, x)
		}
	}
	return out
}

// generationEnd is when x ended its generation: its last bytes, or its
// end if it never finished generating; 0 if neither.
func generationEnd(x harness.FakeRequest) int64 {
	if x.GeneratedUnixNano != 0 {
		return x.GeneratedUnixNano
	}
	return x.FinishedUnixNano
}
