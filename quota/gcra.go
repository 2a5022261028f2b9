package quota

import (
	"math"
	"time"
)

// Dimension names a meter; it is the reason a request is refused.
type Dimension string

// The three meters, by the names the HTTP contract uses in its reason field.
const (
	DimQPS    Dimension = "qps"
	DimTokens Dimension = "tokens"
	DimJoint  Dimension = "joint"
)

// Meter indexes into per-tenant state. Ties between meters with equal
// earliest times go to the later index, so joint is named first.
const (
	dimQPS = iota
	dimTokens
	dimJoint
	numDims
)

// Dimensions are the meters in the order of their indexes (TATs' entries).
var Dimensions = [numDims]Dimension{DimQPS, DimTokens, DimJoint}

func dimIndex(d Dimension) (int, bool) {
	for i, n := range Dimensions {
		if n == d {
			return i, true
		}
	}
	return 0, false
}

// TATs is one tenant's state: each meter's theoretical arrival time, in
// nanoseconds on the store's own time line.
type TATs [numDims]int64

// Decision is the answer to Peek or Charge.
type Decision struct {
	// Allowed: the request conforms to every meter now (and, for Charge, has
	// been charged to all of them); for Book, it has been booked: charged
	// as of At.
	Allowed bool
	// At is the earliest time the request conforms: now when Allowed (for
	// Book, the time it was booked for). It is exact: with no other charge
	// in between, the same request peeked or charged at At is allowed.
	At time.Time
	// RetryAfter is At - now (0 when Allowed, but for Book).
	RetryAfter time.Duration
	// Reason is the binding meter (the one whose earliest time is latest)
	// when not Allowed, or when a Book waits; "" otherwise.
	Reason Dimension
	// Status is the meters after the decision, for the x-ratelimit-*
	// headers.
	Status Status
}

// Status is a tenant's standing on each meter.
type Status struct {
	Requests MeterStatus
	Tokens   MeterStatus
	Joint    MeterStatus
}

// MeterStatus is one meter's standing in OpenAI header terms.
type MeterStatus struct {
	// Enabled: the tenant's limits have this meter; the rest is zero if not.
	Enabled bool
	// Limit is the rate per minute: RPM, TPM, or request-equivalents per
	// minute for joint, rounded down (what x-ratelimit-limit-* reports).
	Limit int64
	// Remaining is how many units can be charged now, back to back, without
	// a refusal: requests for qps and joint (request-equivalents), tokens for
	// tokens. Capped at Limit.
	Remaining int64
	// Reset is how long until the meter is back at rest (no debt, the whole
	// burst window available again) if nothing more is charged.
	Reset time.Duration
}

// Meter returns the status of dimension d.
func (s *Status) Meter(d Dimension) MeterStatus {
	if i, ok := dimIndex(d); ok {
		return *s.at(i)
	}
	return MeterStatus{}
}

func (s *Status) at(i int) *MeterStatus {
	return [numDims]*MeterStatus{dimQPS: &s.Requests, dimTokens: &s.Tokens, dimJoint: &s.Joint}[i]
}

// Fresh is the state of a tenant with no debt at now.
func Fresh(now int64) TATs { return TATs{now, now, now} }

// Rested reports whether t carries no debt at now: it behaves exactly like
// Fresh(now) and may be forgotten.
func (t *TATs) Rested(now int64) bool {
	for _, v := range t {
		if v > now {
			return false
		}
	}
	return true
}

// Backlog is what a tenant has waiting ahead of the request being decided:
// requests that will be charged before it, and their estimated tokens.
type Backlog struct {
	Requests int64
	Tokens   int64
}

// Decide is the GCRA test for a request at now, without changing t: it
// conforms iff TAT <= now + tau on every enabled meter; otherwise its
// earliest time is max over meters of TAT - tau. A backlog ahead first
// advances each TAT by its charges from max(TAT, now): a lower bound on a
// queued request's earliest time, exact with no backlog.
func Decide(t *TATs, l *Limits, now int64, ahead Backlog) (allowed bool, at int64, reason Dimension) {
	at = now
	for i := 0; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		tat := t[i]
		if ahead.Requests > 0 {
			tat = max(tat, now) + l.netInc(i, ahead.Requests, max(ahead.Tokens, 0))
		}
		if e := tat - l.tolerance; e > now && e >= at {
			at, reason = e, Dimensions[i]
		}
	}
	return at == now, at, reason
}

// Charge advances every enabled meter: TAT = max(TAT, now) + increment.
// Callers charge only after Decide allowed the request.
func Charge(t *TATs, l *Limits, now, tokens int64) {
	for i := 0; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		t[i] = max(t[i], now) + l.inc(i, tokens)
	}
}

// Book charges a request that may wait: if its earliest time is within
// maxWait of now, every meter is charged as of that time and Book reports
// true; otherwise nothing is charged. The request must not start before
// at, so a tenant booking ahead is held to its rate as one charged at
// each start.
func Book(t *TATs, l *Limits, now, tokens, maxWait int64) (booked bool, at int64, reason Dimension) {
	_, at, reason = Decide(t, l, now, Backlog{})
	if at-now > maxWait {
		return false, at, reason
	}
	Charge(t, l, at, tokens)
	return true, at, reason
}

// LeadMemory is how long a lead given to Store.Book counts for its tenant.
const LeadMemory = time.Minute

// MaxBookWait bounds a booking's maxWait, so the Redis script's times stay
// exact.
const MaxBookWait = time.Duration(1 << 62)

// lead is the longest lead given to Book for one tenant, and when.
type lead struct{ d, at int64 }

// bookLead returns the lead in force: the stored one while the tenant is
// in debt and for LeadMemory after it was given, replaced by a given one
// no shorter.
func bookLead(stored lead, given, now int64, rested bool) lead {
	if rested || now-stored.at > int64(LeadMemory) {
		stored = lead{}
	}
	if given > 0 && given >= stored.d {
		stored = lead{given, now}
	}
	return stored
}

// Reconcile moves the token and joint meters by the difference between the
// increments of the actual and the estimated tokens. A refund never takes
// a meter below now: the burst window is the most credit a tenant has.
func Reconcile(t *TATs, l *Limits, now, estimated, actual int64) {
	for i := dimTokens; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		t[i] = move(t[i], now, l.inc(i, actual)-l.inc(i, estimated))
	}
}

// Add moves every meter by a batch of charges decided elsewhere
// (Mirror.Sync), without a test; a refund never goes below now.
func Add(t *TATs, l *Limits, now, requests, tokens int64) {
	for i := 0; i < numDims; i++ {
		t[i] = move(t[i], now, l.netInc(i, requests, tokens))
	}
}

// move is tat moved by d: a debt from max(tat, now), a refund down to now
// at most.
func move(tat, now, d int64) int64 {
	switch {
	case d > 0:
		return max(tat, now) + d
	case d < 0:
		return max(tat+d, now)
	}
	return tat
}

// Refund moves every meter back by a request's increment, never below now.
func Refund(t *TATs, l *Limits, now, tokens int64) {
	for i := 0; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		t[i] = max(t[i]-l.inc(i, tokens), now)
	}
}

// StatusOf computes the header view of t at now.
func StatusOf(t *TATs, l *Limits, now int64) Status {
	var s Status
	for i := 0; i < numDims; i++ {
		iv := l.interval[i]
		if iv == 0 {
			continue
		}
		m := s.at(i)
		m.Enabled = true
		m.Limit = int64(math.Floor(60e9/iv + 1e-9)) // per minute
		base := max(t[i], now)
		m.Reset = time.Duration(base - now)
		slack := now + l.tolerance - base
		if slack < 0 {
			continue
		}
		r := int64(math.Floor(float64(slack) / iv))
		if i != dimTokens {
			// A request is admitted while the debt before it is within
			// tau, so one more request fits than the slack covers.
			r++
		}
		m.Remaining = min(r, m.Limit)
	}
	return s
}
