// Package manualclock is a clock that moves only when told to: the
// simulator's virtual time (fairqueue.ManualClock) and the tests' clocks.
// A Set into the past panics: a caller that moves its clock backwards has a
// bug it wants to hear about.
package manualclock

import (
	"sync"
	"time"
)

// Epoch is where the tests' clocks start unless they need another time.
var Epoch = time.Date(2026, 10, 21, 0, 0, 0, 0, time.UTC)

// Clock is a manual clock, safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t. It panics if t is before the clock's reading.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Before(c.t) {
		panic("manualclock: time goes backwards")
	}
	c.t = t
}

// Advance moves the clock forward by d; a negative d panics, as Set does.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d < 0 {
		panic("manualclock: time goes backwards")
	}
	c.t = c.t.Add(d)
}
