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

// Throttle is the token bucket of a throttle action, built on
// golang.org/x/time/rate with the time passed in.
//
// The bucket refills at Rate.PerSecond and holds burst = max(floor(PerSecond
// × 1s), 1) units: requests for a request rate, estimated tokens for a token
// rate. It starts full.
//
// An admission costs 1 for a request rate, the estimated tokens (at least
// 1) for a token rate. A request larger than the whole bucket is admitted
// when it is full and leaves it in debt, so the long-run rate still holds;
// the debt is capped at MaxDebt of refill, so one huge request holds the
// class for about a minute at most. Refusals consume nothing.
//
// A now earlier than one already seen (goroutines racing for the lock) is
// no time passing; retryAfter stays relative to the caller's now. A
// Throttle is safe for concurrent use.
type Throttle struct {
	mu    sync.Mutex
	r     Rate
	burst int
	lim   *rate.Limiter
	last  time.Time // latest now seen, for the monotonic clamp
}

// NewThrottle returns a full bucket for r. r must be valid (finite
// PerSecond > 0, as ParseRate and NewLadder guarantee); NewThrottle panics
// otherwise.
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

// Burst returns the bucket size, in requests or tokens.
func (t *Throttle) Burst() int { return t.burst }

// Admit asks to admit one request at now. tokens is the request's estimated
// token count; it is ignored by a request-rate throttle. If the request is
// admitted, Admit consumes its cost and returns (true, 0). Otherwise it
// consumes nothing and returns (false, retryAfter) where retryAfter > 0 is
// the shortest wait after which the same request would be admitted if
// nothing else were admitted in between: Admit(now+retryAfter, tokens)
// succeeds.
func (t *Throttle) Admit(now time.Time, tokens int) (ok bool, retryAfter time.Duration) {
	return t.admit(now, tokens, true)
}

// Peek is Admit without consuming anything: whether Admit would admit the
// request now, and if not, the same retryAfter. It lets a caller refuse
// before doing work the admission would need (reading a body), and admit
// for real later.
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
			// Oversized token request on a full bucket: raise the burst
			// just long enough to reserve cost (driving tokens to
			// burst-cost), then restore it. now == the limiter's last
			// update after the first SetBurstAt, so no refill is computed
			// against the raised burst.
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
// exact to the nanosecond in the limiter's own arithmetic (so that
// Admit(now+d) succeeds and Admit(now+d-1ns) would not). The bucket holds less
// than need at now (have < need), and TokensAt is non-decreasing in time.
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
