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
//   - Arrival at an idle tenant lifts vt_i to max(vt_i, V), where V, the
//     system's virtual time, is the largest start tag dispatched so far (SCFQ,
//     Golestani 1994, with the start tag). V never decreases and needs no
//     scan. An idle tenant thus neither banks credit for the time it was away
//     nor pays for service it received before the others caught up (the
//     "counter lift" of VTC, Sheng et al., OSDI'24).
//   - Dispatch takes the flow whose head has the smallest finish tag, from a
//     heap per class, as WFQ and Kubernetes APF's queueset do: O(log active
//     flows), no scan of tenants. Finish-tag order lets a sparse chat tenant
//     start at the next free slot during a flood of long prompts; the price,
//     inherent to WFQ, is that one very large request of a light tenant waits
//     until its tenant's share has paid for it. Ties go to the smaller start
//     tag, then to the flow created first, so runs are deterministic.
//   - Dispatch charges vt_i += c/w_i with the estimate c. On completion the
//     actual cost a back-fills (a-c)/w_i, so long-run shares converge to the
//     weights in actual tokens even when estimates are biased. An
//     over-estimate is refunded as credit taken off the tenant's next charges,
//     so vt never moves backwards: moving it back would let a flooding tenant
//     undercut the start tag a newcomer was just lifted to.
//
// # Undeclared tenants
//
// Tenants not in Config.Tenants are scheduled as one group at the top level
// (hierarchical WFQ, group.go) with weight Config.Default.Weight; inside it
// each undeclared tenant has its own virtual time and flows, ordered the same
// way in a sub-heap. Rotating tenant IDs therefore buys neither share nor
// room: all undeclared tenants together get Default.Weight's share, and
// Default.MaxQueue caps their queue together (DefaultPerTenantMaxQueue caps
// each). A tenant that a reload declares or undeclares moves once it is idle.
//
// With cost_unit "requests" every request costs 1 and back-fill is a no-op;
// the token caps still count the request's estimated tokens.
//
// # Capacity
//
// Dispatch is gated by in-flight requests <= MaxInflight x healthy upstreams
// and, with MaxInflightTokens, in-flight estimated cost <= MaxInflightTokens x
// healthy upstreams. A request that could never be admitted (above
// MaxInflightTokens or MaxQueueTokens) is refused at once (ReasonTooLarge).
// One that a reload made too large while queued still dispatches when nothing
// else is in flight, so nothing deadlocks. Capacity changes take effect at
// once; in-flight work is never preempted and queued work never dropped by
// them. A tenant at its TenantConfig.MaxInflight leaves the heaps until one
// of its requests completes. Token gating is strict in tag order: smaller
// requests do not overtake one that does not fit, or large requests would
// starve under a stream of small ones.
//
// # Boost lane and pause
//
// Promotion moves a queued request into the boost lane, which dispatches
// ahead of tag order (the wait-budget logic bounds how much is promoted); a
// boosted request is still charged to its tenant. A paused class yields: its
// flows are considered only when no unpaused flow is waiting, so pausing
// never leaves a slot idle.
//
// # Memory
//
// What the queue holds is bounded by configuration: queued requests by
// MaxQueue, their bodies by MaxQueueBytes (Request.Bytes), and tenants by
// time: a tenant with nothing queued or in flight for IdleForget is
// forgotten, at most maxForgetPerTick per Tick, the longest idle first (see
// pruneLocked). Stats copies the tenants a chunk at a time, so it never holds
// the lock for O(tenants).
//
// # Wait budgets
//
// Every refusal's RetryAfter is at most budget.MaxRetryAfter. With
// BudgetConfig.FastFail a request that can no longer start before its
// deadline is refused as soon as the queue knows it with confidence
// (refuse.go). An ETA counts the work tag order puts ahead of the request,
// in O(log n) through the work-ahead index (ahead.go).
//
// # Several gateways
//
// Several gateways in front of one pool each run a Queue and share state
// through the quota Store (Config.QuotaStore, Config.AccountStore) and the
// slots each holds of the pool (SetSlotLimit, from package cluster), a grant
// weighted by BackloggedWeight. Tenant quotas are booked on arrival, first
// come first served over all gateways (gate.go); requests in flight over all
// gateways never exceed the pool; with virtual time shared (TakeServed,
// ChargeRemote) a tenant with work on several gateways is served by its
// weight across the cluster, within about one sync interval. Nothing in the
// scheduler waits on the network.
//
// # Guarantees
//
//   - Work conservation: after every state change, either capacity is full or
//     no request is eligible.
//   - Isolation: declared tenants keep their weighted shares and queue room
//     whatever undeclared traffic does, with any number of undeclared IDs.
//   - No single request locks others out: an oversized one is refused at
//     once, and one request moves the water level by at most
//     1/MaxWaterShareInverse (see Queue.Water).
//   - Fairness: for two continuously backlogged tenants of equal weight, the
//     difference in estimated service is bounded by about twice the largest
//     request cost plus the service in flight at one instant.
//   - Every ticket ends exactly once: dispatched then released, cancelled,
//     expired, or rejected at admission. A ticket that is not dispatched is
//     never charged.
//
// All time comes from an injected Clock, so the simulator and the tests run
// the same code on a virtual clock, fast and deterministically.
package fairqueue
