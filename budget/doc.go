// Package budget turns "work ahead of a request" into time, and time into a
// decision: wait, boost, or reject at once with a Retry-After.
//
// The package is pure: no project imports, no Caddy, no net/http, no clock;
// every method takes "now". No type is safe for concurrent use; fairqueue
// calls it under its lock. A time earlier than one already seen counts as
// the one seen.
//
// # Model
//
// The scheduler computes workAhead, the cost dispatched before a request in
// virtual-tag order, in its cost units. This package does the rest:
//
//	rate     = Throughput.Rate(now, healthy)      cost units per second
//	ETA      = workAhead / rate                   ETA(workAhead, rate)
//	decision = Decide(Input{Now, Deadline, ETA, BoostETA, BoostAllowed, Margin})
//
// # Throughput
//
// A sliding Window (default 60s) of Buckets (default 12); only completed
// buckets count, so the estimate changes once per bucket and is cached.
// Observe adds cost/healthy and Rate multiplies by the current healthy
// count, so losing one of two upstreams halves the rate at once.
//
// A completion rate measures capacity only while saturated: the scheduler
// calls SetBusy, and idle time and idle completions are ignored, so an idle
// minute neither drags the rate down nor inflates it.
//
// Samples: consecutive complete busy buckets, newest first, form a sample
// once they hold a bucket width of busy time and MinCompletions (default
// 4) completions; its rate is cost / busy time. The per-upstream rate is
// the Quantile (default 0.25) of the sample rates, interpolated linearly:
// LLM throughput is long-tailed and an ETA should hold in most windows.
//
// Prior: with covered = busy time inside the samples and W = Warmup
// (default Window/4),
//
//	perUpstream = f·measured + (1-f)·base,  f = min(1, covered/W)
//
// where base is the last fully warmed-up measured rate if any, else Prior:
// after an idle spell the estimator resumes from what it learned, and a
// stall is never learned.
//
// # Boost budget
//
// Limit(capacity) = floor(shareMax·capacity), at least 1 when both are > 0:
// boosts happen only when saturated, so "boosted <= shareMax of in-flight"
// holds. A tenant gets at most perTenantHourly boosts in any rolling hour,
// kept exactly in a per-tenant ring of its last boost times.
//
// # Decision
//
// With limit = Deadline - Margin:
//
//	Wait    if Now+ETA      <= limit
//	Boost   if BoostAllowed and Now+BoostETA <= limit
//	Reject  otherwise
//
// Re-run at every dispatch or tick while queued, this rejects a request
// shortly before its deadline instead of serving it late.
package budget
