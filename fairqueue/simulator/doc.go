// Package simulator replays LLM-gateway workloads through the real
// scheduler (package fairqueue) and through baseline policies on a virtual
// clock, deterministically, and measures waits, throughput and fairness.
//
//	go -C cmd/fqsim run . -scenario list
//	go -C cmd/fqsim run . -scenario seed000 [-policy all|budgets|fifo,wfq-tokens] [-seed N]
//
// # Model
//
// U upstreams of S slots each; at most S x healthy requests run at once
// (Config.MaxInflight = S, Queue.SetHealthy), never preempted;
// Scenario.Health changes the healthy count. A request has a prompt, a
// max_tokens and an output of max_tokens x uniform(0.5, 1.0); it holds a
// slot for 30 ms + 0.05 ms x prompt + 15 ms x output. Its estimated cost
// is prompt + max_tokens, its actual cost (passed to Ticket.Release)
// prompt + output.
//
// Generate draws every open-loop request once from the seed, each tenant
// from its own stream keyed by its name, so all policies replay the same
// requests. A closed-loop tenant (ArrivalBacklogged) keeps a fixed number
// queued: its arrival times depend on the policy, its k-th request does
// not. A tenant with Arrivals.Alongside keeps arriving while t < the
// leader's first arrival + (service time of both tenants' requests so far)
// / capacity: as long as the leader is backlogged under any
// work-conserving scheduler, with no reference run.
//
// # Event loop
//
// Events are ordered by (time, kind, sequence): at one instant
// completions, health changes, arrivals, ticks. Queue.Tick runs every
// TickPeriod (50 ms) while work is queued or in flight. After every event
// the simulator checks that no more than capacity is in flight, that each
// request is dispatched at most once, and that no slot idles while a
// request is queued (Result.Violations).
//
// # Policies
//
//   - fifo: the engine with one tenant and one class.
//   - drr-requests: the engine with CostRequests and the weights.
//   - priority: strict priority by Scenario.Classes order, FIFO within a
//     class: the best wait a class can get by starving those below it.
//   - wfq-tokens: the engine as configured: CostTokens with the weights.
//
// The budget policies (-policy budgets) give every request a deadline of
// arrival + its class budget: fifo-budgets (neither boost nor fast-fail),
// wfq-budgets (Scenario.Admission), wfq-budgets-noboost and
// wfq-budgets-nofastfail. A refusal from the queue (EventExpired with
// wait_budget_exceeded) counts as refused (Record.WhileQueued): told, not
// starved. Boosted requests in flight never exceed
// budget.NewBoosts(share, hourly).Limit(capacity), but for those in flight
// when capacity shrank. FormatBudgets reports per tenant starved
// (admitted, not started within budget), fast-failed, expired, boosts, the
// ETA error |predicted - actual| / actual (boosted requests left out), the
// fast-fail precision (of the requests wfq-budgets refused, the share that
// missed their budget under wfq-budgets-nofastfail) and Early.
//
// # Degrade ladder
//
// With Scenario.Degrade the engine policies but fifo run the ladder on
// queued/Scenario.MaxQueue. In light mode a request is trimmed before
// submission (Record.Light). FormatTimeline prints the water and level
// every second with work, the transitions, the waves and per class the
// met-budget rate by level.
//
// # Metrics
//
// Per tenant (or group with Scenario.GroupRows), nearest-rank percentiles
// over dispatched requests:
//
//   - wait: dispatch - arrival; P50, P95, P99.
//   - slot-free limit: arrival until the next slot frees (0 if one was
//     free): no non-preemptive scheduler could start the request sooner;
//     "at limit" is the fraction with wait <= limit + 1 ms.
//   - in-order limit: arrival until the (q+1)-th slot frees, q the
//     tenant's own requests queued at arrival (every policy keeps a
//     tenant's requests in order); "in order" is the fraction within it.
//   - met budget: fraction dispatched within their class budget.
//   - tok/s: actual tokens completed / (last completion - first arrival).
//
// Overall:
//
//   - tok/s, and contended: the time during which some request was queued.
//   - Jain's index of weighted shares per Scenario.Window (10 s) wholly in
//     contended time: received_i is the actual tokens served in the window
//     (spread over each request's service), demand_i = received_i + the
//     actual cost still queued at its end, fair_i the weighted max-min fair
//     share of sum received_i (water-fill), x_i = received_i / fair_i and
//     J = (sum x_i)^2 / (n sum x_i^2). Mean and minimum over windows: over
//     a whole contended period every demand is met and J is 1 for any
//     policy.
//   - max service diff: for two tenants of equal weight, over each
//     interval where both stay backlogged, the largest change of
//     served_i - served_j (corrected to actual cost at completion), shown
//     against the largest request cost, the unit of the VTC bound (about
//     2x). Groups of more than 64 equal-weight tenants are not tracked.
package simulator
