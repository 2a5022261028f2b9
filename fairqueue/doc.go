// Package fairqueue is the scheduler of caddy-fair-queue: per-tenant
// sub-queues in front of a pool of upstream slots, dispatched by weighted fair
// queuing whose unit is a request's estimated token cost.
//
// # Algorithm
//
// Each tenant i has a weight w_i and a virtual time vt_i: the service it has
// received, in cost units divided by its weight. Its waiting requests sit in
// FIFO flows, one per class (so a class can be paused without reordering a
// tenant's other classes). A flow's key is (vt_i + c/w_i, vt_i) where c is the
// cost of the request at its head: the finish and start tags of that request.
//
//   - Arrival at an idle tenant (nothing queued) lifts vt_i to max(vt_i, V),
//     where V, the system's virtual time, is the largest start tag dispatched
//     so far (the self-clocked rule of SCFQ, Golestani 1994, with the start
//     rather than the finish tag). V never decreases and needs no scan. A
//     tenant that was idle therefore neither banks credit for the time it was
//     away nor pays for service it received before everybody else caught up
//     (the "counter lift" of VTC, Sheng et al., OSDI'24).
//   - Dispatch takes the flow whose head has the smallest finish tag, as
//     weighted fair queuing and Kubernetes APF's queueset do, from a heap per
//     class, so enqueue and dispatch cost O(log active flows) and never scan
//     tenants. Finish-tag order is what lets a sparse chat tenant start at the
//     next free slot during a flood of long prompts: its small request
//     finishes, in virtual time, long before the flood's next one, even when
//     the chat tenant was served a moment ago and the flood was not. The
//     price, inherent to WFQ, is that one very large request of a light
//     tenant waits until its tenant's share has "paid" for it. Ties go to the
//     smaller start tag, then to the flow created first, so runs are
//     deterministic.
//   - Dispatch charges vt_i += c/w_i with the estimate c. On completion the
//     actual cost a back-fills (a-c)/w_i, so long-run shares converge to the
//     weights measured in actual tokens even when estimates are biased. An
//     under-estimate is charged at once; an over-estimate is refunded as a
//     credit taken off the tenant's next charges (and settled when it next
//     arrives idle), so vt never moves backwards: moving it back would let a
//     flooding tenant undercut the start tag a newcomer was just lifted to,
//     and the newcomer's small request would lose its turn at the next slot.
//
// # Undeclared tenants
//
// Tenants not in Config.Tenants are scheduled as one group at the top level
// (hierarchical WFQ): the group has weight Config.Default.Weight and a
// virtual time of its own, and inside it each undeclared tenant has its own
// virtual time and flows, ordered the same way in a sub-heap. A dispatch
// charges both levels, so enqueue and dispatch stay O(log n). Rotating
// tenant IDs therefore buys neither share nor room: all undeclared tenants
// together get Default.Weight's share, and Default.MaxQueue caps their
// queue together (DefaultPerTenantMaxQueue caps each). A tenant that a
// reload declares or undeclares moves once it is idle.
//
// With cost_unit "requests" every request costs 1 and back-fill is a no-op;
// the token caps (MaxInflightTokens, MaxQueueTokens) still count the
// request's estimated tokens.
//
// # Capacity
//
// Dispatch is gated by in-flight requests <= MaxInflight x healthy upstreams
// and, when MaxInflightTokens is set, in-flight estimated cost <=
// MaxInflightTokens x healthy upstreams. A request that could never be
// admitted is refused at once (ReasonTooLarge) rather than parked: one
// estimated above MaxInflightTokens (it can never fit one upstream) or
// above MaxQueueTokens. One that a reload made larger than the token
// capacity while it was queued still dispatches when nothing else is in
// flight, so nothing deadlocks. Capacity changes (an upstream going down or
// up, a reload) take effect at once; in-flight work is never preempted,
// queued work is never dropped by a capacity change.
//
// A tenant at its TenantConfig.MaxInflight is not eligible: its flows leave
// the heaps (O(log n), never a scan) until one of its requests completes,
// and the capacity goes to the others.
//
// Token gating is strict in tag order: when the next request does not fit the
// free token capacity, dispatch waits for completions rather than letting
// smaller requests overtake it, because overtaking would starve large
// requests under a steady stream of small ones.
//
// # Boost lane and pause
//
// Promote moves a queued request into the boost lane, which dispatches ahead
// of tag order (the wait-budget logic bounds how much is promoted). A boosted
// request is still charged to its tenant. A paused class yields: its flows are
// considered only when no flow of an unpaused class is waiting, so pausing
// never leaves a slot idle, and a paused class resumes where it was.
//
// # Memory
//
// What the queue holds is bounded by configuration, not by traffic: queued
// requests by MaxQueue, their bodies by MaxQueueBytes (Request.Bytes, counted
// while queued, boost lane included), and tenants by time: a tenant with
// nothing queued or in flight for IdleForget is forgotten (its boost
// history with it, for undeclared tenants), at most maxForgetPerTick per
// Tick, the longest idle first, so no tick scans all tenants. Forgetting a
// tenant whose virtual time is ahead of V drops at most one request's
// service debt; see pruneLocked. BenchmarkMemory measures the unit costs
// (amd64): about 210 bytes a queued request (its ticket and its share of
// the heaps, the body excluded) and 490 a remembered idle tenant (its
// name and its share of the map included).
//
// Reading the tenants (Stats, for the metrics scrape and the reports)
// never holds the lock for O(tenants): they are copied a chunk at a time
// (see Queue.Stats), and BackloggedWeight is kept as tenants come and go.
//
// # Retry-After
//
// Every refusal's RetryAfter is at most budget.MaxRetryAfter. Full queues
// and budgets run out while queued answer the time the measured rate needs
// to serve the work queued, spread by a seeded jitter
// (budget.RetryAfterJitter) so clients refused together do not return
// together.
//
// # Wait budgets while queued: early refusal
//
// With BudgetConfig.FastFail, a request that can no longer start before
// its deadline is refused (ReasonBudgetExceeded, Rejection.WhileQueued) as
// soon as the queue knows it with confidence, rather than left to expire
// (refuse.go). Every Tick, and at once when the healthy count changes, a
// pass checks the tails of backlogged flows, walking each from its tail,
// the request served last, and stops at the first that still makes it.
// Promises use the promise rate (a low quantile of measured throughput);
// refusals need the request to miss at the refusal rate, the most the
// upstreams plausibly do (on a cold start, the bound budget.ColdRate from
// the requests in flight and the first completions), and, a quarter of
// its budget after arrival, at the rate its flow has really drained.
//
// An ETA counts the work that tag order puts ahead of the request: its
// own tenant's, the boost lane's, and each other backlogged tenant's
// queued work up to the request's virtual finish tag, by weight. A
// work-ahead index (ahead.go) keeps the sums of the backlogged tenants'
// weights and weighted virtual times in two treaps ordered by virtual
// time and by the virtual time at which each tenant's queue drains, so an
// ETA costs O(log n) for n tenants, and keeping the index O(log n) per
// tenant that changed since the previous ETA. It is built on the first
// ETA (in bulk: tens of ms, once, at 100k backlogged tenants), and
// dropped when the queue runs empty, a reload changes the weights, or no
// ETA is asked for while more than twice its size in tenants change;
// pausing a class re-files that class's tenants. While at most 128 flows
// are backlogged an ETA walks them instead, which then costs less.
//
// Cost of a pass, under the lock, with F backlogged flows (the undeclared
// tenants' group counted as one) and R refusals: O(min(F, 64) x E + R x
// (E + log n)), E = O(log n) for F <= 64 flows and O(1) above (a lower
// bound: counting the other tenants there refuses requests that would
// have made it). The boost re-check of a tick (recheckLocked) re-decides
// at most 64 requests, at O(log n) each. Neither
// scans the queued requests: at 100k queued a pass checks at most 64
// tails, and each refusal ends a ticket.
//
// # Several gateways (cluster)
//
// Several gateways in front of one pool each run a Queue. What they share
// goes through the quota Store (Config.QuotaStore: tenant quotas, and the
// provider account unless Config.AccountStore keeps it apart: a
// quota.Mirror, decided in memory on 1/instances of the account and
// synced with the shared store off the lock) and through the slots each holds of the pool
// (SetSlotLimit, from package cluster): each gateway's capacity is its
// grant, its weighted max-min fair share of the pool by demand, weighted
// by BackloggedWeight, the weights of the tenants it has requests queued
// for, renewed every sync interval s and at once on the events that move
// slots (package cluster: a tenant backlogged anew claims, a gateway above
// its grant gives a slot back as each request completes, a gateway owed
// slots takes them as they are given back). Bounds, for a gateway count N
// and a pool of P slots:
//
//   - Tenant quotas (gate.go): a request is booked on its tenant's quota
//     when it arrives, for the earliest time the quota lets it start,
//     first come first served over all gateways, within the time its
//     budget leaves less the longest wait for a slot past a booked time
//     any gateway has seen in the last minute (the same horizon for
//     all); otherwise it is refused at once. Its tenant is held until
//     that time and no gateway charges anything at dispatch, so the
//     quota holds over the cluster exactly at the booked times, a
//     request's quota time never moves once it is admitted, and which
//     gateway a request reaches does not change whether it is refused.
//   - The pool: the requests in flight over all gateways never exceed P
//     (a gateway only dispatches below its grant, and a grant is computed
//     against what the others hold, their grants or their requests in
//     flight, whichever is larger).
//   - Between gateways: once demand is steady, within two sync intervals
//     (2s) every gateway holds its weighted share, rounded to whole slots
//     (at most one slot off, so the error is at most N/P of the pool); a
//     gateway whose share fell keeps its requests in flight and frees
//     slots as they complete, each to a gateway owed one within two round
//     trips to Redis, so the others' grants catch up within one service
//     time plus those round trips. A request of a tenant backlogged anew
//     on one gateway thus waits for the pool's next free slot, as it would
//     on a single gateway with the whole pool, plus about three round
//     trips (its claim, the release, the owed gateway's renewal); in
//     weight it outranks the other gateways' tenants as it would the
//     tenants it meets in one queue, up to the rounding to whole slots.
//     Tenants that send through different gateways
//     are therefore served by weight within that rounding, while they
//     are backlogged; through one gateway, the WFQ above divides its
//     grant with its usual bound. A tenant's requests in flight count in
//     its gateway's demand but not its weight, so the requests in flight
//     of a tenant with no backlog are held within its gateway's share:
//     on a gateway where a tenant keeps k requests in flight without a
//     backlog beside a flooding tenant, the flooder gets k slots less
//     than a single queue would give it (one queue would take those k
//     from the whole pool). Counting them in the weight instead, as
//     before, erred the other way, and let a sparse tenant's request in
//     flight win its gateway's flooder the slots a sparse request queued
//     on another gateway waits for.
//   - Virtual time, with sharing (TakeServed, ChargeRemote; package
//     cluster): every s each gateway reports the cost it charged each
//     tenant since its last report and charges each tenant queued here
//     what the others charged it, as a back-fill of that cost (its
//     virtual time moves by cost/weight, net of credit). A tenant with
//     work on several gateways is then served by its weight across the
//     cluster, not on each: on a gateway where it competes, its start
//     tags run ahead by what the others served it, so its competitors
//     there take the difference. The lag is one sync interval plus a
//     round trip: at any moment a tenant is charged here for all the
//     others' service up to at most s + RTT ago, that is at most its
//     service rate elsewhere x (s + RTT) of cost, which bounds the excess
//     it can take here, on top of the single-gateway bound, before the
//     charge lands. With N gateways each charge is read by N-1 others,
//     once each; what a tenant is served elsewhere while it has nothing
//     queued here is no debt here (as for a tenant back from idle), and
//     a gateway that misses entries (Redis down, or further behind than
//     the stream holds) is fair on its own meanwhile, never charging
//     twice. The correction acts only where the tenant competes: a
//     gateway where it is alone serves it whatever it is charged (work
//     conservation), and the grants still claim its weight on every
//     gateway where it has work. So a tenant alone on k gateways and
//     competing on others holds the k grants it claims there whatever
//     sharing says; it gets its cluster-wide share exactly when those
//     grants are below it (one tenant of equal weight on two gateways,
//     another on the second only: grants P/3 and 2P/3, served P/2 each,
//     TestSharedVirtualTime and the e2e TestClusterSharedFairness), and
//     those k grants otherwise. Without sharing, a tenant with work on several gateways
//     counts its weight on each, so it gets up to N times its weight's
//     share of the pool, each gateway's WFQ holding it to its weight
//     among that gateway's tenants only. Larger s or N widen the
//     rounding and slow the convergence; nothing in the scheduler waits
//     on the network.
//
// # Guarantees
//
//   - Work conservation: after every state change, either capacity is full or
//     no request is eligible (the boost lane and every flow are empty, the
//     tenants with queued requests are at their in-flight cap, or the next
//     request in order does not fit the free token capacity).
//   - Isolation: declared tenants keep their weighted shares and their queue
//     room whatever undeclared traffic does, with any number of undeclared
//     IDs; undeclared tenants share the group's service equally within the
//     same bound as below.
//   - No single request can lock others out: an oversized one is refused at
//     once, and one request moves the water level by at most
//     1/MaxWaterShareInverse through its tokens (see Queue.Water).
//   - Fairness: for two continuously backlogged tenants of equal weight, the
//     difference in (estimated) service between them is bounded by about twice
//     the largest request cost plus the service in flight at one instant; the
//     tests assert 2x the largest request cost at every dispatch.
//   - Every ticket ends exactly once: dispatched then released, cancelled,
//     expired (its deadline came, or refused while queued), or rejected at
//     admission. A cancelled or expired ticket is never
//     dispatched and its tenant is not charged.
//
// All time comes from an injected Clock, so the simulator and the tests run
// the same code on a virtual clock, fast and deterministically.
package fairqueue
