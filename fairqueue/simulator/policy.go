package simulator

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Job is what the simulator hands a scheduler for one arrival.
type Job struct {
	ID       int
	Tenant   int // index into Scenario.Tenants
	Estimate int64
	// Deadline is the virtual time by which the job must be dispatched;
	// 0 means none.
	Deadline time.Duration
}

// Env is the simulator as a scheduler sees it. A scheduler reports every
// dispatch and every expiry through it, synchronously, from inside any of
// its own methods.
type Env interface {
	// Now is the virtual time since the start of the run.
	Now() time.Duration
	Dispatched(id int)
	Expired(id int)
}

// Scheduler is one policy's instance for one run. All calls come from the
// simulator's single goroutine at the current virtual time.
type Scheduler interface {
	// Submit admits a job; an error means it was refused at admission.
	Submit(j Job) error
	// Complete frees the slot of a dispatched job; actual is its actual
	// cost (prompt + output tokens).
	Complete(id int, actual int64)
	// SetHealthy sets the number of healthy upstreams.
	SetHealthy(n int)
	// Tick runs periodically while there is work.
	Tick()
}

// idler is implemented by schedulers that may leave a slot idle while work
// is queued (e.g. a token cap); the simulator then does not report such a
// moment as a work-conservation violation.
type idler interface{ MayIdle() bool }

// Policy builds a Scheduler for a run. New policies (wait budgets, boost)
// plug in by implementing it.
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

// PolicyByName returns the standard policy called name.
func PolicyByName(name string) (Policy, bool) {
	for _, p := range Policies() {
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
	// SingleTenant maps every request to one tenant and one class, which
	// makes the engine a plain FIFO: one flow, served in arrival order.
	SingleTenant bool
	// Configure, when set, adjusts the engine configuration before the
	// queue is built (a hook for variants).
	Configure func(*fairqueue.Config)
}

// Name returns the policy's name.
func (p EnginePolicy) Name() string { return p.PolicyName }

// singleTenant is the one tenant of the FIFO mapping.
const singleTenant = "all"

// New builds a queue on clock configured from sc.
func (p EnginePolicy) New(sc *Scenario, clock *fairqueue.ManualClock, env Env) (Scheduler, error) {
	cfg := fairqueue.Config{
		CostUnit:    p.CostUnit,
		MaxInflight: sc.Slots,
		Tenants:     map[string]fairqueue.TenantConfig{},
		// The margin must exceed the tick period, so a request is expired
		// by a tick before its deadline passes rather than after.
		ExpiryMargin: 2 * sc.tickPeriod(),
	}
	for _, c := range sc.Classes {
		cfg.Classes = append(cfg.Classes, fairqueue.ClassConfig{Name: c.Name, WaitBudget: c.Budget})
	}
	names := make([]string, len(sc.Tenants))
	if p.SingleTenant {
		cfg.Tenants[singleTenant] = fairqueue.TenantConfig{Weight: 1, Class: sc.Classes[0].Name}
		for i := range names {
			names[i] = singleTenant
		}
	} else {
		for i, t := range sc.Tenants {
			cfg.Tenants[t.Name] = fairqueue.TenantConfig{Weight: t.Weight, Class: t.Class}
			names[i] = t.Name
		}
	}
	cfg.Default = fairqueue.TenantConfig{Weight: 1, Class: sc.Classes[0].Name}
	if p.Configure != nil {
		p.Configure(&cfg)
	}
	q, err := fairqueue.New(cfg, clock)
	if err != nil {
		return nil, err
	}
	e := &EngineScheduler{q: q, env: env, names: names, start: clock.Now(),
		ids: map[*fairqueue.Ticket]int{}, tickets: map[int]*fairqueue.Ticket{}, pending: -1,
		mayIdle: cfg.MaxInflightTokens > 0}
	q.SetObserver(e.observe)
	return e, nil
}

// EngineScheduler adapts a fairqueue.Queue to Scheduler.
type EngineScheduler struct {
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
	err     error
	mayIdle bool
}

// MayIdle reports whether the queue may legitimately leave a slot idle with
// work queued: with a token cap, the next request may not fit.
func (e *EngineScheduler) MayIdle() bool { return e.mayIdle }

// Queue exposes the engine, for policies built on top of this adapter.
func (e *EngineScheduler) Queue() *fairqueue.Queue { return e.q }

func (e *EngineScheduler) observe(ev fairqueue.Event, tk *fairqueue.Ticket) {
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
	}
	switch ev {
	case fairqueue.EventDispatched:
		e.env.Dispatched(id)
	case fairqueue.EventExpired, fairqueue.EventCancelled:
		delete(e.ids, tk)
		e.env.Expired(id)
	}
}

// Submit enqueues j.
func (e *EngineScheduler) Submit(j Job) error {
	r := fairqueue.Request{Tenant: e.names[j.Tenant], Cost: j.Estimate}
	if j.Deadline > 0 {
		r.Deadline = e.start.Add(j.Deadline)
	}
	e.pending = j.ID
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

// Complete releases the job's ticket with its actual cost.
func (e *EngineScheduler) Complete(id int, actual int64) {
	tk := e.tickets[id]
	delete(e.tickets, id)
	delete(e.ids, tk)
	tk.Release(actual)
}

// SetHealthy forwards to the queue.
func (e *EngineScheduler) SetHealthy(n int) { e.q.SetHealthy(n) }

// Tick forwards to the queue.
func (e *EngineScheduler) Tick() { e.q.Tick() }

// Err reports observer events the adapter could not attribute.
func (e *EngineScheduler) Err() error { return e.err }

// PriorityPolicy is the strict-priority baseline: classes are served in
// Scenario.Classes order (realtime > interactive > batch), FIFO within a
// class, with the same slot model as the engine (Slots per healthy
// upstream, non-preemptive, work-conserving). It ignores tenants and
// weights, so it shows the best latency a class can get by starving
// everyone below it. It is the simulator's own code, not the engine's.
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
			p.env.Expired(j.ID)
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
			p.env.Expired(j.ID)
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
	if a.Deadline != b.Deadline {
		return a.Deadline < b.Deadline
	}
	return a.ID < b.ID
}
