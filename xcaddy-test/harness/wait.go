package harness

import (
	"testing"
	"time"
)

// WaitTimeout bounds Eventually, times Slowdown. It is a guard against
// hangs, not an assertion on speed: tests assert on order and counts, never
// on durations.
var WaitTimeout = 30 * time.Second

// Eventually polls cond until it holds, failing the test with what when it
// has not after WaitTimeout (scaled). Use it to wait for progress that is
// bound to happen (a request reaching the fake, a queue filling up).
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	limit := Scale(WaitTimeout)
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("harness: gave up after %s waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitStats polls the fake's stats until cond holds and returns them.
func (f *Fake) WaitStats(what string, cond func(FakeStats) bool) FakeStats {
	f.t.Helper()
	var st FakeStats
	Eventually(f.t, what, func() bool {
		st = f.Stats()
		return cond(st)
	})
	return st
}
