package degrade

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxBurst caps the bucket size of absurdly high rates.
const maxBurst = 1 << 30

// Throttle is the token bucket of a throttle action, on golang.org/x/time/rate
// with the time passed in. It refills at Rate.PerSecond and holds
// max(floor(PerSecond × 1s), 1) units (requests, or estimated tokens); it
// starts full. A request larger than the bucket is admitted when it is
// full and leaves it in debt, capped at MaxDebt of refill, so the long-run
// rate holds. Refusals consume nothing. A now earlier than one already
// seen is no time passing. Safe for concurrent use.
type Throttle struct {
	mu    sync.Mutex
	r     Rate
	burst int
	lim   *rate.Limiter
	last  time.Time // latest now seen, for the monotonic clamp
}

// NewThrottle returns a full bucket for r; it panics if r is invalid.
func NewThrottle(r Rate) *Throttle {
	if err := r.validate(); err != nil {
		panic(fmt.Sprintf("degrade.NewThrottle: %v", err))
	}
	b := math.Floor(r.PerSecond)
	burst := maxBurst
	if b < maxBurst {
		burst = max(int(b), 1)
	}
	return &Throttle{r: r, burst: burst, lim: rate.NewLimiter(rate.Limit(r.PerSecond), burst)}
}

// Rate returns the throttle's rate.
func (t *Throttle) Rate() Rate { return t.r }

// Admit asks to admit one request of tokens (ignored by a request rate) at
// now, consuming its cost if admitted. Otherwise it returns the shortest
// wait after which the same request would be admitted if nothing else were.
func (t *Throttle) Admit(now time.Time, tokens int) (ok bool, retryAfter time.Duration) {
	return t.admit(now, tokens, true)
}

// Peek is Admit without consuming anything.
func (t *Throttle) Peek(now time.Time, tokens int) (ok bool, retryAfter time.Duration) {
	return t.admit(now, tokens, false)
}

// MaxDebt is how much refill time an oversized token request may leave the
// bucket owing.
const MaxDebt = 59 * time.Second

func (t *Throttle) admit(now time.Time, tokens int, consume bool) (ok bool, retryAfter time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var behind time.Duration // how far the caller's now is behind the latest seen
	if now.Before(t.last) {
		behind, now = t.last.Sub(now), t.last
	} else if consume {
		t.last = now
	}
	cost := t.cost(tokens)
	need := min(cost, t.burst)
	have := t.lim.TokensAt(now)
	if have >= float64(need) {
		switch {
		case !consume:
			return true, 0
		case cost <= t.burst:
			// have >= cost at the same now: AllowN succeeds.
			if t.lim.AllowN(now, cost) {
				return true, 0
			}
		default:
			// Oversized request on a full bucket: raise the burst just
			// long enough to reserve cost, then restore it. No refill is
			// computed against the raised burst (same now).
			t.lim.SetBurstAt(now, cost)
			t.lim.ReserveN(now, cost)
			t.lim.SetBurstAt(now, t.burst)
			return true, 0
		}
	}
	return false, addSat(behind, t.wait(now, have, need))
}

// addSat adds two non-negative durations, saturating.
func addSat(a, b time.Duration) time.Duration {
	if b > math.MaxInt64-a {
		return time.Duration(math.MaxInt64)
	}
	return a + b
}

// cost is what admitting a request of tokens charges the bucket: 1 for a
// request rate; for a token rate its tokens, at least 1 and at most a full
// bucket plus MaxDebt of refill.
func (t *Throttle) cost(tokens int) int {
	if !t.r.Tokens {
		return 1
	}
	maxCost := float64(t.burst) + t.r.PerSecond*MaxDebt.Seconds()
	if float64(tokens) > maxCost {
		return int(min(maxCost, math.MaxInt32))
	}
	return max(tokens, 1)
}

// wait returns the smallest d > 0 such that the bucket holds need at now+d,
// exact to the nanosecond in the limiter's own arithmetic. have < need.
func (t *Throttle) wait(now time.Time, have float64, need int) time.Duration {
	want := float64(need)
	holds := func(d time.Duration) bool { return t.lim.TokensAt(now.Add(d)) >= want }

	secs := (want - have) / t.r.PerSecond
	if secs*1e9 >= math.MaxInt64/2 {
		return time.Duration(math.MaxInt64)
	}
	hi := max(time.Duration(math.Ceil(secs*1e9)), 1)
	// The estimate is off by float rounding at most; bracket the answer.
	for step := time.Duration(1); !holds(hi); step *= 2 {
		hi += step
	}
	lo := hi - 1 // candidate that does not hold; 0 never holds
	for step := time.Duration(1); lo > 0 && holds(lo); step *= 2 {
		hi = lo
		lo = max(lo-step, 0)
	}
	for hi-lo > 1 { // invariant: !holds(lo), holds(hi)
		mid := lo + (hi-lo)/2
		if holds(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}
