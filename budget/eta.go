package budget

import (
	"math"
	"time"
)

// Never is the ETA of work that will not be done (2^62 ns): it fails every
// deadline, and adding a shorter duration or a time.Time to it cannot
// overflow. Treat any ETA >= Never as never.
const Never = time.Duration(1 << 62)

// ETA returns the time to complete workAhead cost units at rate units per
// second, rounded up to the nanosecond. workAhead <= 0 gives 0 whatever the
// rate; rate <= 0 or NaN, or a result of Never or more, gives Never.
func ETA(workAhead, rate float64) time.Duration {
	if !(workAhead > 0) {
		return 0
	}
	if !(rate > 0) {
		return Never
	}
	ns := math.Ceil(workAhead / rate * 1e9)
	if !(ns < float64(Never)) { // also +Inf, NaN
		return Never
	}
	return time.Duration(ns)
}

// BoostETA returns the time for a boosted request to reach a slot: the work
// already queued in the boost lane ahead of it (boostAhead) plus the work
// that must complete before a slot frees (slotWork, e.g. Throughput.MeanCost,
// or the request's own cost when that is 0), at rate.
func BoostETA(boostAhead, slotWork, rate float64) time.Duration {
	w := 0.0
	if boostAhead > 0 {
		w += boostAhead
	}
	if slotWork > 0 {
		w += slotWork
	}
	return ETA(w, rate)
}

// Budget returns a request's wait budget: tenantOverride if > 0, else
// classDefault; then requested (e.g. from an X-Wait-Budget header) if it is
// > 0 and shorter. A request can shorten its budget, never lengthen it.
func Budget(classDefault, tenantOverride, requested time.Duration) time.Duration {
	b := classDefault
	if tenantOverride > 0 {
		b = tenantOverride
	}
	if requested > 0 && requested < b {
		b = requested
	}
	return b
}
