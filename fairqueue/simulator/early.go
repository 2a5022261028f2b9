package simulator

import (
	"fmt"
	"io"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// WarmAfter is how long after the first dispatch of a run the engine has
// measured enough service for EarlyReport's tighter bound on how soon a
// refusal comes (WarmLimit).
const WarmAfter = 5 * time.Second

// WarmLimit is the longest a warm engine may take to refuse a request that
// would miss its budget: from its arrival, at or after WarmAfter of
// service, to its refusal.
const WarmLimit = 500 * time.Millisecond

// EarlyReport measures early refusal: a run with fast-fail (refusal at
// admission and while queued) against the same workload run with fast-fail
// off, request by request.
type EarlyReport struct {
	// Precision is the fast-fail precision (FastFailPrecision).
	Precision Precision
	// AtAdmission and WhileQueued split the refusals by moment.
	AtAdmission, WhileQueued int
	// Right is the refusals of requests that missed their budget in the
	// run without fast-fail; only they are held to the timing bounds.
	Right int
	// MaxDelay is the longest time from arrival to refusal over Right, and
	// MaxDelayFrac the longest such time as a fraction of the request's
	// budget; OverQuarter counts those over a quarter of it.
	MaxDelay     time.Duration
	MaxDelayFrac float64
	OverQuarter  int
	// Warm counts the Right refusals of requests arriving WarmAfter or more
	// after the first dispatch; WarmMaxDelay and OverWarmLimit are their
	// longest time to refusal and how many exceeded WarmLimit.
	Warm          int
	WarmMaxDelay  time.Duration
	OverWarmLimit int
	// ServedOn and ServedOff are the actual tokens of completed requests
	// in each run.
	ServedOn, ServedOff int64
}

// ServedDiff is (ServedOn - ServedOff) / ServedOff.
func (e EarlyReport) ServedDiff() float64 {
	if e.ServedOff == 0 {
		return 0
	}
	return float64(e.ServedOn-e.ServedOff) / float64(e.ServedOff)
}

// Early compares on, a run with fast-fail, with off, the same workload
// with fast-fail off.
func Early(on, off *Result) EarlyReport {
	e := EarlyReport{Precision: FastFailPrecision(on, off),
		ServedOn: on.Overall.Tokens, ServedOff: off.Overall.Tokens}
	first := time.Duration(-1)
	for id := range on.Records {
		rec := &on.Records[id]
		if (rec.State == StateInflight || rec.State == StateCompleted) && (first < 0 || rec.Dispatch < first) {
			first = rec.Dispatch
		}
	}
	n := min(len(on.Records), len(off.Records))
	for id := 0; id < n; id++ {
		rec := &on.Records[id]
		if rec.State != StateRejected || rec.Reason != fairqueue.ReasonBudgetExceeded {
			continue
		}
		if rec.WhileQueued {
			e.WhileQueued++
		} else {
			e.AtAdmission++
		}
		r := &on.Requests[id]
		if o := &off.Requests[id]; o.Arrival != r.Arrival || o.Tenant != r.Tenant || !missed(off, id) {
			continue
		}
		e.Right++
		d := rec.Left - r.Arrival
		e.MaxDelay = max(e.MaxDelay, d)
		if b := on.Scenario.Budget(r.Tenant); b > 0 {
			e.MaxDelayFrac = max(e.MaxDelayFrac, float64(d)/float64(b))
			if d > b/4 {
				e.OverQuarter++
			}
		}
		if first >= 0 && r.Arrival >= first+WarmAfter {
			e.Warm++
			e.WarmMaxDelay = max(e.WarmMaxDelay, d)
			if d > WarmLimit {
				e.OverWarmLimit++
			}
		}
	}
	return e
}

// missed reports whether request id missed its budget in res: expired,
// refused, or dispatched after it.
func missed(res *Result, id int) bool {
	rec, r := &res.Records[id], &res.Requests[id]
	switch rec.State {
	case StateExpired, StateRejected:
		return true
	case StateInflight, StateCompleted:
		b := res.Scenario.Budget(r.Tenant)
		return b > 0 && rec.Wait(r) > b
	}
	return false
}

// FormatEarly prints an EarlyReport.
func FormatEarly(w io.Writer, name string, e EarlyReport) {
	fmt.Fprintf(w, "%s: refused %d (%d at admission, %d while queued); precision %s (%d of %d missed without fast-fail)\n",
		name, e.AtAdmission+e.WhileQueued, e.AtAdmission, e.WhileQueued, pctOrNA(e.Precision.Precision()),
		e.Precision.Missed(), e.Precision.Refused)
	fmt.Fprintf(w, "  right refusals %d: latest %v after arrival (%.1f%% of the budget), %d later than a quarter of it\n",
		e.Right, e.MaxDelay.Round(time.Millisecond), 100*e.MaxDelayFrac, e.OverQuarter)
	fmt.Fprintf(w, "  of them %d arrived %v after the first dispatch or later: latest %v after arrival, %d later than %v\n",
		e.Warm, WarmAfter, e.WarmMaxDelay.Round(time.Millisecond), e.OverWarmLimit, WarmLimit)
	fmt.Fprintf(w, "  served %d tokens vs %d without fast-fail (%+.2f%%)\n", e.ServedOn, e.ServedOff, 100*e.ServedDiff())
}
