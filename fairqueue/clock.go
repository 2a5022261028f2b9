package fairqueue

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
)

// Clock is the only source of time for the scheduler. Its readings must
// stay within about 292 years of its reading when the queue was made (what
// a time.Duration spans): tickets keep their times as offsets from that
// reading (Queue.since).
type Clock interface {
	Now() time.Time
}

// RealClock reads the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// ManualClock is a clock that moves only when told to; the simulator and
// tests drive the scheduler with it. It is safe for concurrent use, and a
// Set into the past panics.
type ManualClock = manualclock.Clock

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return manualclock.New(start) }

// since returns t as nanoseconds from the queue's epoch, the form a ticket
// keeps its times in. The difference is taken on the monotonic clock when
// both readings carry one (Time.Sub), so with RealClock a time given back
// by at follows the monotonic clock across a step of the wall clock.
func (q *Queue) since(t time.Time) int64 { return int64(t.Sub(q.epoch)) }

// at returns the time off nanoseconds after the queue's epoch.
func (q *Queue) at(off int64) time.Time { return q.epoch.Add(time.Duration(off)) }
