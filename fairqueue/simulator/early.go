package simulator

import (
	"fmt"
	"io"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// A request arriving WarmAfter or more after the first dispatch, once the
// engine has measured enough service, must be refused within WarmLimit.
const (
	WarmAfter = 5 * time.Second
	WarmLimit = 500 * time.Millisecond
)

// EarlyReport compares a run with fast-fail against the same workload
// with fast-fail off, request by request.
type EarlyReport struct {
	Precision                Precision
	AtAdmission, WhileQueued int
	// Right counts the refusals of requests that missed their budget
	// without fast-fail; only they are held to the timing bounds.
	Right int
	// MaxDelay is the longest time from arrival to refusal over Right,
	// MaxDelayFrac its largest fraction of the budget; OverQuarter counts
	// those over a quarter of it.
	MaxDelay     time.Duration
	MaxDelayFrac float64
	OverQuarter  int
	// Warm counts the Right refusals after WarmAfter; WarmMaxDelay and
	// OverWarmLimit are their longest delay and those over WarmLimit.
	Warm          int
	WarmMaxDelay  time.Duration
	OverWarmLimit int
	// ServedOn and ServedOff are the tokens completed in each run.
	ServedOn, ServedOff int64
}

// ServedDiff is (ServedOn - ServedOff) / ServedOff.
func (e EarlyReport) ServedDiff() float64 {
	if e.ServedOff == 0 {
		return 0
	}
	return float64(e.ServedOn-e.ServedOff) / float64(e.ServedOff)
}

// Early compares on, a run with fast-fail, with off.
func Early(on, off *Result) EarlyReport {
	e := EarlyReport{Precision: FastFailPrecision(on, off),
		ServedOn: on.Overall.Tokens, ServedOff: off.Overall.Tokens}
	first := time.Duration(-1)
	for id := range on.Records {
		rec := &on.Records[id]
		if rec.Served() && (first < 0 || rec.Dispatch < first) {
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

// missed reports whether request id missed its budget in res.
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
