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
// Upstreams: U upstreams of S slots each. A policy may run at most S x
// healthy requests at once (the engine gets Config.MaxInflight = S and
// Queue.SetHealthy(healthy)); a running request is never preempted. The
// number of healthy upstreams follows Scenario.Health, a list of (time,
// healthy) changes; capacity changes apply at once, in flight work finishes.
//
// Requests: every request has a prompt, a max_tokens and the number of
// output tokens the upstream will produce, max_tokens x uniform(0.5, 1.0).
// It holds a slot for 30 ms + 0.05 ms x prompt + 15 ms x output. Its
// estimated cost, known at admission, is prompt + max_tokens; its actual
// cost, known at completion, is prompt + output (passed to
// Ticket.Release, which back-fills the engine's accounting).
//
// Workload: Generate draws every open-loop request (arrival time, tenant,
// sizes, output) once from the seed, so all policies replay exactly the
// same requests. Each tenant draws from its own stream keyed by its name,
// so adding a tenant leaves the others' requests unchanged. A closed-loop
// tenant (ArrivalBacklogged) keeps a fixed number of requests queued: the
// next arrives the instant one leaves the queue, so its arrival times
// depend on the policy, but its k-th request is the same in every run.
//
// Arrival rule of seed002's tenant B (Arrivals.Alongside): B sends one
// request per second while t < first arrival of A + (service time of all
// of A's requests + service time of B's requests so far) / capacity. That
// is when A's work (plus B's own) is done by any work-conserving scheduler
// at full capacity, so B keeps arriving for as long as A is backlogged
// under every policy here, and the rule needs no reference run.
//
// # Event loop
//
// A heap of events ordered by (time, kind, sequence) drives the run; open-
// loop arrivals are merged in from the sorted workload without being pushed.
// Events at the same instant are processed as: completions (a slot frees
// before anything else happens), health changes, arrivals, ticks; within a
// kind, in creation order (open-loop arrivals by request ID first). The
// scheduler reports dispatches and expiries synchronously (the engine
// through its Observer); a dispatch schedules the completion at now +
// service time. Queue.Tick runs every TickPeriod (50 ms) of virtual time,
// on multiples of the period, but only while a request is queued or in
// flight, so idle gaps cost nothing.
//
// After every event the simulator checks the scheduler: never more in
// flight than capacity, every request dispatched at most once, and work
// conservation (no slot idle while a request is queued). Violations are
// listed in Result.Violations and printed under the table.
//
// # Policies
//
// Policy builds a Scheduler for one run; variants plug in by implementing
// it (EnginePolicy.Configure adjusts the engine configuration, and
// EngineScheduler exposes the Queue for policies built on it).
//
//   - fifo: the engine with every request mapped to one tenant and one
//     class: a single flow, served in arrival order.
//   - drr-requests: the engine with CostRequests and the scenario's weights:
//     weighted round robin by request count, the naive baseline.
//   - priority: the simulator's own strict-priority scheduler: classes in
//     Scenario.Classes order (realtime > interactive > batch), FIFO within a
//     class, tenants and weights ignored, same slot model and deadline
//     handling as the engine. It shows the best wait a class can get by
//     starving everything below it.
//   - wfq-tokens: the engine as configured: CostTokens with the weights.
//
// Wait budgets are reported (met budget) but not enforced unless
// Scenario.EnforceBudgets gives requests deadlines.
//
// # Wait budgets
//
// The budget policies (BudgetPolicies, -policy budgets) give every request
// a deadline of arrival + its class budget (realtime 5 s, interactive 15 s,
// batch 300 s), whatever EnforceBudgets says:
//
//   - fifo-budgets: fifo with deadlines, neither boost nor fast-fail:
//     requests that cannot start in time wait and expire.
//   - wfq-budgets: wfq-tokens with the engine's Admission config from
//     Scenario.Admission (default: fast-fail, boost share 0.10, 200 boosts
//     per tenant per hour, margin 150 ms), plus a throughput prior where
//     the scenario sets one.
//   - wfq-budgets-noboost: the same with BoostShareMax 0.
//   - wfq-budgets-nofastfail: the same with FastFail off.
//
// Per request the simulator records the engine's admission prediction
// (Ticket.ETA read right after Enqueue, before any re-check replaces it;
// for a fast-failed request, the ETA its refusal states), the outcome
// (dispatched; refused at admission, with the Rejection's reason:
// wait_budget_exceeded for fast-fail; expired with queue_timeout) and
// whether it was dispatched from the boost lane. A request the engine
// refuses after admitting it (early refusal: EventExpired with
// wait_budget_exceeded) is recorded as refused, with Record.WhileQueued
// and the time of the refusal in Record.Left: it was told, not starved. At every dispatch it
// checks the boost budget: boosted requests in flight never exceed
// budget.NewBoosts(share, hourly).Limit(capacity), except for those
// already in flight when capacity shrank (they are never preempted).
//
// The budget metrics, per tenant (FormatBudgets):
//
//   - starved: admitted requests that did not start within their budget
//     (expired while queued, or dispatched late, which the engine never
//     does). A refused request is not starved: it was told at once.
//   - fast-failed, expired, boosts.
//   - ETA error: |predicted - actual| / actual over the dispatched
//     requests with a prediction. Requests dispatched at once (a slot was
//     free on arrival) have none and are left out: their wait is 0 as
//     predicted and a relative error is undefined. Boosted requests are
//     left out too: the tag-order ETA is what made them boosted, and the
//     boost set their wait. The median is shown, with the median and P90
//     of the absolute error.
//   - fast-fail precision (FastFailPrecision): the requests refused by
//     wfq-budgets (at admission or while queued), looked up by ID in the wfq-budgets-nofastfail run of
//     the same workload: the share that missed their budget there
//     (expired, dispatched late or refused otherwise).
//   - throughput with boost on and off: overall tok/s of wfq-budgets and
//     wfq-budgets-noboost.
//
// Early refusal (Early, FormatEarly) compares the same two runs: refusals
// by moment; of the refusals of requests that missed without fast-fail,
// the latest after arrival (as a fraction of the budget), and for those
// arriving WarmAfter (5 s) or more after the first dispatch, how many came
// later than WarmLimit (500 ms); and the served work (actual tokens of
// completed requests) of each run.
//
// Scenarios with a health timeline also print, for wfq-budgets, the median
// predicted wait of the admissions in the 5 s and the 20 s before and
// after each health change and the share fast-failed
// (Result.HealthEffects).
//
// # Degrade ladder
//
// With Scenario.Degrade the engine policies (except fifo, whose single
// class would turn a class action into one on all traffic) run the ladder
// on the water level queued/Scenario.MaxQueue. Queue.Tick, every tick
// period, observes the water; ticks go on while the ladder is engaged even
// with no work, since it only releases on an observation. Before each
// submission the simulator asks Queue.LightMode for the request's class
// and, in light mode, trims the request: prompt to max_input_tokens,
// max_tokens and the output it will produce to max_tokens, so both its
// estimate and its service time drop (Record.Light). Throttle refusals
// are counted by their reason, class_throttled. Every second of virtual
// time with work the water level and level are sampled (Result.Timeline),
// and every transition is recorded (Result.Transitions); FormatTimeline
// prints them every 5 s and at every transition, then the waves (stretches
// with water >= 0.05) with their peak and transitions, and per class the
// met-budget rate by level at arrival.
//
// # Metrics
//
// Per tenant (or per group with Scenario.GroupRows); percentiles are
// nearest-rank over dispatched requests:
//
//   - wait: dispatch - arrival. P50, P95, P99.
//   - slot-free limit: the time from a request's arrival until the next
//     slot frees in that run (0 if a slot was free on arrival). A slot frees
//     when a completion leaves fewer requests in flight than capacity, or
//     when capacity grows above the number in flight. No non-preemptive
//     scheduler could have started the request sooner. "limit p95" is its
//     P95; "at limit" the fraction of requests with wait <= limit + 1 ms.
//   - in-order limit: the same, counting from arrival until the (q+1)-th
//     slot frees, where q is the number of the tenant's own requests queued
//     when it arrived. Every policy here keeps a tenant's requests in
//     arrival order, so those q requests each need a freed slot first; when
//     completions come in clusters, a 1 req/s tenant's requests pile up
//     behind one another and no scheduler can meet the plain limit for all
//     of them (strict priority meets it for 77% of seed002's B and the
//     in-order limit for 100%). "in order" is the fraction with wait <=
//     in-order limit + 1 ms.
//   - met budget: fraction of all the tenant's requests dispatched within
//     their class wait budget.
//   - tok/s: actual tokens of completed requests / (last completion - first
//     arrival of the tenant); makespan is that span.
//
// Overall:
//
//   - tok/s: all actual tokens / (last completion - first arrival).
//   - contended: total time during which some request was queued.
//   - Jain's index of weighted shares. Cut time into windows of
//     Scenario.Window (10 s) from 0 and keep those wholly inside contended
//     time. In each, for tenant i: received_i is the actual tokens served in
//     the window (a request's actual cost spread evenly over its service
//     time); demand_i = received_i + the actual cost of i's requests that
//     arrived before the window's end and were still queued at it; C =
//     sum received_i is the capacity the window delivered. fair_i is the
//     weighted max-min fair allocation of C given the demands (water-fill:
//     raise a level L until sum min(demand_i, L w_i) = C; fair_i =
//     min(demand_i, L w_i)), as in the fairAlloc of Kubernetes APF's
//     queueset tests, with weights. x_i = received_i / fair_i over tenants
//     with fair_i > 0, and J = (sum x_i)^2 / (n sum x_i^2): 1 when every
//     tenant got its fair share, 1/n when one tenant got everything. The
//     table shows the mean and the minimum over the windows. Windows rather
//     than the whole contended period, because over a period that ends with
//     an empty queue every tenant's demand was eventually met, so the
//     whole-period index is 1 for any policy, FIFO included.
//   - max service diff: for every two tenants of equal weight and every
//     interval in which both stay backlogged (have a request queued), the
//     largest change of served_i - served_j, where served is actual-cost-
//     corrected tokens (the estimate at dispatch, corrected to the actual
//     cost at completion, which is what the engine's Stats().Tenants[i].
//     Served reports with CostTokens). Sampled at every dispatch of either
//     tenant; printed with its ratio to the largest actual request cost, the
//     unit of the VTC bound (about 2x). Groups of more than 64 equal-weight
//     tenants are not tracked (O(backlogged) per dispatch), hence n/a in
//     "many".
package simulator
