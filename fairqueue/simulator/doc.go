// Package simulator replays LLM-gateway workloads through the real
// scheduler (package fairqueue) and through baseline policies on a virtual
// clock, deterministically, and measures waits, throughput and fairness.
//
// Command cmd/fqsim prints the measurements as text tables:
//
//	go -C cmd/fqsim run . -scenario list
//	go -C cmd/fqsim run . -scenario seed000 [-policy all|budgets|fifo,wfq-tokens] [-seed N]
//	go -C cmd/fqsim run . -scenario seed000-stress   # the wait-budget policies
//	go -C cmd/fqsim run . -scenario peak             # the degrade ladder's timeline
//
// # Model
//
// Upstreams: U upstreams of S slots each; at most S x healthy requests run
// at once (Config.MaxInflight = S, Queue.SetHealthy(healthy)), never
// preempted. Scenario.Health changes the healthy count at given times.
//
// Requests: a prompt, a max_tokens and the output the upstream will
// produce, max_tokens x uniform(0.5, 1.0). A request holds a slot for
// 30 ms + 0.05 ms x prompt + 15 ms x output. Its estimated cost is
// prompt + max_tokens; its actual cost, prompt + output, is passed to
// Ticket.Release.
//
// Workload: Generate draws every open-loop request once from the seed, so
// all policies replay the same requests; each tenant draws from its own
// stream keyed by its name. A closed-loop tenant (ArrivalBacklogged) keeps
// a fixed number queued: its arrival times depend on the policy, its k-th
// request does not. seed002's tenant B (Arrivals.Alongside) sends one
// request per second while t < A's first arrival + (service time of all of
// A's and B's requests so far) / capacity: as long as A is backlogged under
// any work-conserving scheduler, with no reference run.
//
// # Event loop
//
// A heap of events ordered by (time, kind, sequence); open-loop arrivals
// are merged in from the sorted workload. At one instant: completions,
// health changes, arrivals, ticks; within a kind, creation order. A
// dispatch schedules its completion at now + service time. Queue.Tick runs
// every TickPeriod (50 ms) on multiples of the period, only while work is
// queued or in flight. After every event the simulator checks: never more
// in flight than capacity, each request dispatched at most once, no slot
// idle while a request is queued (Result.Violations).
//
// # Policies
//
// Policy builds a Scheduler for one run (EnginePolicy.Configure adjusts the
// engine configuration):
//
//   - fifo: the engine with one tenant and one class, arrival order.
//   - drr-requests: the engine with CostRequests and the weights.
//   - priority: strict priority by Scenario.Classes order, FIFO within a
//     class, weights ignored: the best wait a class can get by starving
//     everything below it.
//   - wfq-tokens: the engine as configured: CostTokens with the weights.
//
// Wait budgets are reported but enforced only with Scenario.EnforceBudgets.
//
// # Wait budgets
//
// The budget policies (-policy budgets) give every request a deadline of
// arrival + its class budget (realtime 5 s, interactive 15 s, batch 300 s):
//
//   - fifo-budgets: fifo with deadlines, neither boost nor fast-fail.
//   - wfq-budgets: wfq-tokens with Scenario.Admission (default: fast-fail,
//     boost share 0.10, 200 boosts per tenant per hour, margin 150 ms).
//   - wfq-budgets-noboost: BoostShareMax 0; wfq-budgets-nofastfail:
//     FastFail off.
//
// Per request it records the admission prediction (Ticket.ETA right after
// Enqueue, or the ETA a refusal states), the outcome and whether the boost
// lane dispatched it. A refusal after admission (EventExpired with
// wait_budget_exceeded) counts as refused, with Record.WhileQueued: it was
// told, not starved. Boosted requests in flight never exceed
// budget.NewBoosts(share, hourly).Limit(capacity), but for those in flight
// when capacity shrank.
//
// The budget metrics, per tenant (FormatBudgets):
//
//   - starved: admitted requests that did not start within their budget.
//   - fast-failed, expired, boosts.
//   - ETA error: |predicted - actual| / actual over dispatched requests with
//     a prediction, boosted ones left out (the boost set their wait).
//   - fast-fail precision: of the requests wfq-budgets refused, the share
//     that missed their budget in the wfq-budgets-nofastfail run.
//   - throughput of wfq-budgets and wfq-budgets-noboost.
//
// Early refusal (Early) compares the same two runs: refusals by moment, the
// latest refusal after arrival as a fraction of the budget, how many came
// later than WarmLimit once WarmAfter past the first dispatch, and the
// served work of each. With a health timeline, wfq-budgets also prints the
// median predicted wait and the share fast-failed around each change
// (Result.HealthEffects).
//
// # Degrade ladder
//
// With Scenario.Degrade the engine policies but fifo (whose one class would
// turn a class action into one on all traffic) run the ladder on
// queued/Scenario.MaxQueue; ticks go on while it is engaged. In light mode
// (Queue.LightMode) a request is trimmed before submission: prompt to
// max_input_tokens, max_tokens and output to max_tokens (Record.Light).
// Result.Timeline samples water and level every second with work;
// Result.Transitions lists every transition. FormatTimeline prints them,
// the waves (water >= 0.05) and per class the met-budget rate by level.
//
// # Metrics
//
// Per tenant (or group with Scenario.GroupRows); percentiles are
// nearest-rank over dispatched requests:
//
//   - wait: dispatch - arrival; P50, P95, P99.
//   - slot-free limit: arrival until the next slot frees (0 if one was
//     free): no non-preemptive scheduler could start the request sooner.
//     "at limit" is the fraction with wait <= limit + 1 ms.
//   - in-order limit: arrival until the (q+1)-th slot frees, q the tenant's
//     own requests queued at arrival, since every policy keeps a tenant's
//     requests in order; "in order" is the fraction within it + 1 ms.
//   - met budget: fraction dispatched within their class budget.
//   - tok/s: actual tokens completed / (last completion - first arrival),
//     that span being the makespan.
//
// Overall:
//
//   - tok/s, and contended: the time during which some request was queued.
//   - Jain's index of weighted shares per Scenario.Window (10 s) wholly in
//     contended time. For tenant i, received_i is the actual tokens served
//     in the window (spread over each request's service time) and
//     demand_i = received_i + the actual cost still queued at its end;
//     fair_i is the weighted max-min fair share of C = sum received_i
//     (water-fill, as queueset's fairAlloc, with weights); x_i =
//     received_i / fair_i and J = (sum x_i)^2 / (n sum x_i^2). Mean and
//     minimum over windows: over a whole contended period every demand is
//     eventually met and J is 1 for any policy.
//   - max service diff: for two tenants of equal weight, over each
//     interval where both stay backlogged, the largest change of
//     served_i - served_j (cost corrected to actual at completion, as
//     Stats().Tenants[i].Served), shown with its ratio to the largest
//     actual request cost, the unit of the VTC bound (about 2x). Groups of
//     more than 64 equal-weight tenants are not tracked (n/a).
package simulator
