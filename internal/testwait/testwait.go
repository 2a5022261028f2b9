// Package testwait is how long the tests may wait for an event on this
// machine: one factor (FQ_TEST_SLOWDOWN) for the handler tests of this
// module and the end-to-end tests of xcaddy-test, which share it.
package testwait

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"
)

// Env names the environment variable that tells the tests how much
// slower than an idle machine this one may be: a factor, default 1.
// scripts/test.sh sets it (higher under the race detector), and anyone
// running the tests beside other work may raise it, e.g.
//
//	FQ_TEST_SLOWDOWN=4 go test ./...
//
// It stretches what a test waits before it calls a hang a failure (Scale),
// never a bound the test asserts: a slower machine gets more time to reach
// an event, not a looser fairness, quota or budget bound.
const Env = "FQ_TEST_SLOWDOWN"

// slowdown reads Env once. A value that is not a factor stops the
// tests at their first wait, rather than let them run with a guess.
var slowdown = sync.OnceValue(func() float64 {
	f, err := Parse(os.Getenv(Env))
	if err != nil {
		panic(err)
	}
	return f
})

func Parse(v string) (float64, error) {
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 1 || f > 1000 {
		return 0, fmt.Errorf("%s=%q: want a factor from 1 to 1000 (1: an idle machine)", Env, v)
	}
	return f, nil
}

// Slowdown is the factor Env sets.
func Slowdown() float64 { return slowdown() }

// Scale stretches a guard (how long to wait for an event before failing) by
// Slowdown. Never use it on a bound being asserted.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * slowdown())
}
