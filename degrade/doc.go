// Package degrade is the overload ladder: an ordered list of degrade steps
// driven by one "water level", with hysteresis and a minimum hold time so
// that it neither reacts late nor flaps; and the tiered circuit breaker
// built on the same engine (Circuit).
//
// The package is pure: no project imports, no Caddy, no net/http, no wall
// clock. Every time is passed in, so it runs unchanged on a virtual clock.
//
// # Ladder
//
// The water level is a float64 >= 0 computed by the caller (fairqueue:
// max(queued / max_queue, queued cost / max_queue_tokens)); NaN never moves
// a step. Steps L1..Ln each have a trigger, a recovery line with
// 0 < Recover < Trigger, and one Action. Triggers strictly increase;
// recovery lines never decrease. Level k means exactly steps 1..k are
// engaged; Active returns their actions in step order, so a higher step
// supersedes a lower one on the same class.
//
// Step k+1 engages when water > Trigger(k+1); step k, the highest engaged,
// releases when water < Recover(k). A step may move only if it never moved
// or its last transition is at least hold ago. Observe engages (or
// releases) steps one after the other while both tests pass; one
// observation never both engages and releases. A fresh ladder can jump
// from 0 to n at once: fast-rising water wants every step.
//
// Guarantees (4 assumes non-decreasing times):
//
//  1. Cumulative: the engaged steps are exactly 1..Level().
//  2. Hysteresis: a step engages only above its trigger and releases only
//     below its recovery line.
//  3. Hold: two transitions of a step are at least hold apart.
//  4. Bounded delay: if water stays above Trigger(K) from t0 on, every
//     observation from t0+hold on ends with Level() >= K; symmetrically
//     below Recover(K).
//  5. Reporting: Observe returns its transitions in order, each moving the
//     level by one; nil and no allocation when nothing changes.
//
// Carry lets a ladder from a reloaded configuration adopt the state of the
// longest common prefix of step names, so a reload does not reset it.
//
// # Circuit
//
// Circuit (circuit_break) sheds callers tier by tier, lowest first, while
// demand stays above what the upstreams can serve, and readmits them top
// first when it falls. It is a Ladder with one step per tier but the top
// one, each driven by its own signal. Arrivals with a tier not in Order
// are never shed and count in every signal.
//
// Demand: Arrive records every arrival's units, refused ones included, so
// a shed tier's demand stays measured. It is averaged over a sliding Window
// of 10 buckets, the oldest counted in proportion to the part still
// inside. Demand is measured in one or more resources, each compared with
// what the upstreams can serve per second (not what they served, which
// follows admitted demand and would keep a shed tier out for ever). A
// capacity <= 0, NaN or infinite is no data.
//
// Signal: with D_r(k) the windowed demand on resource r of tiers k..n-1
// plus tier-less demand, and C_r its capacity, step k's signal is
// max_r D_r(k)/C_r. Tier k is shed when it exceeds Trigger and readmitted
// when below Recover: the demand with tier k readmitted, which is what
// prevents flapping. Signals never increase from a lower tier to a higher
// one (suffix sums), so one observation sheds or readmits, never both.
//
// Saturation gate: a tier is shed only while the upstreams were saturated
// (Saturated: every slot busy with requests waiting) for at least
// Saturation of the window: demand over the line while capacity idles
// means the estimate is wrong. Readmission is not gated.
//
// Circuit guarantees (5 assumes non-decreasing times):
//
//  1. The shed tiers are exactly Order[0..Level()-1], Level() < len(Order).
//  2. Tier k is shed only when its signal > Trigger and the gate is open,
//     and readmitted only when its signal < Recover.
//  3. Two transitions of one tier are at least Hold apart.
//  4. While demand and capacity stay constant each tier moves at most once.
//  5. If demand is steady from t0 on, the first Observe at or after
//     t0 + Window + Window/10 + Hold ends in the settled state.
//
// Circuit.Carry keeps the shed state and hold timers of the longest common
// prefix of Order and seeds the new window with the old rates.
//
// # Concurrency
//
// Ladder and Circuit are not safe for concurrent use: the caller serialises
// every method (fairqueue holds its lock). A Throttle is safe for
// concurrent use.
package degrade
