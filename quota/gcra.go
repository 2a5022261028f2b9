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

// Meter indexes into per-tenant state, in this order. Ties between meters
// whose earliest times are equal go to the later index: joint, the
// dimension the seed asks operators to reason in, is named first.
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
// nanoseconds on the store's own time line. It is all a store keeps per
// tenant (three integers: a Redis hash of three fields).
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
	// Status is the meters after the decision (after the charge when one was
	// made), for the x-ratelimit-* headers of the same response.
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
	switch d {
	case DimQPS:
		return s.Requests
	case DimTokens:
		return s.Tokens
	case DimJoint:
		return s.Joint
	}
	return MeterStatus{}
}

func (s *Status) at(i int) *MeterStatus {
	switch i {
	case dimQPS:
		return &s.Requests
	case dimTokens:
		return &s.Tokens
	}
	return &s.Joint
}

// Fresh is the state of a tenant with no debt at time now: the state every
// unknown tenant is in, and the state an idle tenant returns to.
func Fresh(now int64) TATs { return TATs{now, now, now} }

// Rested reports whether t carries no debt at now on any meter, i.e. it
// behaves exactly like Fresh(now) from now on and may be forgotten.
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
// Peek with a backlog answers when a request queued behind them may start,
// which is what a queue needs to decide at admission whether the wait fits
// a wait budget.
type Backlog struct {
	Requests int64
	Tokens   int64
}

// Decide is the GCRA test for a request at now, without changing t: it
// conforms iff TAT <= now + tau on every enabled meter; otherwise its
// earliest time is max over meters of TAT - tau. The request's size does not
// enter the test (see the package doc: size decides how long the tenant
// pays afterwards, not whether it may start).
//
// With a non-empty backlog ahead, each meter's TAT is first advanced by the
// backlog's charges, from max(TAT, now): the earliest time of a request
// queued behind that backlog, were each of the requests ahead charged as
// soon as it may be. It is a lower bound (a backlog charged later, because
// the queue was busy, starts from a later time); with no backlog it is
// exact.
func Decide(t *TATs, l *Limits, now int64, ahead Backlog) (allowed bool, at int64, reason Dimension) {
	at = now
	for i := 0; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		tat := t[i]
		if ahead.Requests > 0 {
			tat = max(tat, now) + l.backlogInc(i, ahead)
		}
		if e := tat - l.tolerance; e > now && e >= at {
			at, reason = e, Dimensions[i]
		}
	}
	return at == now, at, reason
}

// Charge advances every enabled meter of t by the request's increment:
// TAT = max(TAT, now) + increment. Callers charge only after Decide allowed
// the request, which makes the charge all three meters or none.
func Charge(t *TATs, l *Limits, now, tokens int64) {
	for i := 0; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		t[i] = max(t[i], now) + l.inc(i, tokens)
	}
}

// Book charges a request that may wait for its start: if its earliest
// time (Decide, no backlog) is within maxWait of now, every enabled meter
// is charged as of that time, TAT = max(TAT, at) + increment, and Book
// reports true; otherwise nothing is charged. With maxWait 0 it is
// Decide followed by Charge. The request must not start before at: the
// meters count it from then, so a tenant whose requests book ahead is
// held to its rate exactly as one charged as each starts (guarantee 1, at
// the booked times), and the order of the bookings is the order requests
// may start in, whoever made them.
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

// MaxBookWait bounds a booking's maxWait (about 146 years), so that the
// Redis script's times stay exact.
const MaxBookWait = time.Duration(1 << 62)

// lead is the longest lead given to Book for one tenant, and when.
type lead struct{ d, at int64 }

// bookLead applies Book's rule for the lead: the stored one counts while
// the tenant was in debt at the call (rested false) and for LeadMemory
// after it was given; the given one replaces it when no shorter. It
// returns the lead in force, to keep.
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
// increments of the actual and the estimated tokens: extra debt when the
// request used more than estimated, a refund when it used less. A refund
// never takes a meter below now: a tenant at rest has no credit to gain
// (the burst window is the most it can ever have).
func Reconcile(t *TATs, l *Limits, now, estimated, actual int64) {
	for i := dimTokens; i < numDims; i++ {
		if l.interval[i] == 0 {
			continue
		}
		d := l.inc(i, actual) - l.inc(i, estimated)
		switch {
		case d > 0:
			t[i] = max(t[i], now) + d
		case d < 0:
			t[i] = max(t[i]+d, now)
		}
	}
}

// Add moves every meter of t by a batch of charges decided elsewhere
// (Mirror.Sync): requests requests and tokens tokens, either negative for
// a net refund. A positive move adds debt from max(TAT, now), as Charge
// does, without a test; a negative one takes it back, never below now,
// as Reconcile does.
func Add(t *TATs, l *Limits, now, requests, tokens int64) {
	for i := 0; i < numDims; i++ {
		switch d := l.netInc(i, requests, tokens); {
		case d > 0:
			t[i] = max(t[i], now) + d
		case d < 0:
			t[i] = max(t[i]+d, now)
		}
	}
}

// Refund moves every meter of t back by the increment of a request of
// tokens, never below now (see Store.Refund).
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
		m.Limit = int64(math.Floor(l.perMinute(i) + 1e-9))
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
