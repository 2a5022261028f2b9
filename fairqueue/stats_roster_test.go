package fairqueue

import (
	"runtime"
	"strconv"
	"testing"
)

// TestStatsRosterShrinksBelowCursor: between two chunks of a Stats copy,
// a burst of new tenants arrives and then most tenants are forgotten (a
// reload that undeclares them, a prune after a burst): forgets behind the
// cursor move the newest tenants into scanMoved, and the roster ends below
// the cursor. The grow step then sizes the copy's buffer from
// len(roster)-scan, which is negative: make panics (here) or, for a
// smaller shortfall, the loop never gets the room it asks for and spins.
func TestStatsRosterShrinksBelowCursor(t *testing.T) { statsShrink(t, 200) }

// TestStatsRosterShrinksBelowCursorSpins: the same with the roster left
// at 3040 (cursor 3840, 800 moved): the buffer grows to less than the room
// it asks for, every time, and Stats never returns (run with -timeout).
func TestStatsRosterShrinksBelowCursorSpins(t *testing.T) { statsShrink(t, 3040) }

func statsShrink(t *testing.T, keep int) {
	const n = 16 * statsChunk
	h := newHarness(t, testConfig(1, nil), 1, 1)
	h.enqueue(Request{Tenant: "holder", Cost: 1}) // busy, roster[0]
	for i := range n {
		h.enqueue(Request{Tenant: "t" + strconv.Itoa(i), Cost: 1}).Release(0)
	}
	q := h.q
	fired := churnLateInStats(h, func() {
		q.mu.Lock()
		for range 800 {
			q.forgetLocked(q.roster[1]) // behind the cursor: the last moves there
		}
		for len(q.roster) > keep {
			q.forgetLocked(q.roster[len(q.roster)-1])
		}
		q.mu.Unlock()
	})
	s := statsNoPanic(t, q)
	if !*fired {
		t.Fatal("the churn never ran")
	}
	if len(s.Tenants) == 0 {
		t.Fatal("no tenants listed")
	}
	if len(s.Tenants) < keep-1 {
		t.Fatalf("%d tenants listed, %d remembered throughout", len(s.Tenants), keep)
	}
}

// TestStatsReloadDuringScrape: the same through the public API: a
// scrape of 4k declared tenants while 1000 new tenants arrive and a reload
// undeclares the declared ones (Reconfigure forgets them, idle and
// misplaced, in map order).
func TestStatsReloadDuringScrape(t *testing.T) {
	const n = 16 * statsChunk
	weights := map[string]float64{}
	for i := range n {
		weights["d"+strconv.Itoa(i)] = 1
	}
	cfg := testConfig(1, weights)
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "holder", Cost: 1})
	for i := range n {
		h.enqueue(Request{Tenant: "d" + strconv.Itoa(i), Cost: 1}).Release(0)
	}
	q := h.q
	fired := churnLateInStats(h, func() {
		if err := q.Reconfigure(testConfig(1, nil)); err != nil {
			t.Error(err)
		}
	})
	s := statsNoPanic(t, q)
	if !*fired || len(s.Tenants) < 1000 {
		t.Fatalf("fired %v, %d tenants listed", *fired, len(s.Tenants))
	}
}

// churnLateInStats has the next Stats copy run churn once between two
// chunks, when its cursor has passed 15 of them, after 1000 new tenants
// arrived; it reports whether that happened.
func churnLateInStats(h *harness, churn func()) *bool {
	q := h.q
	fired := new(bool)
	setStatsPause(h.tb, func() {
		q.mu.Lock()
		scan := q.scan
		q.mu.Unlock()
		if *fired || scan < 15*statsChunk {
			return
		}
		*fired = true
		for i := range 1000 {
			h.enqueue(Request{Tenant: "new" + strconv.Itoa(i), Cost: 1}).Release(0)
		}
		churn()
	})
	return fired
}

// statsNoPanic is q.Stats(true), failing the test if it panics.
func statsNoPanic(t *testing.T, q *Queue) Stats {
	t.Helper()
	defer func() {
		statsPause = runtime.Gosched
		if v := recover(); v != nil {
			t.Fatalf("Stats panicked: %v", v)
		}
	}()
	return q.Stats(true)
}
