// Package degrade is the overload ladder of caddy-fair-queue: an ordered
// list of degrade steps driven by one "water level", with hysteresis and a
// minimum hold time so that it neither reacts late nor flaps; and the tiered
// circuit breaker built on the same engine (Circuit).
//
// The package is pure: no project imports, no Caddy, no net/http, no wall
// clock. Every time is passed in, so it runs unchanged on a virtual clock.
//
// # Ladder
//
// Water level: a float64 >= 0 computed by the caller (fairqueue uses
// max(queued requests / max_queue, queued cost / max_queue_tokens)). A NaN
// compares false with every line and never causes a transition.
//
// Steps L1..Ln each have a trigger, a recovery line with
// 0 < Recover < Trigger, and one Action. Triggers strictly increase;
// recovery lines never decrease (equal ones release together). Levels are
// cumulative: level k means exactly steps 1..k are engaged. Active returns
// their actions in step order, so when two engaged steps act on the same
// class, applying them in order lets the higher step supersede the lower.
//
// At an observation with water w, step k+1 engages when w > Trigger(k+1),
// and step k (the highest engaged) releases when w < Recover(k); water
// between the two lines never moves a step.
//
// Hold rule: a step may make a transition at time now only if it never made
// one (on this ladder or one it carried state from), or
// now.Sub(lastTransition) >= hold. Observe engages level+1, level+2, ...
// while the next trigger is exceeded and its hold has elapsed, or releases
// level, level-1, ... while the recovery line is undercut and the hold has
// elapsed, stopping at the first step that fails either test. Since
// Recover(k) < Trigger(k) < Trigger(k+1), one observation never both
// engages and releases. Steps that never moved carry no hold, so a fresh
// ladder can jump from 0 to n at once: fast-rising water wants every step.
//
// # Guarantees
//
// 4 assumes non-decreasing times (an earlier time only holds a step); the
// others hold for any sequence:
//
//  1. Cumulative: the engaged steps are exactly 1..Level().
//  2. Hysteresis: a step engages only when water is above its trigger and
//     releases only when below its recovery line.
//  3. Hold: two consecutive transitions of a step are at least hold apart,
//     so water oscillating however fast moves a step at most once per hold.
//  4. Bounded delay: if every observation from t0 on has water above
//     Trigger(K), every observation from t0+hold on ends with
//     Level() >= K; symmetrically below Recover(K) gives Level() < K.
//  5. Reporting: Observe returns its transitions in order, each moving the
//     level by one, chained (To of one is From of the next); nil and no
//     allocation when nothing changes, one allocation otherwise.
//
// Carry lets a ladder built from a new configuration adopt the state of the
// one it replaces, so a reload does not reset an engaged degrade: the
// longest common prefix of step names keeps its state and hold timers.
//
// # Circuit
//
// Circuit is the tiered circuit breaker (circuit_break): while demand stays
// above what the upstreams can serve it sheds callers tier by tier, lowest
// first, and readmits them top first when demand falls. It is a Ladder with
// one step per tier but the top one, each driven by its own signal.
//
// Tiers: Order lists them lowest first, at least two. Level k means
// Order[0..k-1] are shed; the top tier is never shed. Arrivals with a tier
// not in Order are tier-less: never shed, counted in every signal.
//
// Demand: Arrive records every arrival's units, refused ones included, so a
// shed tier's demand stays measured (a retrying caller counts at each
// retry, hence the Retry-After of ReadmitIn). It is averaged over a sliding
// Window of 10 buckets, the oldest counted in proportion to the part still
// inside; time before the first call counts as no demand, which only delays
// a trip. Arrive is O(tiers + resources) without allocating; Observe is
// O(tiers × resources), plus a re-sum once per bucket width.
//
// Capacity: demand is measured in one or more resources (fairqueue: slot
// busy time, and behind a provider account its tokens and requests) and
// compared with what the upstreams can serve per second, not what they
// served: served throughput follows admitted demand and would keep a shed
// tier out for ever. The unit must not swing with the request mix. A
// capacity <= 0, NaN or infinite is no data, not overload.
//
// Signal: with D_r(k) the windowed demand on resource r of tiers k..n-1
// plus tier-less demand, and C_r its capacity, step k's signal is
// max_r D_r(k)/C_r. At level k tier k is shed when it exceeds Trigger; at
// level k+1 tier k is readmitted when it is below Recover, i.e. when the
// demand with tier k readmitted would be under the line. Using this
// would-be demand is what prevents flapping: after readmission, shedding
// again needs demand to grow by Trigger/Recover. Signals never increase
// from a lower tier to a higher one (suffix sums, so bit for bit), so one
// observation sheds or readmits, never both.
//
// Saturation gate: Saturated records when every slot is busy (or the
// account exhausted) with requests waiting. A tier is shed only while the
// saturated share of the window is at least Saturation (default 0.9):
// demand over the line while capacity idles means the estimate is wrong.
// Readmission is not gated. Hold applies per tier as on the ladder; the
// window already filters short bursts, so no second timer delays a trip.
//
// Circuit guarantees (5 assumes non-decreasing times):
//
//  1. The shed tiers are exactly Order[0..Level()-1], Level() < len(Order).
//  2. Tier k is shed only when its signal > Trigger and the upstreams were
//     saturated for at least Saturation of the window, and readmitted only
//     when its signal < Recover.
//  3. Two transitions of one tier are at least Hold apart.
//  4. While demand and capacity stay constant each tier moves at most once;
//     once settled, the admitted ratio is at most Trigger unless only the
//     top tier is admitted.
//  5. If demand is steady from t0 on (capacity constant, upstreams saturated
//     while admitted demand is over Trigger), the first Observe at or after
//     t0 + Window + Window/10 + Hold ends in the settled state of 4.
//  6. Observe reports transitions as the ladder does;
//     CircuitTransition.Ratio is the signal that crossed the line.
//
// Circuit.Carry keeps the shed state and hold timers of the longest common
// prefix of Order, and seeds the new window with the old rates per
// resource and tier, by name, and the old saturated share.
//
// # Throttle
//
// Throttle is the token bucket of the throttle action, on
// golang.org/x/time/rate with the time passed in.
//
// # Concurrency
//
// Ladder and Circuit are not safe for concurrent use: the caller serialises
// every method (fairqueue holds its lock); Carry also reads the old one.
// A Throttle is safe for concurrent use. Step, Action and Rate are values.
package degrade
