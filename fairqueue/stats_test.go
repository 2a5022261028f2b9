package fairqueue

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Stats copies the tenants in chunks, releasing the lock between them.
// Tenants forgotten and created between chunks, including the last ones
// moved behind the copy's cursor by forget's swap-remove and a name
// forgotten and seen again, leave a snapshot sorted by name without
// duplicates, in which every tenant remembered throughout appears.
func TestStatsChunkedCopy(t *testing.T) {
	const n = 3*statsChunk + 17
	h := newHarness(t, testConfig(1, nil), 1, 1)
	h.enqueue(Request{Tenant: "holder", Cost: 1}) // takes the slot
	name := func(i int) string { return "t" + strconv.Itoa(i) }
	for i := range n {
		h.enqueue(Request{Tenant: name(i), Cost: 1}).Release(0) // remembered, idle
	}
	q := h.q
	forget := func(nm string) {
		q.mu.Lock()
		q.forgetLocked(q.tenants[nm])
		q.mu.Unlock()
	}
	chunks := 0
	gone := map[string]bool{}
	setStatsPause(t, func() {
		chunks++
		if chunks != 1 {
			return
		}
		// The cursor is at statsChunk: forget tenants behind it, so the
		// last ones (ahead of it) move behind it, and one ahead of it.
		q.mu.Lock()
		behind := []string{q.roster[0].name, q.roster[1].name, q.roster[5].name}
		ahead := q.roster[2*statsChunk].name
		q.mu.Unlock()
		for _, nm := range behind {
			forget(nm)
		}
		forget(ahead)
		gone[ahead] = true
		// Seen again after being copied and forgotten: one entry.
		h.enqueue(Request{Tenant: behind[0], Cost: 1}).Release(0)
		gone[behind[1]], gone[behind[2]] = true, true
		h.enqueue(Request{Tenant: "new", Cost: 1}).Release(0)
	})
	s := q.Stats(true)
	statsPause = runtime.Gosched
	if chunks < 3 {
		t.Fatalf("%d pauses between chunks, want at least 3 for %d tenants", chunks, n+1)
	}
	if !slices.IsSortedFunc(s.Tenants, func(a, b TenantStats) int { return strings.Compare(a.Name, b.Name) }) {
		t.Fatal("tenants not sorted by name")
	}
	seen := map[string]int{}
	for _, ts := range s.Tenants {
		seen[ts.Name]++
		if seen[ts.Name] > 1 {
			t.Fatalf("%s listed twice", ts.Name)
		}
	}
	for i := range n {
		if nm := name(i); !gone[nm] && seen[nm] != 1 {
			t.Fatalf("%s, remembered throughout the copy, is missing", nm)
		}
	}
	if seen["holder"] != 1 || seen["new"] != 1 {
		t.Fatalf("holder %d, new %d times, want 1", seen["holder"], seen["new"])
	}
	// Nothing moving: the same snapshot as one copy under the lock.
	s = q.Stats(true)
	if len(s.Tenants) != s.Remembered || s.Remembered != n+2-3 {
		t.Fatalf("%d entries, %d remembered, want %d (holder and new in, three forgotten)", len(s.Tenants), s.Remembered, n+2-3)
	}
	for _, ts := range s.Tenants {
		if gone[ts.Name] {
			t.Fatalf("forgotten %s listed", ts.Name)
		}
	}
}

// BackloggedWeight is kept incrementally: it follows requests queued,
// dispatched and completed, the undeclared group counted once, and a
// reload's new weights.
func TestBackloggedWeightIncremental(t *testing.T) {
	cfg := testConfig(1, map[string]float64{"a": 3, "b": 2})
	h := newHarness(t, cfg, 1, 1)
	want := func(w float64, what string) {
		t.Helper()
		if got := h.q.BackloggedWeight(); got != w {
			t.Fatalf("%s: %v, want %v", what, got, w)
		}
	}
	h.enqueue(Request{Tenant: "a", Cost: 1}) // in flight
	want(0, "a in flight")
	h.enqueue(Request{Tenant: "a", Cost: 1})
	tb := h.enqueue(Request{Tenant: "b", Cost: 1}) // queued
	h.enqueue(Request{Tenant: "x", Cost: 1})
	want(3+2+1, "a, b and the group")
	cfg.Tenants["b"] = TenantConfig{Weight: 5, Class: "batch"}
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	want(3+5+1, "b reweighted")
	tb.Release(0) // cancelled
	want(3+1, "b cancelled")
	h.completeOldest() // a's first done: a's second or x dispatched
	if got := h.q.BackloggedWeight(); got != 3 && got != 1 {
		t.Fatalf("one of a and x queued: %v, want 3 or 1", got)
	}
	h.completeOldest() // the other dispatched
	want(0, "nothing queued")
	h.completeOldest()
	want(0, "idle")
}

// Stats(true) scraped in a loop while tenants come, go and are forgotten
// on other goroutines: every snapshot is sorted by name without
// duplicates, and the declared tenants that stay busy throughout always
// appear.
func TestStatsConcurrentChurn(t *testing.T) {
	clk := NewManualClock(t0)
	cfg := testConfig(4, map[string]float64{"a": 2, "b": 1})
	cfg.IdleForget = time.Second
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(1)
	// a and b keep a request queued the whole time.
	for _, name := range []string{"a", "b"} {
		for range 6 {
			if _, err := q.Enqueue(Request{Tenant: name, Cost: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				name := "u" + strconv.Itoa(w) + "-" + strconv.Itoa(i%3000)
				if tk, err := q.Enqueue(Request{Tenant: name, Cost: 10}); err == nil {
					tk.Release(0)
				}
				if i%50 == 0 {
					clk.Advance(100 * time.Millisecond)
					q.Tick() // forgets the tenants idle for a second
				}
			}
		})
	}
	for range 200 {
		s := q.Stats(true)
		if !slices.IsSortedFunc(s.Tenants, func(a, b TenantStats) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatal("tenants not sorted by name")
		}
		seen := map[string]bool{}
		for _, ts := range s.Tenants {
			if seen[ts.Name] {
				t.Fatalf("%s listed twice", ts.Name)
			}
			seen[ts.Name] = true
		}
		if !seen["a"] || !seen["b"] {
			t.Fatal("a busy tenant is missing")
		}
	}
	stop.Store(true)
	wg.Wait()
}
