package harness

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/testwait"
)

// SlowdownEnv names the environment variable that tells the tests how much
// slower than an idle machine this one may be (see package testwait).
const SlowdownEnv = testwait.Env

// Slowdown is the factor SlowdownEnv sets.
func Slowdown() float64 { return testwait.Slowdown() }

// Scale stretches a guard (how long to wait for an event before failing) by
// Slowdown. Never use it on a bound being asserted.
func Scale(d time.Duration) time.Duration { return testwait.Scale(d) }
