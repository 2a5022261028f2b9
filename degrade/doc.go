// Package degrade is the overload ladder of caddy-fair-queue: a declared,
// ordered list of degrade steps driven by a single "water level", with
// hysteresis and a minimum hold time so that it neither reacts late nor flaps.
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
// A Throttle is safe for concurrent use. Step, Action and Rate are values.
package degrade
