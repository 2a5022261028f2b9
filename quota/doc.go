// Package quota is the tenant quota engine of caddy-fair-queue:
// per-tenant limits on requests per second, tokens per minute, and a joint
// "request-equivalents per second" that weighs tokens against requests, each
// with an elastic burst window that is paid back.
//
// Fair queuing shares the capacity that exists; a quota caps what a tenant
// may take even when capacity is idle (contracts, cost). The engine is
// pure: it imports nothing of the project, no Caddy, no network client,
// and reads time only from the clock it is given. The store several
// gateways share, on Redis, is package cluster's QuotaStore.
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
// A request is measured by its estimated tokens when it is charged and
// corrected to its actual tokens when it completes (Reconcile).
//
// # Algorithm: GCRA with an elastic window
//
// Each meter is a generic cell rate algorithm (virtual-scheduling form) on
// one number, its theoretical arrival time TAT: the time at which the tenant
// would have paid for everything charged so far, had it been charged at
// exactly rate r. With T = 1/r per unit and the burst tolerance
//
//	tau = burst_allow x burst_window
//
// a request at time t
//
//   - conforms to the meter iff TAT <= t + tau (the debt TAT - t, in seconds
//     of rate, is within the window);
//   - when charged with c units, sets TAT = max(TAT, t) + c x T.
//
// A request is allowed iff it conforms to every meter of its tenant; it is
// then charged to all of them at once, or, if it does not conform to one,
// to none (refused requests cost nothing). A refused request's earliest
// time is max over meters of TAT - tau, and the binding dimension (the
// refusal's reason) is the meter that sets that maximum.
//
// The size of a request does not decide whether it may start, only how
// long its tenant pays afterwards: a 20k-token request of a tenant at rest
// starts, and pushes the token meter's debt to its size; the tenant's next
// request waits until the debt is back within tau. A size test at the door
// would refuse forever any request larger than the window.
//
// # Guarantees
//
// For one meter with rate r, tolerance tau, and requests of at most c_max
// units:
//
//  1. Rate. Over any interval of length D, the units charged are at most
//     r x (D + tau) + c_max. A tenant that always has a request ready is
//     charged exactly r x D + O(tau) units over D: its long-run rate is r.
//  2. Elastic window. A tenant at rest (no debt) at time s that sends at
//     (1 + burst_allow) x r is fully served for every request arriving in
//     [s, s + burst_window]: its debt at s + D is burst_allow x D <= tau.
//     Any shape with the same excess is served too (1.1x for twice the
//     window, or burst_allow x burst_window x r units at once): the window
//     bounds the excess volume, not the peak. Only what exceeds it is
//     refused.
//  3. Held, then paid back. Past the window the tenant is held to r: its
//     debt stays between tau and tau plus one request, and it is admitted
//     at exactly rate r however fast it sends. The debt falls only while the tenant runs under its rate, by
//     (1 - u) per second at a fraction u of the rate: at (1 - b) x r it is
//     repaid in tau / b (the seed's default, 1.2x for 10 s, is repaid in 10 s
//     at 0.8x, or in 2 s idle), after which a full window is available
//     again.
//  4. Exact earliest time. A refused request's At is exact: with nothing
//     else charged to the tenant in between, the same request decided at At
//     is allowed (and one nanosecond earlier it would not be, on the binding
//     meter).
//  5. Atomic charge. All of a request's meters are charged, or none.
//  6. Reconcile. At completion the token and joint meters move by the
//     difference between the actual and the estimated charge: extra debt,
//     or a refund that never takes a meter below rest (a tenant at rest has
//     the whole window and can gain no more). Guarantee 1 holds for actual
//     tokens (c_max the largest actual request, plus the estimates still in
//     flight), so neither over- nor under-estimates let a tenant exceed its
//     rate. A greedy tenant converges to its rate exactly when each refund
//     is within its debt at completion, e.g. refunds within the window
//     (tau x rate units). A refund beyond the debt is lost: the tenant was
//     held back by its own over-estimate while the request ran, and is
//     served below its rate: on a 200k tokens/min quota with a 2 s window,
//     a tenant estimating 20k tokens for requests that use 2k and run 1 s
//     each gets 60% of its rate. Better estimates are the cure, not credit
//     beyond the window.
//  7. Bounded memory. A tenant whose TATs are all <= now is
//     indistinguishable from an unknown tenant; stores may forget it at any
//     time without changing any decision. Memory does so in a sweep at most
//     every DefaultSweepEvery.
//
// Times are integer nanoseconds and every increment is rounded once, when
// it is computed (Limits.Increment), so 2 to 4 above hold exactly, not
// within a float error.
//
// # Headers
//
// Status gives, per meter, what OpenAI's x-ratelimit-* headers carry: Limit
// is the rate per minute (RPM, TPM), Remaining the units that can be sent
// now back to back without a refusal, Reset the time until the meter is at
// rest again. A gateway reports requests from min(qps, joint) and tokens
// from the token meter.
//
// # Store
//
// Store is the state behind the decisions: Peek (decide, charge nothing),
// Charge (decide and charge at dispatch), Reconcile (at completion), and
// Status. Each is one read-modify-write of one tenant's three TATs whose
// inputs (increments, tolerance) are computed from Limits beforehand, so a
// Redis store does each in one round trip. Memory is the in-process store;
// package cluster's QuotaStore is the one several gateways share.
//
// # Local
//
// Local is the store a gateway of a cluster uses: the shared store (Redis)
// while it answers, and, from the first call that fails or times out, a
// local Memory on every quota scaled by 1/instances (Limits.Scale: rates divided, the burst
// window's time kept, so the instances' bursts add up to one). It reports
// an outage once as it starts and once as it ends; during it no call waits
// on Redis: a probe (a Status call) runs in the background every Retry (1 s),
// and its success sends calls to Redis again. N instances deciding alone
// hold a tenant to guarantee 1 at rate/N each: its quota in total when the
// load spreads evenly, less when it does not; each outage starts every
// instance's meters at rest, a fresh window of burst. An error about one
// tenant (LocalOptions.Outage: a key of another type at its name) is decided
// locally without starting an outage.
//
// Round trips. Charge and Reconcile always ask Redis; a Peek with nothing
// ahead, for a tenant Redis last said (to this instance) would be at rest by
// now, is answered without asking, and any other Peek counts the backlog
// ahead Instances times (the cluster's, under an even load balancer): two
// round trips per request for a tenant under its quota, three for one
// whose requests queue behind it.
package quota
