// Package degrade is the overload ladder of caddy-fair-queue: a declared,
// ordered list of degrade steps driven by a single "water level", with
// hysteresis and a minimum hold time so that it neither reacts late nor flaps;
// and the tiered circuit breaker built on the same engine (see Circuit).
//
// The package is pure: it imports nothing of the project, no Caddy and no
// net/http, and never reads the wall clock. Every time is passed in by the
// caller, so the ladder runs unchanged under a virtual clock.
//
// # Model
//
// Water level. A float64 in [0, +inf) computed by the caller (fairqueue uses
// max(queued requests / max_queue, queued cost / max_queue_tokens)). The
// ladder only compares it with its lines; a NaN water level compares false
// with every line and therefore never causes a transition.
//
// Ladder. An ordered list of steps L1..Ln. Each step has a trigger line, a
// recovery line strictly below it (0 < Recover < Trigger), and one Action.
// Triggers strictly increase from step to step; recovery lines never decrease
// (equal recovery lines are allowed and release together).
//
// Levels are cumulative. Level k means exactly steps 1..k are engaged; level
// 0 means none is. Active returns the actions of steps 1..k in step order.
// When two engaged steps carry an action of the same kind for the same class
// (say L1 throttles realtime at 100/s and L3 at 20/s), the higher step is
// meant to supersede the lower one: applying Active in order and letting a
// later action overwrite an earlier one gives exactly that.
//
// Lines. At an observation with water level w:
//
//   - step k+1 (the first step above the current level k) engages when
//     w > Trigger(k+1);
//   - step k (the highest engaged step) releases when w < Recover(k).
//
// Water between a step's Recover and Trigger, both inclusive, never changes
// that step.
//
// # Hold rule
//
// Every step remembers the time of its last transition. Step i may make a
// transition (engage or release) at an observation at time now only if it has
// never made one on this ladder (nor on a ladder it carried state from), or
//
//	now.Sub(lastTransition(i)) >= hold
//
// Observe applies the lines and the hold rule step by step, keeping levels
// cumulative:
//
//   - going up, it engages step level+1, then level+2, ... for as long as
//     the next step's trigger is exceeded and its hold has elapsed, and stops
//     at the first step that fails either test (a step held out by its hold
//     time therefore also holds out every step above it);
//   - going down, it releases step level, then level-1, ... for as long as
//     the step's recovery line is undercut and its hold has elapsed, and
//     stops at the first step that fails either test.
//
// Because Recover(k) < Trigger(k) < Trigger(k+1), one observation can never
// both engage and release: it goes up, or down, or does nothing.
//
// Steps that have never moved carry no hold, so a fresh ladder can jump from
// level 0 to level n in a single observation: water rising fast is exactly
// when every step is wanted at once. The same holds for a jump of several
// levels later on, for every step whose own hold has elapsed.
//
// # Guarantees
//
// Guarantees 1, 2, 3 and 5 hold for any sequence of times; 4 assumes the
// times passed to Observe never decrease (a time earlier than a step's last
// transition makes now.Sub(...) negative, which only holds that step).
//
//  1. Cumulative: the engaged steps are always exactly 1..Level().
//  2. Hysteresis: a step engages only at an observation whose water level is
//     above its trigger and releases only at one whose water level is below
//     its recovery line.
//  3. Hold: two consecutive transitions t1, t2 of the same step satisfy
//     t2 - t1 >= hold. Hence a step makes at most one transition in any
//     half-open interval [t, t+hold), its transitions alternate engage,
//     release, engage, ..., and water oscillating around a line, however
//     fast, moves a step at most once per hold interval.
//  4. Bounded delay: if every observation at a time >= t0 has water above
//     Trigger(K), then every observation at a time >= t0+hold ends with
//     Level() >= K (the first one gets there in a single call, however many
//     steps that takes). Symmetrically, if every observation at a time >= t0
//     has water below Recover(K), every observation at a time >= t0+hold
//     ends with Level() < K. So the ladder follows a sustained change within
//     hold plus one observation interval.
//     (Monotone lines make "above Trigger(K)" imply "above every lower
//     trigger", and "below Recover(K)" imply "below every higher recovery
//     line".)
//  5. Reporting: Observe returns the transitions it made, in the order made
//     (ascending steps going up, descending going down); each changes the
//     level by exactly one, and consecutive ones chain (To of one is From of
//     the next). Observe returns nil and allocates nothing when nothing
//     changes, and makes one allocation (the returned slice) otherwise.
//
// # Reload
//
// Carry lets the ladder built from a new configuration adopt the live state
// of the ladder it replaces, so a config reload does not reset an engaged
// degrade: the longest common prefix of step names keeps its engaged/released
// state and its hold timers; see Carry.
//
// # Circuit
//
// Circuit is the tiered circuit breaker (circuit_break): when the demand on
// the gateway stays above what the upstreams can serve, it sheds callers
// tier by tier, lowest first, and readmits them top first when demand falls.
// It is a Ladder with one step per tier but the top one, each step driven by
// its own signal; the lines, the hold rule and cumulative levels are the
// ladder's, applied by the same code.
//
// Tiers. Order lists the tiers lowest first, at least two. Level k means
// exactly Order[0..k-1] are shed; the top tier, Order[n-1], is never shed,
// so Level() <= n-1. Arrivals whose tier is empty or not in Order are
// tier-less: never shed, counted as demand in every signal.
//
// Demand. Arrive records every arrival's units, the refused ones included,
// so the demand of a shed tier stays measured: it is exactly what
// readmitting the tier would bring back (a refused caller that retries is
// counted at each retry, which is why shed requests carry a Retry-After;
// see ReadmitIn). Demand is averaged over a sliding
// Window cut into 10 buckets (bounded memory: 11 buckets × (resources ×
// (tiers+1) + 1) sums);
// the window slides by Window/10, and the oldest bucket counts in
// proportion to the part of it still inside the window, so a steady stream
// reads steady. Time before the circuit's first call counts as no demand:
// a fresh circuit under-reads for its first Window, which only delays a
// trip. Arrive costs O(tiers + resources) and never allocates; Observe
// costs O(tiers × resources), plus O(10 × tiers × resources) once per
// bucket width to re-sum the window.
//
// Resources and capacity. Demand is measured in one or more resources
// (NewCircuit's list; fairqueue uses the slots' busy time, in slot-seconds,
// and, behind a provider account, its tokens and requests), and Observe
// compares each with that resource's capacity, in the same unit per
// second: what the upstreams can serve, not what they served. (Served
// throughput follows admitted demand when the upstreams are not saturated,
// which would keep a shed tier's would-be ratio above the recovery line
// for ever.) The unit must not swing with the mix of requests: a capacity
// measured in tokens on short answers reads a stream of long prompts as
// overload. A capacity <= 0, NaN or infinite is no data on its resource,
// not overload; with no data at all nothing moves.
//
// Signal. With D_r(k) the windowed demand on resource r of tiers k..n-1
// plus tier-less demand, and C_r its capacity, step k's signal is the
// largest D_r(k)/C_r: the resource that runs out first. It is the same
// quantity on both sides of the step:
//
//   - at level k, tier k is shed when the signal > Trigger: the demand of
//     the tiers still admitted is over the line;
//   - at level k+1, tier k is readmitted when the signal < Recover: the
//     demand with tier k readmitted is under the line.
//
// Saturation gate. Saturated tells the circuit when the upstreams are
// saturated (every slot busy, or the account exhausted, with requests
// waiting), and it keeps the saturated share of the window in the same
// buckets as demand. A tier is shed only while that share is at least
// Saturation (default 0.9): demand over the line while capacity idles
// means the demand estimate is wrong, not that callers must go. Readmission
// is not gated: a shed tier leaves the upstreams unsaturated by design.
//
// Using the would-be demand to readmit is what prevents flapping: right
// after tier k is readmitted the admitted demand is D(k) < Recover × C, so
// shedding it again needs D(k) to really grow by more than a factor
// Trigger/Recover (30 % with the defaults, at constant capacity).
// Readmitting by the admitted demand instead (which drops as soon as the
// tier is shed: 1.5x with 40 % in the lowest tier leaves 0.9x admitted)
// would readmit and shed again every hold for as long as the overload
// lasts.
//
// Signals never increase from a lower tier to a higher one (D_r(k) >=
// D_r(k+1) on every resource, computed as suffix sums from the top so
// this holds bit for bit, and so for their largest ratio), and
// Recover < Trigger; so, as on the ladder, one observation sheds or
// readmits or does nothing, never both. Going up it sheds tier level, then
// level+1, ..., while the next signal is above Trigger and the tier's hold
// allows; going down it readmits tier level-1, then level-2, ..., while the
// signal is below Recover and the hold allows.
//
// Hold is the ladder's hold rule, per tier: two transitions of one tier
// are at least Hold apart; a tier that never moved is not held. Hold is not
// also a time demand must stay over the line before a trip: the window
// already is that filter (demand at d × capacity for s seconds adds only
// d·s/Window to the ratio), and a second timer would only add delay.
//
// Circuit guarantees. For any sequence of calls (5 assumes non-decreasing
// times):
//
//  1. Cumulative, top protected: the shed tiers are exactly
//     Order[0..Level()-1], and Level() <= len(Order)-1.
//  2. Lines: tier k is shed only at an Observe where its signal (the
//     largest D_r(k)/C_r) > Trigger and the upstreams were saturated for at
//     least Saturation of the window, and readmitted only at one where its
//     signal < Recover, both measured at that Observe's time.
//  3. Hold: two transitions of one tier are at least Hold apart, so demand
//     oscillating however fast moves a tier at most once per Hold.
//  4. No flapping: while the windowed demand and the capacity stay
//     constant, each tier moves at most once (up to the level where the
//     admitted demand is at most Trigger × C, or the top tier alone is
//     left; or down to where readmitting one more tier would reach Recover).
//     After the settling moves, the admitted ratio D(Level())/C is at most
//     Trigger unless only the top tier is admitted.
//  5. Bounded delay: if the demand of every tier is steady from t0 on (and
//     the capacity constant, and the upstreams saturated from t0 on while
//     the admitted demand is over Trigger), the window reads it fully from
//     t1 = t0 + Window + Window/10 on, and the first Observe at or after
//     t1 + Hold ends in the settled state of 4 (the ladder's guarantee 4,
//     applied to each step's signal: by then no hold set before t1 is left).
//  6. Reporting: Observe returns the transitions made, in order, each
//     moving the level by one; nil without allocating when nothing changes.
//     CircuitTransition.Ratio is the signal that crossed the line.
//
// Reload. Circuit.Carry keeps the shed state and hold timers of the longest
// common prefix of Order (top tier excluded), like Ladder.Carry, and seeds
// the new window with the old measured rate per resource and tier, by
// name, and with the old saturated share.
//
// # Throttle
//
// Throttle is the token bucket behind the throttle action, built on
// golang.org/x/time/rate with the time passed in; see Throttle and Admit.
//
// # Concurrency
//
// A Ladder is not safe for concurrent use: the caller serialises Observe,
// Level, Active, Steps and Carry (fairqueue calls them under its own lock).
// Carry also reads the old ladder, which must not be observed concurrently.
// The same holds for a Circuit: every method, Shed and Demand included,
// needs the caller's lock (Demand and ReadmitIn read state that Arrive and
// Observe write).
// A Throttle is safe for concurrent use. Step, Action and Rate are values.
package degrade
