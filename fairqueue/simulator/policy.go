package simulator

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/costmodel"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Job is what the simulator hands a scheduler for one arrival.
type Job struct {
	ID       int
	Tenant   int // index into Scenario.Tenants
	Estimate int64
	Prompt   int64         // the prompt part of Estimate
	Deadline time.Duration // 0: none
}

// Env is the simulator as a scheduler sees it. A scheduler reports every
// dispatch and every expiry through it, synchronously, from inside any of
// its own methods.
type Env interface {
	Now() time.Duration // since the start of the run
	Dispatched(id int)
	DispatchedFallback(id int)
	Expired(id int, reason fairqueue.Reason)
}

// Scheduler is one policy's instance for one run. All calls come from the
// simulator's single goroutine at the current virtual time.
type Scheduler interface {
	// Submit admits a job; an error means it was refused at admission.
	Submit(j Job) error
	// Complete frees the slot of a dispatched job with its actual cost.
	Complete(id int, actual int64)
	SetHealthy(n int)
	Tick()
}

// Policy builds a Scheduler for a run.
type Policy interface {
	Name() string
	New(sc *Scenario, clock *fairqueue.ManualClock, env Env) (Scheduler, error)
}

// Policies returns the standard policies in report order.
func Policies() []Policy {
	return []Policy{
		EnginePolicy{PolicyName: "fifo", CostUnit: fairqueue.CostRequests, SingleTenant: true},
		EnginePolicy{PolicyName: "drr-requests", CostUnit: fairqueue.CostRequests},
		PriorityPolicy{},
		EnginePolicy{PolicyName: "wfq-tokens", CostUnit: fairqueue.CostTokens},
	}
}

// WFQLearned is wfq with cost_unit learned: costs priced by a cost model
// learned from the completions, as the handler does.
const WFQLearned = "wfq-learned"

// Names of the budget policies.
const (
	FIFOBudgets   = "fifo-budgets"
	WFQBudgets    = "wfq-budgets"
	WFQNoBoost    = "wfq-budgets-noboost"
	WFQNoFastFail = "wfq-budgets-nofastfail"
)

// BudgetPolicies returns the wait-budget policies in report order.
// fifo-budgets keeps the throughput settings so that its ETAs (recorded,
// not acted on) are comparable.
func BudgetPolicies() []Policy {
	return []Policy{
		EnginePolicy{PolicyName: FIFOBudgets, CostUnit: fairqueue.CostTokens, SingleTenant: true, Budgets: true,
			Configure: func(c *fairqueue.Config) { c.Admission = fairqueue.BudgetConfig{Throughput: c.Admission.Throughput} }},
		EnginePolicy{PolicyName: WFQBudgets, CostUnit: fairqueue.CostTokens, Budgets: true},
		EnginePolicy{PolicyName: WFQNoBoost, CostUnit: fairqueue.CostTokens, Budgets: true,
			Configure: func(c *fairqueue.Config) { c.Admission.BoostShareMax = 0 }},
		EnginePolicy{PolicyName: WFQNoFastFail, CostUnit: fairqueue.CostTokens, Budgets: true,
			Configure: func(c *fairqueue.Config) { c.Admission.FastFail = false }},
	}
}

func (sc *Scenario) admission() fairqueue.BudgetConfig {
	if sc.Admission != nil {
		return *sc.Admission
	}
	return fairqueue.DefaultBudgetConfig()
}

// PolicyByName returns the standard or budget policy called name.
func PolicyByName(name string) (Policy, bool) {
	for _, p := range append(append(Policies(), BudgetPolicies()...),
		EnginePolicy{PolicyName: WFQLearned, CostUnit: fairqueue.CostLearned}) {
		if p.Name() == name {
			return p, true
		}
	}
	return nil, false
}

// EnginePolicy runs the real scheduler, fairqueue.Queue.
type EnginePolicy struct {
	PolicyName string
	CostUnit   fairqueue.CostUnit
	// SingleTenant maps every request to one tenant and one class: a
	// plain FIFO.
	SingleTenant bool
	// Budgets enforces wait budgets as deadlines and applies
	// Scenario.Admission.
	Budgets bool
	// Configure, when set, adjusts the engine configuration.
	Configure func(*fairqueue.Config)
}

// Name returns the policy's name.
func (p EnginePolicy) Name() string { return p.PolicyName }

// singleTenant is the one tenant of the FIFO mapping.
const singleTenant = "all"

// New builds a queue on clock configured from sc.
func (p EnginePolicy) New(sc *Scenario, clock *fairqueue.ManualClock, env Env) (Scheduler, error) {
	cfg, names, classes := p.config(sc)
	q, err := fairqueue.New(cfg, clock)
	if err != nil {
		return nil, err
	}
	e := &engineScheduler{q: q, env: env, names: names, classes: classes, start: clock.Now(),
		ids: map[*fairqueue.Ticket]int{}, tickets: map[int]*fairqueue.Ticket{}, pending: -1,
		mayIdle: cfg.MaxInflightTokens > 0 || cfg.UpstreamQuota != nil, ladder: len(cfg.Degrade) > 0,
		boosts: budget.NewBoosts(cfg.Admission.BoostShareMax, cfg.Admission.PerTenantBoostHourly)}
	q.SetObserver(e.observe)
	if cfg.CostUnit == fairqueue.CostLearned {
		e.model, e.prompts = costmodel.New(costmodel.Config{}), map[int]int64{}
	}
	if cfg.Fallback != nil {
		q.SetFallbackHealthy(1)
	}
	if e.ladder {
		q.SetDegradeObserver(func(tr degrade.Transition) { e.transitions = append(e.transitions, tr) })
	}
	if cfg.Circuit != nil {
		q.SetCircuitObserver(func(ev fairqueue.CircuitEvent) { e.circuitEvents = append(e.circuitEvents, ev) })
	}
	return e, nil
}

// config is the engine configuration of sc under p, with each tenant's
// engine tenant name and class.
func (p EnginePolicy) config(sc *Scenario) (cfg fairqueue.Config, names, classes []string) {
	cfg = fairqueue.Config{
		CostUnit:      p.CostUnit,
		MaxInflight:   sc.Slots,
		MaxQueue:      sc.MaxQueue,
		UpstreamQuota: sc.UpstreamQuota,
		Tenants:       map[string]fairqueue.TenantConfig{},
		Default:       fairqueue.TenantConfig{Weight: 1, Class: sc.Classes[0].Name},
		// The margin must exceed the tick period, so a request is expired
		// by a tick before its deadline passes rather than after.
		ExpiryMargin: 2 * sc.tickPeriod(),
	}
	for _, c := range sc.Classes {
		cfg.Classes = append(cfg.Classes, fairqueue.ClassConfig{Name: c.Name, WaitBudget: c.Budget})
	}
	for _, t := range sc.Tenants {
		name, class := t.Name, t.Class
		if p.SingleTenant {
			name, class = singleTenant, cfg.Default.Class
		} else {
			cfg.Tenants[name] = fairqueue.TenantConfig{Weight: t.Weight, Class: t.Class, Tier: t.Tier, Reserve: t.Reserve}
		}
		names, classes = append(names, name), append(classes, class)
	}
	if p.SingleTenant {
		cfg.Tenants[singleTenant] = cfg.Default
	} else {
		cfg.Degrade, cfg.DegradeHold = sc.Degrade, sc.DegradeHold
		cfg.Circuit = sc.Circuit
		if sc.Fallback != nil {
			cfg.Fallback = &fairqueue.FallbackConfig{Tenants: sc.Fallback.Tenants, MaxInflight: sc.Fallback.Slots}
		}
	}
	if p.Budgets {
		cfg.Admission = sc.admission()
	}
	if p.Configure != nil {
		p.Configure(&cfg)
	}
	return cfg, names, classes
}

// engineScheduler adapts a fairqueue.Queue to Scheduler.
type engineScheduler struct {
	q     *fairqueue.Queue
	env   Env
	names []string // tenant index -> engine tenant name
	start time.Time

	// ids maps live tickets to job IDs for the observer. A ticket can be
	// dispatched (and reported) inside Enqueue, before Enqueue returns it;
	// an unknown ticket reported then is the one being submitted, pending.
	ids     map[*fairqueue.Ticket]int
	tickets map[int]*fairqueue.Ticket
	pending int
	err     error // an observer event it could not attribute
	// mayIdle: with a token cap or an account, the next request may not fit.
	mayIdle bool

	classes     []string // tenant index -> engine class
	ladder      bool
	transitions []degrade.Transition
	boosts      *budget.Boosts // the configured budget, for its Limit

	circuitEvents []fairqueue.CircuitEvent
	// model learns the cost model under CostLearned; prompts holds the
	// prompt tokens of the jobs in flight for it.
	model   *costmodel.Model
	prompts map[int]int64
}

// prediction returns the ETA the engine gave the job at admission.
func (e *engineScheduler) prediction(id int) (time.Duration, bool) {
	tk := e.tickets[id]
	if tk == nil {
		return 0, false
	}
	return tk.ETA(), true
}

func (e *engineScheduler) boosted(id int) bool {
	tk := e.tickets[id]
	return tk != nil && tk.Boosted()
}

func (e *engineScheduler) boostedInflight() int { return e.q.Stats(false).BoostedInflight }

func (e *engineScheduler) observe(ev fairqueue.Event, tk *fairqueue.Ticket) {
	if ev == fairqueue.EventReleased {
		return // Complete caused it; nothing to schedule.
	}
	id, ok := e.ids[tk]
	if !ok {
		if e.pending < 0 {
			if e.err == nil {
				e.err = fmt.Errorf("observer: event %d for an unknown ticket", ev)
			}
			return
		}
		id = e.pending
		e.ids[tk] = id
		e.tickets[id] = tk
	}
	switch ev {
	case fairqueue.EventDispatched:
		if tk.Fallback() {
			e.env.DispatchedFallback(id)
			return
		}
		e.env.Dispatched(id)
	case fairqueue.EventExpired, fairqueue.EventCancelled:
		delete(e.ids, tk)
		delete(e.tickets, id)
		reason := fairqueue.ReasonCancelled
		var rej *fairqueue.Rejection
		if errors.As(tk.Err(), &rej) {
			reason = rej.Reason
		}
		e.env.Expired(id, reason)
	}
}

func (e *engineScheduler) Submit(j Job) error {
	r := fairqueue.Request{Tenant: e.names[j.Tenant], Cost: j.Estimate, Prompt: j.Prompt}
	if j.Deadline > 0 {
		r.Deadline = e.start.Add(j.Deadline)
	}
	e.pending = j.ID
	if e.prompts != nil {
		e.prompts[j.ID] = j.Prompt
	}
	tk, err := e.q.Enqueue(r)
	e.pending = -1
	if err != nil {
		return err
	}
	if _, ok := e.ids[tk]; ok || tk.Err() == nil {
		e.ids[tk] = j.ID
		e.tickets[j.ID] = tk
	}
	return nil
}

func (e *engineScheduler) Complete(id int, actual int64) {
	tk := e.tickets[id]
	delete(e.tickets, id)
	delete(e.ids, tk)
	if e.model != nil {
		// What a gateway measures: the request's tokens and how long it
		// kept its upstream busy, dispatch to completion.
		busy := e.env.Now() - tk.Dispatched().Sub(e.start)
		e.model.Observe(e.prompts[id], actual-e.prompts[id], busy)
		delete(e.prompts, id)
	}
	tk.Release(actual)
}

func (e *engineScheduler) SetHealthy(n int) { e.q.SetHealthy(n) }

// Tick refits the cost model, as the handler does on its tick, and ticks
// the queue.
func (e *engineScheduler) Tick() {
	if e.model != nil {
		if f := e.model.Fit(); f.Ready && f.PerCompletionToken > 0 {
			e.q.SetCostModel(f.Overhead/f.PerCompletionToken, f.PerPromptToken/f.PerCompletionToken)
		}
	}
	e.q.Tick()
}

// PriorityPolicy is the strict-priority baseline of the package doc, the
// simulator's own code on the engine's slot model.
type PriorityPolicy struct{}

// Name returns "priority".
func (PriorityPolicy) Name() string { return "priority" }

// New builds the baseline scheduler.
func (PriorityPolicy) New(sc *Scenario, _ *fairqueue.ManualClock, env Env) (Scheduler, error) {
	p := &priorityScheduler{env: env, slots: sc.Slots, margin: 2 * sc.tickPeriod(),
		rank: make([]int, len(sc.Tenants)), queues: make([][]Job, len(sc.Classes)+1),
		heads: make([]int, len(sc.Classes)+1), expired: map[int]bool{}, withDeadline: map[int]bool{}}
	for i, t := range sc.Tenants {
		p.rank[i] = sc.ClassRank(t.Class)
	}
	return p, nil
}

type priorityScheduler struct {
	env      Env
	slots    int
	capacity int
	inflight int
	margin   time.Duration
	rank     []int
	// queues[r][heads[r]:] is class r's FIFO.
	queues [][]Job
	heads  []int
	// withDeadline holds the queued jobs that have a deadline; deadlines is
	// a min-heap of them, whose entries go stale (and are skipped) once the
	// job is dispatched. expired holds jobs that expired while queued: they
	// stay in their FIFO until pop skips them.
	withDeadline map[int]bool
	deadlines    minHeap[byDeadline]
	expired      map[int]bool
}

var errNoCapacity = errors.New("no healthy upstream")

func (p *priorityScheduler) Submit(j Job) error {
	if p.capacity == 0 {
		return errNoCapacity
	}
	r := p.rank[j.Tenant]
	p.queues[r] = append(p.queues[r], j)
	if j.Deadline > 0 {
		p.withDeadline[j.ID] = true
		p.deadlines.push(byDeadline(j))
	}
	p.dispatch()
	return nil
}

func (p *priorityScheduler) Complete(int, int64) {
	p.inflight--
	p.dispatch()
}

func (p *priorityScheduler) SetHealthy(n int) {
	p.capacity = n * p.slots
	p.dispatch()
}

func (p *priorityScheduler) Tick() {
	limit := p.env.Now() + p.margin
	for len(p.deadlines) > 0 && p.deadlines[0].Deadline <= limit {
		j := p.deadlines.pop()
		if p.withDeadline[j.ID] {
			delete(p.withDeadline, j.ID)
			p.expired[j.ID] = true
			p.env.Expired(j.ID, fairqueue.ReasonQueueTimeout)
		}
	}
}

func (p *priorityScheduler) dispatch() {
	for p.inflight < p.capacity {
		j, ok := p.pop()
		if !ok {
			return
		}
		delete(p.withDeadline, j.ID)
		if j.Deadline > 0 && p.env.Now() >= j.Deadline {
			// Like the engine: never dispatched after its deadline.
			p.env.Expired(j.ID, fairqueue.ReasonQueueTimeout)
			continue
		}
		p.inflight++
		p.env.Dispatched(j.ID)
	}
}

// pop takes the head of the highest non-empty class, skipping expired jobs.
func (p *priorityScheduler) pop() (Job, bool) {
	for r := range p.queues {
		for p.heads[r] < len(p.queues[r]) {
			j := p.queues[r][p.heads[r]]
			p.queues[r][p.heads[r]] = Job{}
			p.heads[r]++
			if p.heads[r] == len(p.queues[r]) {
				p.queues[r], p.heads[r] = p.queues[r][:0], 0
			} else if p.heads[r] > 1024 && p.heads[r]*2 > len(p.queues[r]) {
				// Compact so a long-lived queue does not grow forever.
				n := copy(p.queues[r], p.queues[r][p.heads[r]:])
				p.queues[r], p.heads[r] = p.queues[r][:n], 0
			}
			if p.expired[j.ID] {
				delete(p.expired, j.ID)
				continue
			}
			return j, true
		}
	}
	return Job{}, false
}

// byDeadline orders jobs by deadline, then ID.
type byDeadline Job

func (a byDeadline) less(b byDeadline) bool {
	return cmp.Or(cmp.Compare(a.Deadline, b.Deadline), cmp.Compare(a.ID, b.ID)) < 0
}
