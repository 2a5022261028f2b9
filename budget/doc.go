// Package budget turns "work ahead of a request" into time, and time into a
// decision: wait, boost, or reject at once with a Retry-After.
//
// The package is pure. It imports nothing of the project, neither Caddy nor
// net/http, and never reads the clock: every method takes "now" as an
// argument, so it runs unchanged under the simulator's virtual clock. No type
// here is safe for concurrent use; the scheduler (package fairqueue) calls it
// under its own lock. Times passed in must not go backwards; a time earlier
// than one already seen is treated as that earlier-seen time.
//
// # Model
//
// The scheduler owns the queue and measures work in its own cost units
// (estimated tokens, or 1 per request with cost_unit requests). For a queued
// request it computes workAhead: the cost that will be dispatched before it in
// virtual-tag order. This package supplies the rest:
//
//	rate     = Throughput.Rate(now, healthy)      cost units per second
//	ETA      = workAhead / rate                   ETA(workAhead, rate)
//	decision = Decide(Input{Now, Deadline, ETA, BoostETA, BoostAllowed, Margin})
//
// # Throughput
//
// Throughput is a sliding window of Window (default 60s) split into Buckets
// (default 12) buckets of width w = Window/Buckets. Only completed buckets are
// used, so the estimate changes once per bucket and is cached in between:
// Rate is O(1) except on the first call in a new bucket, which costs
// O(Buckets²) at worst (default 144 steps) and allocates nothing.
//
// Normalisation. Observe(now, cost, healthy) adds cost/healthy to the current
// bucket: completions are counted per healthy upstream, so a capacity change
// does not poison the window. Rate(now, healthy) multiplies the per-upstream
// estimate by the healthy count at the time of the call, so losing one of two
// upstreams halves the rate, and every ETA doubles, at once; when it comes
// back the rate is restored at once. "healthy" may be any capacity measure
// (upstreams, or dispatch slots for unequal upstreams) as long as Observe and
// Rate use the same one. healthy <= 0 in Observe counts as 1; in Rate it gives
// 0 (nothing can be served).
//
// Busy time, not wall time. A completion rate measures capacity only while
// the system is saturated; while it is idle it measures demand. The scheduler
// therefore reports saturation with SetBusy(now, busy): busy should be true
// while no dispatch slot is free or a request is waiting (that is, whenever a
// free slot would be filled at once). Each bucket accumulates its busy time
// and the cost of the completions observed while busy; completions observed
// while not busy are ignored for the rate, and a bucket with no busy time is
// skipped entirely. So an idle minute neither drags the rate to zero nor
// inflates it. Call Observe for a completion before updating the busy state
// that the completion causes. A new Throughput starts not busy: a scheduler
// that never calls SetBusy never leaves the prior.
//
// Samples. Per-bucket rates are useless when completions are sparse or come
// in clumps (long generations, batched decoding): a saturated bucket with no
// completion is a true zero, and a low quantile of many such zeros is zero.
// Samples are therefore formed from consecutive complete buckets, newest
// first, skipping idle buckets: a sample closes as soon as it holds at least
// one bucket width of busy time AND at least MinCompletions (default 4)
// completions; its rate is its cost divided by its busy time. Whatever is
// left at the old end is merged into the oldest sample (or, when there is no
// sample at all, becomes the only one, so a window that was busy with no
// completion at all reads as rate 0: the upstreams are stalled). With steady
// traffic every busy bucket is its own sample; with sparse or bursty traffic
// samples stretch until they hold enough completions, so the rate is "time to
// finish MinCompletions requests", which is what a queue waits for.
//
// Low quantile. The measured per-upstream rate is the Quantile (default 0.25)
// of the sample rates, interpolated linearly between order statistics
// (the "type 7" rule of R and NumPy). A low quantile, because LLM throughput
// is long-tailed: a few slow generations stall a bucket, and an ETA should be
// met in most windows, not on average.
//
// Cold start and the prior. Prior is the per-upstream rate (cost units per
// second per unit of healthy) assumed before any data. With covered = the
// busy time inside the samples and W = Warmup (default Window/4):
//
//	perUpstream = f·measured + (1-f)·base,  f = min(1, covered/W)
//
// where base is the last fully warmed-up measured value (covered >= W and
// measured > 0) if there has been one, else Prior. So the prior fades out
// linearly over the first W of saturated operation, and after an idle spell
// longer than the window the estimator resumes from what it last learned,
// not from the configured guess. A stall (measured 0) is never learned. With
// Prior <= 0 and nothing learned yet, any data is used as is (f = 1) and no
// data gives rate 0.
//
// # ETA
//
// ETA(workAhead, rate) = workAhead/rate seconds, rounded up to the
// nanosecond; workAhead <= 0 gives 0 (nothing ahead: dispatch now, whatever
// the rate); rate <= 0 (or a result too large) gives Never. Never is 2^62 ns,
// about 146 years: large enough to fail every deadline, small enough that
// adding to it any shorter duration, or adding it to a time.Time, does not
// overflow. Decide treats any ETA >= Never as never.
//
// BoostETA(boostAhead, slotWork, rate) is the time for a boosted request to
// reach a slot: the work already waiting in the boost lane plus the work that
// must complete before a slot frees, at the current rate. A good slotWork is
// Throughput.MeanCost (the mean cost of one completion, so slotWork/rate is
// the mean time between completions), falling back to the request's own cost
// when MeanCost is 0.
//
// Budget(classDefault, tenantOverride, requested) applies the DESIGN rule: a
// tenant override replaces the class default; a request header may shorten,
// never lengthen, the result.
//
// # Boost budget
//
// Boosts bounds two things (DESIGN section 4):
//
//   - Share. Limit(capacity) = floor(shareMax·capacity), but at least 1 when
//     shareMax > 0 and capacity > 0, and 0 when either is <= 0; shareMax is
//     clamped to [0, 1] and 1e-9 is added before the floor so that e.g.
//     0.29·100 gives 29, not 28. With shareMax 0.10: capacity 1..19 -> 1,
//     20..29 -> 2, 30..39 -> 3, 40 -> 4. capacity is the total dispatch slots:
//     boosts happen only when the system is saturated, so then in-flight equals
//     capacity and the bound "boosted <= shareMax of in-flight" holds (the
//     at-least-one rule lets a small deployment boost at all, exceeding the
//     share below 1/shareMax slots).
//   - Rolling hour. Each tenant may be boosted at most perTenantHourly times
//     in any 60-minute window. A boost recorded at t counts during [t, t+1h):
//     at exactly t+1h it has aged out. The check is exact: a per-tenant ring
//     keeps the timestamps of the last perTenantHourly boosts, and the next
//     boost is allowed iff the ring is not full or its oldest entry has aged
//     out. Memory is perTenantHourly·8 bytes per tenant that boosted within
//     the last hour; Record sweeps two tenants per call and drops those whose
//     newest boost has aged out, and Prune(now) sweeps all.
//
// perTenantHourly 0 means unlimited per tenant (and nothing is stored);
// shareMax 0 disables boost. Update changes both live: counts are kept (each
// ring is resized keeping its newest timestamps); changing to unlimited drops
// them, and changing from unlimited starts from zero, since nothing was
// stored.
//
// Allow never mutates; the caller Records a boost only when it actually
// dispatches one. Allow's reason is "" when ok, else ReasonDisabled,
// ReasonShare or ReasonTenantHourly (checked in that order), fit for a metric
// label.
//
// # Decision
//
// With limit = Deadline - Margin (a negative Margin counts as 0):
//
//	Wait    if Now+ETA      <= limit
//	Boost   if BoostAllowed and Now+BoostETA <= limit
//	Reject  otherwise
//
// An ETA or BoostETA >= Never never meets a deadline; a negative one counts as
// 0. A zero Deadline means no deadline: Wait. The scheduler re-runs Decide
// at admission and on each dispatch or tick while the request is queued;
// with ETA 0 this also yields Reject once Now passes Deadline-Margin, so a
// request is refused shortly before its deadline instead of being dispatched
// after it.
//
// RetryAfter(eta) rounds eta up to whole seconds, at least 1s and at most
// MaxRetryAfter (60s). The cap matches what official OpenAI clients honour
// (they follow a Retry-After of up to 60 seconds and fall back to their own
// backoff beyond), and an ETA minutes ahead is too uncertain to promise. Never
// gives MaxRetryAfter.
package budget
