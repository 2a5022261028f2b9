package e2e

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestClusterSharedSlotsPerUpstream: three gateways sharing a pool of two
// model servers of 4 slots each, each gateway flooded as if it alone had
// the pool: no model server ever holds more than its own 4 requests (the
// pool's total of 8 held before, while one server ran a 5th: a grant the
// others left no room for on any upstream sent a request to the least
// loaded one). Each fake's peak is read from its own records.
func TestClusterSharedSlotsPerUpstream(t *testing.T) {
	rs := startRedis(t)
	t.Setenv("FQ_E2E_REDIS_URL", "redis://"+rs.addr())
	fakes := startFakes(t, 2, "cperup", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	_, bases := startSlotGateways(t, 3, "2s", false, fakes)
	flood := startSlotFlood(t, bases)
	time.Sleep(6 * time.Second) // pacing only: the flood runs
	flood.end()
	total := maxConcurrent(t, fakes...)
	t.Logf("served per gateway %v, failed %v; the fakes had at most %d requests at once", flood.served, flood.failed, total)
	if total > 8 {
		t.Errorf("the fakes had %d requests at once, more than the pool's 8", total)
	}
	for i, f := range fakes {
		peak := maxConcurrent(t, f)
		t.Logf("fake %d: at most %d requests at once", i, peak)
		if peak > 4 {
			t.Errorf("fake %d had %d requests at once, more than its 4 slots", i, peak)
		}
	}
	for g, n := range flood.failed {
		if n > 0 {
			t.Errorf("gateway %d: %d requests failed", g, n)
		}
	}
}
