package harness

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/testwait"
)

// Scale stretches a guard (how long to wait for an event before failing) by
// the machine's slowdown factor, FQ_TEST_SLOWDOWN (see package testwait).
// Never use it on a bound being asserted.
func Scale(d time.Duration) time.Duration { return testwait.Scale(d) }

// PollTimeout bounds WaitFor, scaled. It turns a hang into a failure that
// names the state waited for; tests assert on order and counts, never on
// durations.
var PollTimeout = Scale(30 * time.Second)

// WaitFor polls cond until it reports true, failing the test after
// PollTimeout with what and cond's last detail (what it saw). Use it for
// progress that is bound to happen (a request reaching the fake, a queue
// filling up).
func WaitFor(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(PollTimeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not reached within %s; last: %s", what, PollTimeout, detail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
