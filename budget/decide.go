package budget

import "time"

// Decision is what to do with a request given its deadline and ETAs.
type Decision int

const (
	// Wait: the request meets its deadline in tag order; keep it queued.
	Wait Decision = iota
	// Boost: only the boost lane meets the deadline, and the boost budget
	// allows it; dispatch it ahead of tag order (and Record the boost).
	Boost
	// Reject: the deadline cannot be met; answer 503 with Retry-After now.
	Reject
)

// String returns "wait", "boost" or "reject" (fit for a metric label).
func (d Decision) String() string {
	switch d {
	case Wait:
		return "wait"
	case Boost:
		return "boost"
	case Reject:
		return "reject"
	}
	return "unknown"
}

// Input is what Decide needs to know about one request.
type Input struct {
	Now time.Time
	// Deadline is arrival + budget. Zero means no deadline.
	Deadline time.Time
	// ETA is the time until dispatch in tag order.
	ETA time.Duration
	// BoostETA is the time until dispatch if boosted: until a slot frees
	// (see BoostETA).
	BoostETA time.Duration
	// BoostAllowed is the boost budget's verdict (Boosts.Allow).
	BoostAllowed bool
	// Margin is a safety margin: the request must be dispatched by
	// Deadline-Margin. Negative counts as 0.
	Margin time.Duration
}

// Decide returns Wait when Now+ETA <= Deadline-Margin; else Boost when
// BoostAllowed and Now+BoostETA <= Deadline-Margin; else Reject. ETAs >= Never
// never meet a deadline; negative ETAs count as 0; a zero Deadline means
// Wait.
func Decide(in Input) Decision {
	if in.Deadline.IsZero() {
		return Wait
	}
	margin := max(in.Margin, 0)
	limit := in.Deadline.Add(-margin)
	if meets(in.Now, in.ETA, limit) {
		return Wait
	}
	if in.BoostAllowed && meets(in.Now, in.BoostETA, limit) {
		return Boost
	}
	return Reject
}

func meets(now time.Time, eta time.Duration, limit time.Time) bool {
	if eta >= Never {
		return false
	}
	return !now.Add(max(eta, 0)).After(limit)
}

// MaxRetryAfter caps RetryAfter: official OpenAI clients follow a
// Retry-After of up to 60 seconds, and an ETA further out is too uncertain
// to promise.
const MaxRetryAfter = 60 * time.Second

// RetryAfter returns the Retry-After for an ETA: rounded up to whole seconds,
// at least 1s, at most MaxRetryAfter (also for Never).
func RetryAfter(eta time.Duration) time.Duration {
	if eta <= time.Second {
		return time.Second
	}
	if eta >= MaxRetryAfter {
		return MaxRetryAfter
	}
	return (eta + time.Second - 1) / time.Second * time.Second
}

// RetryAfterJitter returns RetryAfter(eta + u × spread), spread being half
// of eta and at least JitterMin, for u in [0, 1) drawn by the caller:
// clients refused in one burst come back spread out instead of together.
func RetryAfterJitter(eta time.Duration, u float64) time.Duration {
	if !(u > 0) { // also NaN
		u = 0
	}
	u = min(u, 1)
	eta = min(max(eta, 0), MaxRetryAfter)
	spread := max(eta/2, JitterMin)
	return RetryAfter(eta + time.Duration(u*float64(spread)))
}

// JitterMin is the least window RetryAfterJitter spreads retries over.
const JitterMin = 2 * time.Second

// RetryAfterSeconds is RetryAfter in whole seconds, for the header value.
func RetryAfterSeconds(eta time.Duration) int {
	return int(RetryAfter(eta) / time.Second)
}
