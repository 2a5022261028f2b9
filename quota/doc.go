// Package quota is the tenant quota engine: per-tenant limits on requests
// per second, tokens per minute, and a joint "request-equivalents per
// second" that weighs tokens against requests, each with an elastic burst
// window that is paid back.
//
// Fair queuing shares the capacity that exists; a quota caps what a tenant
// may take even when capacity is idle. The engine is pure: no project
// imports, no Caddy, no network, and time only from the clock it is given.
// The store several gateways share, on Redis, is package cluster's
// QuotaStore.
//
// # Meters
//
// A tenant's Config gives up to three meters, each with a rate r in its own
// units:
//
//   - qps: one unit per request, r = qps per second;
//   - tokens: one unit per token, r = tokens_per_min / 60 per second;
//   - joint: 1 + tokens x token_to_qps_weight units per request
//     (request-equivalents), r = qps x joint_cap per second.
//
// A request is charged its estimated tokens and corrected to its actual
// tokens when it completes (Reconcile).
//
// # Algorithm: GCRA with an elastic window
//
// Each meter is a generic cell rate algorithm (virtual-scheduling form) on
// its theoretical arrival time TAT: when the tenant would have paid for
// everything charged so far at exactly rate r. With T = 1/r per unit and
// the burst tolerance tau = burst_allow x burst_window, a request at time t
//
//   - conforms iff TAT <= t + tau (the debt TAT - t is within the window);
//   - when charged c units, sets TAT = max(TAT, t) + c x T.
//
// A request is allowed iff it conforms to every meter, and is then charged
// to all of them, or to none (refused requests cost nothing). A refused
// request's earliest time is max over meters of TAT - tau; the meter that
// sets it is the reason.
//
// A request's size decides how long its tenant pays afterwards, not
// whether it may start: a size test at the door would refuse forever any
// request larger than the window.
//
// # Guarantees
//
// For one meter with rate r, tolerance tau and requests of at most c_max
// units:
//
//  1. Rate. Over any interval of length D, the units charged are at most
//     r x (D + tau) + c_max; a tenant always ready is charged r x D + O(tau).
//  2. Elastic window. A tenant at rest at s sending at (1 + burst_allow) x r
//     is fully served over [s, s + burst_window]. Any shape with the same
//     excess is served too: the window bounds the excess volume, not the
//     peak.
//  3. Held, then paid back. Past the window the tenant is admitted at
//     exactly r. Its debt falls only while it runs under its rate, by
//     (1 - u) per second at a fraction u of the rate; once repaid, a full
//     window is available again.
//  4. Exact earliest time. With nothing else charged in between, the same
//     request decided at a refusal's At is allowed (and one nanosecond
//     earlier is not, on the binding meter).
//  5. Atomic charge. All of a request's meters are charged, or none.
//  6. Reconcile. At completion the token and joint meters move by the
//     difference between actual and estimated charge: extra debt, or a
//     refund that never takes a meter below rest. Guarantee 1 holds for
//     actual tokens. A refund beyond the debt is lost, so a tenant that
//     over-estimates is served below its rate: better estimates are the
//     cure, not credit beyond the window.
//  7. Bounded memory. A tenant whose TATs are all <= now is
//     indistinguishable from an unknown one; stores may forget it at any
//     time (Memory sweeps at most every DefaultSweepEvery).
//
// Times are integer nanoseconds and every increment is rounded once
// (Limits.Increment), so 2 to 4 hold exactly.
//
// # Headers
//
// Status gives, per meter, what OpenAI's x-ratelimit-* headers carry:
// Limit per minute, Remaining units sendable now back to back, Reset the
// time until rest.
//
// # Stores
//
// Store's methods are each one read-modify-write of one tenant's three
// TATs with inputs computed from Limits beforehand, so a Redis store does
// each in one round trip. Memory is the in-process store.
//
// Local is a cluster gateway's store: the shared store while it answers,
// and from the first call that fails or times out a local Memory on every
// quota scaled by 1/instances (Limits.Scale), so the instances' bursts add
// up to one. It reports an outage once as it starts and once as it ends;
// meanwhile no call waits on Redis: a background probe every Retry finds
// it back. An error about one tenant (LocalOptions.Outage) is decided
// locally without starting an outage. A Peek with nothing ahead, for a
// tenant Redis last said would be at rest by now, is answered without a
// round trip; any other Peek counts the backlog ahead Instances times.
package quota
