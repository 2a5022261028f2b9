// Package budget turns "work ahead of a request" into time, and time into a
// decision: wait, boost, or reject at once with a Retry-After.
//
// The package is pure: no project imports, no Caddy, no net/http, no clock;
// every method takes "now", so it runs unchanged on the simulator's virtual
// clock. No type is safe for concurrent use; fairqueue calls it under its
// lock. A time earlier than one already seen counts as the one seen.
//
// # Model
//
// The scheduler measures work in its cost units and computes workAhead, the
// cost dispatched before a request in virtual-tag order. This package does
// the rest:
//
//	rate     = Throughput.Rate(now, healthy)      cost units per second
//	ETA      = workAhead / rate                   ETA(workAhead, rate)
//	decision = Decide(Input{Now, Deadline, ETA, BoostETA, BoostAllowed, Margin})
//
// # Throughput
//
// A sliding Window (default 60s) of Buckets (default 12). Only completed
// buckets count, so the estimate changes once per bucket and is cached:
// Rate is O(1) except on the first call in a new bucket (O(Buckets²) at
// worst, no allocation).
//
// Normalisation: Observe adds cost/healthy, and Rate multiplies by the
// current healthy count, so losing one of two upstreams halves the rate at
// once and a capacity change does not poison the window. healthy may be any
// capacity measure used consistently; <= 0 counts as 1 in Observe and gives
// rate 0 in Rate.
//
// Busy time: a completion rate measures capacity only while saturated. The
// scheduler calls SetBusy(now, busy), busy meaning a free slot would be
// filled at once. Buckets keep their busy time and the cost completed while
// busy; idle completions and idle buckets are ignored, so an idle minute
// neither drags the rate down nor inflates it. Observe a completion before
// the busy change it causes. A new Throughput starts not busy.
//
// Samples: consecutive complete buckets, newest first, idle ones skipped,
// form a sample once it holds a bucket width of busy time and
// MinCompletions (default 4) completions; its rate is cost / busy time. The
// remainder joins the oldest sample (or is the only one: busy with no
// completion reads as rate 0, stalled). Sparse or bursty traffic thus reads
// as "time to finish MinCompletions requests", what a queue waits for.
//
// The per-upstream rate is the Quantile (default 0.25) of the sample rates,
// interpolated linearly (R/NumPy type 7): LLM throughput is long-tailed and
// an ETA should hold in most windows, not on average.
//
// Prior: with covered = busy time inside the samples and W = Warmup
// (default Window/4),
//
//	perUpstream = f·measured + (1-f)·base,  f = min(1, covered/W)
//
// where base is the last fully warmed-up measured value (> 0) if any, else
// Prior. After a long idle spell the estimator resumes from what it learned;
// a stall is never learned. With Prior <= 0 and nothing learned, data is
// used as is and no data gives 0.
//
// # ETA
//
// ETA = workAhead/rate, rounded up to the nanosecond; workAhead <= 0 gives
// 0; rate <= 0 or overflow gives Never (2^62 ns: fails every deadline, yet
// adding a shorter duration or a time.Time cannot overflow).
//
// BoostETA(boostAhead, slotWork, rate) is the time for a boosted request to
// reach a slot: the boost lane's work plus the work that must complete
// before a slot frees (Throughput.MeanCost is a good slotWork).
//
// Budget applies the DESIGN rule: a tenant override replaces the class
// default; a request header may shorten the result, never lengthen it.
//
// # Boost budget
//
//   - Share: Limit(capacity) = floor(shareMax·capacity + 1e-9), at least 1
//     when both are > 0, 0 otherwise; shareMax is clamped to [0, 1]. Boosts
//     happen only when saturated, when in-flight equals capacity, so
//     "boosted <= shareMax of in-flight" holds (the at-least-one rule lets a
//     small deployment boost at all).
//   - Rolling hour: at most perTenantHourly boosts per tenant in any 60
//     minutes; a boost at t counts during [t, t+1h). Exact: a per-tenant
//     ring of the last perTenantHourly timestamps. Record sweeps two tenants
//     per call, dropping those whose boosts all aged out.
//
// perTenantHourly 0 is unlimited (nothing stored); shareMax 0 disables
// boost. Update changes both live, keeping each ring's newest timestamps.
// Allow never mutates; Record a boost only when one is dispatched. Allow's
// reason is "" or ReasonDisabled, ReasonShare, ReasonTenantHourly, checked
// in that order.
//
// # Decision
//
// With limit = Deadline - Margin (a negative Margin counts as 0):
//
//	Wait    if Now+ETA      <= limit
//	Boost   if BoostAllowed and Now+BoostETA <= limit
//	Reject  otherwise
//
// An ETA >= Never never meets a deadline; a negative one counts as 0; a
// zero Deadline is Wait. Re-run at every dispatch or tick while queued, this
// rejects a request shortly before its deadline instead of serving it late.
//
// RetryAfter rounds up to whole seconds within [1s, MaxRetryAfter = 60s]:
// official OpenAI clients honour up to 60 s, and an ETA minutes ahead is
// too uncertain to promise.
package budget
