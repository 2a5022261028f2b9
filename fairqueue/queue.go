package fairqueue

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Request is what a caller asks the queue to schedule.
type Request struct {
	// Tenant names the tenant; unknown names get Config.Default.
	Tenant string
	// Class overrides the tenant's class when non-empty; the caller decides
	// whether the override is allowed.
	Class string
	// Cost is the estimated cost in tokens. With CostRequests the tenant is
	// charged 1 per request instead, but Cost still counts against the
	// token caps (MaxInflightTokens, MaxQueueTokens).
	Cost int64
	// Prompt is the part of Cost that is prompt tokens, for CostLearned
	// (0: unknown, all of Cost priced as completion).
	Prompt int64
	// Deadline is when the request must have been dispatched; zero = none.
	Deadline time.Time
	// Bytes is the memory the request holds while it waits (its body and
	// anything derived from it), counted against Config.MaxQueueBytes.
	Bytes int64
}

// Event is what an Observer is told about a ticket.
type Event int

// Ticket events, reported after the queue's lock is released.
const (
	EventDispatched Event = iota + 1
	EventExpired
	EventCancelled
	EventReleased
)

// Observer is told of each ticket event, outside the queue's lock, one event
// at a time and in the order the events happened, over all goroutines.
// Normally the call that caused an event delivers it before returning; when
// another goroutine is delivering at that moment (the observer itself
// calling into the queue, say), that goroutine delivers it instead.
type Observer func(ev Event, t *Ticket)

// Queue is a weighted fair queue over a pool of upstream slots. All methods
// are safe for concurrent use.
//
// Lock convention (as in Kubernetes' queueset): every field after mu is
// guarded by mu, and so is every field of the tenants, flows, class queues
// and tickets the queue holds. A method whose name ends in Locked must be
// called with mu held and never releases it; every other method takes mu
// itself (unlock releases it and delivers events).
type Queue struct {
	clock Clock
	// statsMu lets one Stats copy the tenants at a time (stats.go).
	statsMu sync.Mutex

	mu       sync.Mutex
	cfg      Config
	healthy  int
	capacity int
	// slotLimit caps capacity when >= 0: this gateway's grant of a shared
	// pool (SetSlotLimit).
	slotLimit int
	tokenCap  int64

	classes []*classQ
	tenants map[string]*tenant
	// epoch is the clock's reading when the queue was made: tickets keep
	// their times as nanoseconds from it (Queue.since).
	epoch time.Time
	// declared and undeclared are the queue's copies of the tenant
	// settings the tenants point to (tenant.cfg).
	declared   map[string]*TenantConfig
	undeclared *TenantConfig
	// roster lists the tenants in no order, each at its rosterIdx, so that
	// Stats can copy them in chunks; scan is its cursor (-1: no copy under
	// way) and scanMoved the tenants moved behind the cursor since.
	roster    []*tenant
	scan      int
	scanMoved []*tenant
	// busyWeight is the summed weight of the busyN declared tenants with
	// requests queued; backlogged is BackloggedWeight's value (float64
	// bits), read without the lock.
	busyWeight float64
	busyN      int
	backlogged atomic.Uint64
	// lightOn is whether some degrade step trims a class now, so that
	// LightMode needs the lock only then.
	lightOn atomic.Bool
	// busyWas is the last state told to the rate estimator's SetBusy
	// (busyTold: at least once).
	busyTold, busyWas bool
	// tenantPeak is the most tenants remembered since tenants was made.
	tenantPeak int
	// shareServed is set once TakeServed is called; shareDirty lists the
	// tenants charged since (shared.go).
	shareServed bool
	shareDirty  []*tenant
	shareNames  map[string]int
	// holdNotes are the quota holds set since the last refuseHeldLocked.
	holdNotes []holdNote
	// group is the one top-level flow owner of all undeclared tenants.
	group     *tenant
	boost     ticketList
	deadlines deadlineHeap

	// vfloor is V: the start tag of the latest dispatch.
	vfloor  float64
	flowSeq uint64

	queued     int
	queuedCost int64
	// queuedWork is queuedCost in cost units (the unit of virtual time).
	queuedWork      int64
	inflight        int
	inflightCost    int64
	boostedInflight int
	// queuedBytes is Request.Bytes summed over queued requests, and
	// groupBytes over those of undeclared tenants.
	queuedBytes, groupBytes int64
	// waterCost is the token term of the water level (see waterLocked).
	waterCost int64
	waterCap  int64
	// idle lists the tenants that were idle when listed, the longest idle
	// first (see pruneLocked).
	idle idleList
	// held orders the tenants held by their quota, the earliest release
	// first; quotas is the in-process quota store.
	held   holdHeap
	quotas *quota.Memory
	// rng draws the Retry-After jitter; seeded, so runs are reproducible.
	rng *rand.Rand

	observer Observer

	ov              *overload
	adm             *admission
	degradeObserver func(degrade.Transition)
	transitions     []degrade.Transition
	// circuit is the circuit breaker, nil without one (circuit.go);
	// circuitUnits and circuitCaps are scratch space.
	circuit         *degrade.Circuit
	circuitObserver func(CircuitEvent)
	circuitEvents   []CircuitEvent
	circuitRes      []string
	circuitUnits    []float64
	circuitCaps     []float64
	// satWas is the saturation last told to the circuit (satTold: since
	// it was built).
	satTold, satWas bool
	// busySum/busyW is the queue's mean busy time per request.
	busySum, busyW float64
	backlog        backlogMarks
	// up is the provider account, fb the fallback channel; nil without.
	up *upstream
	fb *fallback
	// fbInflight counts the requests in flight on the fallback; kept here
	// so that a reload that removes or re-adds the fallback keeps it right.
	fbInflight int
	// costOverhead and costPromptWeight price a request under CostLearned.
	costOverhead, costPromptWeight float64
	// events are produced under mu and not yet delivered; delivering is set
	// while one goroutine hands them to the observer; spare is a buffer
	// kept for reuse.
	events     []pendingEvent
	spare      []pendingEvent
	delivering bool
	// closed says why the queue was closed (Close); "" while open.
	closed string

	// remoteStore: cfg.QuotaStore is a quota.Remote (gate.go); offLock is
	// its copy for Enqueue to read before it takes the lock.
	remoteStore bool
	offLock     atomic.Bool
	// storeCalls are the store calls left to be made once the lock is
	// released; storeCallsInFlight counts those being made.
	storeCalls         []func()
	storeCallsInFlight atomic.Int64
}

type pendingEvent struct {
	ev Event
	t  *Ticket
}

// classQ holds the backlogged flows of one class; group is the undeclared
// tenants' group flow of it, nil until one of them queues in it.
type classQ struct {
	name   string
	paused bool
	flows  flowHeap
	group  *flow
}

type tenant struct {
	// group is the group an undeclared tenant schedules inside; nil for a
	// declared tenant and for the group itself. A tenant keeps its
	// placement until it is idle.
	group *tenant
	// cfg is the settings in force (Queue.declared or Queue.undeclared).
	cfg *TenantConfig
	// flowBuf backs flows for the usual single class.
	flowBuf    [1]*flow
	queued     int
	inflight   int
	queuedCost int64
	queuedWork int64 // queuedCost in cost units
	known      bool
	// capped is set while the tenant is at its MaxInflight; out while it
	// is capped or its quota holds it (heldIdx >= 0, until heldUntil): its
	// flows are out of the heaps.
	capped bool
	out    bool
	onIdle bool
	// busy is set while a declared tenant counts in Queue.busyWeight.
	busy bool
	// shareListed says the tenant is on Queue.shareDirty (shared.go).
	shareListed bool

	weight float64
	// vt is the virtual time: service received / weight. A refund is kept
	// in credit and taken off the next charges, so vt never goes back.
	vt     float64
	credit float64
	// served is the cost charged so far (estimates, corrected by back-fill).
	served float64
	flows  []*flow
	// stamp marks the tenant as counted in the current ETA walk.
	stamp uint64

	// idleSince is when the tenant last had nothing queued or in flight
	// (Unix ns).
	idleSince int64
	name      string
	// vfloor is, for the group, its inner V.
	vfloor float64
	// rosterIdx is the tenant's place in Queue.roster; -1 once forgotten.
	rosterIdx int32
	// heldIdx is the tenant's place in Queue.held, -1 when not held.
	heldIdx int32
	// idleAt orders the tenant on Queue.idle: its idleSince when listed.
	idleAt             int64
	idlePrev, idleNext *tenant
	// heldUntil (Unix ns) ends a quota hold.
	heldUntil int64
	// demand is what only some tenants need (circuit.go).
	demand *tenantDemand
	// ahead is the tenant's place in the work-ahead index (ahead.go).
	ahead aheadSlot
	// shareDelta is the cost charged since the last TakeServed; remoteDebt
	// the cost ChargeRemote charged since the tenant was last idle, the
	// most a remote refund may give back (shared.go).
	shareDelta float64
	remoteDebt float64
}

// flow is one tenant's FIFO of one class.
type flow struct {
	t  *tenant
	q  ticketList
	cq *classQ
	// in and out count the cost that ever entered and left the flow; a
	// ticket's mark is in when it entered, so mark-out is the cost still
	// ahead of it.
	in, out int64
	id      int32 // slot in the heap it sits in: cq.flows, or the group flow's sub
	// group: this is the undeclared tenants' group flow of cq, and sub
	// the heap of its members' backlogged flows.
	group bool
	sub   *flowHeap
	seq   uint64
	drain flowDrain // early refusal's drain rate (refuse.go)
	// tokens is the estimated tokens queued in the flow.
	tokens int64
}

// queuedWork is the cost queued in f.
func (f *flow) queuedWork() int64 { return f.in - f.out }

// head returns the request the flow would dispatch next, nil when none.
func (f *flow) head() *Ticket {
	if f.group {
		if f.sub.len() == 0 {
			return nil
		}
		return f.sub.flow(f.sub.top()).q.head
	}
	return f.q.head
}

// entry returns the flow's heap key; the flow must have a head.
func (f *flow) entry() flowEntry {
	start, finish := f.tags()
	return flowEntry{start: start, finish: finish, seq: f.seq, id: f.id}
}

// tags returns the start and finish tags of entry.
func (f *flow) tags() (start, finish float64) {
	return f.t.vt, f.t.vt + float64(f.head().cost)/f.t.weight
}

// parent returns, for an undeclared tenant's flow, the group's flow of the
// same class, whose sub-heap orders the members' flows; nil otherwise.
func (f *flow) parent() *flow {
	if f.t.group != nil {
		return f.cq.group
	}
	return nil
}

// heap returns the heap f sits in when backlogged.
func (f *flow) heap() *flowHeap {
	if p := f.parent(); p != nil {
		return p.sub
	}
	return &f.cq.flows
}

// New returns a queue with no healthy upstream; call SetHealthy before
// expecting dispatches.
func New(cfg Config, clock Clock) (*Queue, error) {
	if clock == nil {
		clock = RealClock{}
	}
	q := &Queue{clock: clock, epoch: clock.Now(), tenants: make(map[string]*tenant), shareNames: make(map[string]int), costPromptWeight: 1, slotLimit: -1, scan: -1,
		group: &tenant{name: "(undeclared tenants)", heldIdx: -1},
		rng:   rand.New(rand.NewPCG(0x6661697271756575, 0x7265747279))}
	q.group.flows = q.group.flowBuf[:0]
	if err := q.Reconfigure(cfg); err != nil {
		return nil, err
	}
	return q, nil
}

// SetObserver installs fn to be told of every ticket event.
func (q *Queue) SetObserver(fn Observer) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.observer = fn
}

// Config returns a copy of the current configuration.
func (q *Queue) Config() Config {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

// Reconfigure applies cfg while requests are queued and in flight: nothing
// queued or in flight is lost, dropped or dispatched twice, and queued
// requests above a lowered cap stay. A tenant that becomes declared or
// undeclared keeps its placement until it is next idle.
func (q *Queue) Reconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.unlock()
	ov, err := newOverload(&cfg, q.ov)
	if err != nil {
		return err
	}
	circuit, err := newCircuit(&cfg, q.circuit)
	if err != nil {
		return err
	}
	up, err := newUpstream(&cfg, q.up)
	if err != nil {
		return err
	}
	fb, err := newFallback(&cfg, q.fb)
	if err != nil {
		return err
	}
	q.cfg, q.ov, q.circuit, q.up, q.fb = cfg, ov, circuit, up, fb
	q.circuitRes, q.satTold = nil, false
	if circuit != nil {
		q.circuitRes = circuit.Resources()
	}
	q.remoteStore = isRemote(cfg.QuotaStore)
	q.offLock.Store(q.remoteStore)
	q.lightOn.Store(ov.light != nil)
	q.adm = newAdmission(&cfg.Admission, q.adm)
	if c := waterCap(&cfg); c != q.waterCap {
		q.waterCap = c
		q.recountWaterLocked()
	}
	for _, cl := range cfg.Classes {
		if q.classLocked(cl.Name) == nil {
			q.classes = append(q.classes, &classQ{name: cl.Name})
		}
	}
	q.retuneTenantsLocked()
	return nil
}

// retuneTenantsLocked applies q.cfg, just replaced, to the tenants, their
// weights and the orders that follow from them.
func (q *Queue) retuneTenantsLocked() {
	q.setTenantConfigsLocked()
	q.group.weight, q.group.cfg = q.cfg.Default.Weight, q.undeclared
	for _, t := range q.tenants {
		tc, known := q.tenantConfigLocked(t.name)
		t.weight, t.known, t.cfg = tc.Weight, known, tc
		if t.misplaced() && t.queued == 0 && t.inflight == 0 {
			q.forgetLocked(t)
			continue
		}
		q.capLocked(t)
	}
	q.recountBusyLocked() // weights changed
	for len(q.held) > 0 {
		// A tenant whose quota changed is charged again under the new
		// limits at its next dispatch.
		q.unholdLocked(q.held[0])
	}
	// Finish tags depend on weights: re-key the members' heaps first, since
	// a group flow's key reads its sub-heap.
	for _, gf := range q.group.flows {
		gf.sub.rebuild()
	}
	for _, cq := range q.classes {
		cq.flows.rebuild()
	}
	q.adm.ahead.reset() // weights, classes and pauses may have changed
	q.setCapacityLocked(q.healthy)
	q.applyPausesLocked()
}

// SetHealthy sets the number of healthy upstreams; capacity follows at once.
func (q *Queue) SetHealthy(n int) {
	n = max(n, 0)
	q.mu.Lock()
	defer q.unlock()
	if n != q.healthy {
		now := q.clock.Now()
		q.advanceCapLocked(now)
		q.setCapacityLocked(n)
		q.refuseLocked(now) // every queued ETA changed
		q.dispatchLocked(now)
	}
}

func (q *Queue) setCapacityLocked(healthy int) {
	q.healthy = healthy
	q.capacity = q.cfg.MaxInflight * healthy
	if q.slotLimit >= 0 {
		q.capacity = min(q.capacity, q.slotLimit)
	}
	q.tokenCap = q.cfg.MaxInflightTokens * int64(healthy)
}

// SetSlotLimit caps the capacity at n slots (n < 0: no cap): this
// gateway's grant of a pool several gateways share. A lower cap preempts
// nothing. With the capacity at 0 requests still queue; only no healthy
// upstream refuses them.
func (q *Queue) SetSlotLimit(n int) {
	q.mu.Lock()
	defer q.unlock()
	if n = max(n, -1); n != q.slotLimit {
		q.slotLimit = n
		q.setCapacityLocked(q.healthy)
		q.dispatchLocked(q.clock.Now())
	}
}

func (q *Queue) classLocked(name string) *classQ {
	for _, cq := range q.classes {
		if cq.name == name {
			return cq
		}
	}
	return nil
}

// misplaced reports whether the tenant sits where its configuration no
// longer puts it: declared but inside the undeclared group, or the reverse.
func (t *tenant) misplaced() bool { return (t.group != nil) == t.known }

// settingsLocked returns the settings a request of tenant name (its state
// t, nil when none) is admitted with, whether the tenant is declared, and
// the class it is scheduled in: cls, or the tenant's class when cls is
// empty or unknown.
func (q *Queue) settingsLocked(t *tenant, name, cls string) (*TenantConfig, bool, string) {
	tc, known := q.tenantConfigLocked(name)
	if t != nil {
		tc, known = t.cfg, t.known
	}
	if cls == "" || q.classLocked(cls) == nil {
		cls = tc.Class
	}
	return tc, known, cls
}

// tenantConfigLocked returns the settings of tenant name and whether it is
// declared.
func (q *Queue) tenantConfigLocked(name string) (*TenantConfig, bool) {
	if tc, ok := q.declared[name]; ok {
		return tc, true
	}
	return q.undeclared, false
}

// setTenantConfigsLocked makes the queue's own copies of q.cfg's tenant
// settings, which the tenants point to; only SetQuotaWeight changes them
// in place.
func (q *Queue) setTenantConfigsLocked() {
	q.undeclared = new(TenantConfig)
	*q.undeclared = q.cfg.Default
	buf := make([]TenantConfig, 0, len(q.cfg.Tenants))
	q.declared = make(map[string]*TenantConfig, len(q.cfg.Tenants))
	for name, tc := range q.cfg.Tenants {
		buf = append(buf, tc)
		q.declared[name] = &buf[len(buf)-1]
	}
}

// Enqueue admits r or refuses it with a *Rejection. An admitted request may
// be dispatched before Enqueue returns. The caller must end the ticket with
// Release (or let Wait end it), exactly as the Ticket documents.
func (q *Queue) Enqueue(r Request) (*Ticket, error) {
	now := q.clock.Now()
	pre := q.bookQuota(&r, now)
	if pre != nil {
		now = q.clock.Now()
	}
	q.mu.Lock()
	defer q.unlock()
	in := q.intakeLocked(&r)
	hold, rej := q.admissionGatesLocked(now, &r, &in, pre)
	if in.tc.Quota == nil {
		// A reload took the quota away since the booking: give it back.
		q.unbookRefusedLocked(r.Tenant, pre)
		pre = nil
	}
	if rej != nil {
		q.unbookRefusedLocked(r.Tenant, pre)
		return nil, rej
	}
	if in.t == nil {
		in.t = q.newTenantLocked(r.Tenant, &in, now)
	}
	q.liftLocked(in.t)
	cq := q.classLocked(in.cls)
	decision, est := q.budgetDecisionLocked(now, &r, &in, cq)
	if decision == budget.Reject {
		q.unbookRefusedLocked(r.Tenant, pre)
		return nil, budgetRejection(est, r.Deadline.Sub(now))
	}
	tk := &Ticket{q: q, t: in.t, cost: in.cost, tokens: in.tokens, bytes: max(r.Bytes, 0),
		deadline: r.Deadline, enqueued: q.since(now), dlIdx: -1, prompt: in.prompt}
	if q.queued == 0 && q.startsNowLocked(in.t, in.tokens, r.Deadline, now) {
		q.startIdleLocked(tk, q.flowOfLocked(in.t, cq), now)
		return tk, nil
	}
	q.waitLocked(now, tk, cq, est.ETA, hold, pre, decision == budget.Boost)
	return tk, nil
}

// waitLocked queues tk in its tenant's flow of class cq to wait for a
// slot, with its quota hold and booking pre, boosted ahead on boost.
func (q *Queue) waitLocked(now time.Time, tk *Ticket, cq *classQ, eta time.Duration, hold quotaDelay, pre *quotaBooking, boost bool) {
	tk.eta = max(eta, hold.wait)
	if hold.wait > 0 {
		d := hold
		tk.delay = &d
	}
	if pre.booked() {
		q.keepBookingLocked(now, tk.t, tk, pre)
	}
	f := q.flowOfLocked(tk.t, cq)
	tk.f, tk.state, tk.mark = f, stateQueued, f.in
	f.in += tk.cost
	f.tokens += tk.tokens
	f.q.insertAfter(tk, f.q.tail)
	if f.q.head == tk {
		f.drain = flowDrain{} // backlogged anew: an idle gap is no drain
		if !tk.t.out {
			q.linkFlowLocked(f)
		}
	}
	q.countLocked(tk, 1)
	if !tk.deadline.IsZero() {
		heap.Push(&q.deadlines, tk)
	}
	if boost {
		q.promoteLocked(now, tk)
	}
	q.dispatchLocked(now)
}

// intake is a request as Enqueue prices it: its tenant's state (nil: not
// remembered) and settings, its class, and its size in tokens and in the
// queue's cost unit.
type intake struct {
	t                    *tenant
	tc                   *TenantConfig
	known                bool
	cls                  string
	tokens, prompt, cost int64
}

// intakeLocked prices r.
func (q *Queue) intakeLocked(r *Request) intake {
	t := q.tenants[r.Tenant]
	if t != nil && t.queued == 0 && t.inflight == 0 && t.misplaced() {
		q.forgetLocked(t)
		t = nil
	}
	in := intake{t: t, tokens: max(r.Cost, 1)}
	in.tc, in.known, in.cls = q.settingsLocked(t, r.Tenant, r.Class)
	in.prompt = min(max(r.Prompt, 0), in.tokens)
	in.cost = in.tokens
	switch q.cfg.CostUnit {
	case CostRequests:
		in.cost = 1
	case CostLearned:
		in.cost = q.learnedCostLocked(in.prompt, in.tokens-in.prompt)
	}
	return in
}

// admissionGatesLocked runs the gates that refuse r whatever is queued:
// the circuit breaker, the queue's limits, the class's throttle and the
// tenant's quota (with pre, the booking made before the lock).
func (q *Queue) admissionGatesLocked(now time.Time, r *Request, in *intake, pre *quotaBooking) (quotaDelay, *Rejection) {
	if q.circuit != nil {
		if rej := q.circuitLocked(now, in.t, in.tc, r.Tenant, in.tokens); rej != nil {
			return quotaDelay{}, rej
		}
	}
	if rej := q.admitLocked(now, in.t, r.Tenant, in.tc, in.known, in.tokens, max(r.Bytes, 0)); rej != nil {
		return quotaDelay{}, rej
	}
	if len(q.ov.throttle) > 0 {
		if rej := q.throttleLocked(now, in.cls, in.tc.Class, in.tokens, true); rej != nil {
			return quotaDelay{}, rej
		}
	}
	if in.tc.Quota == nil {
		return quotaDelay{}, nil
	}
	return q.quotaAdmitLocked(now, in.t, r.Tenant, in.tc.Quota, r.Deadline, pre)
}

// budgetDecisionLocked decides r's wait budget. A refusal stands unless
// the fallback channel or the tenant's reservation takes the request.
func (q *Queue) budgetDecisionLocked(now time.Time, r *Request, in *intake, cq *classQ) (budget.Decision, Estimate) {
	if r.Deadline.IsZero() || q.startsAtOnceLocked() {
		return budget.Wait, Estimate{Known: true}
	}
	t := in.t
	decision, est := q.decideLocked(now, t, cq, in.cost, r.Deadline)
	if decision != budget.Reject {
		return decision, est
	}
	if q.fallbackServesLocked(r.Tenant) {
		return budget.Wait, est // the fallback takes it if the primary cannot
	}
	if q.up != nil && q.reservedInTimeLocked(now, t, quota.Backlog{Requests: int64(t.queued) + 1, Tokens: t.queuedCost + in.tokens}, r.Deadline) {
		return budget.Wait, est // its reservation takes it, whatever tag order says
	}
	return decision, est
}

// unbookRefusedLocked gives back the booking pre, if any, of a request
// refused at admission or no longer under a quota.
func (q *Queue) unbookRefusedLocked(tenant string, pre *quotaBooking) {
	if pre.booked() {
		q.refundLaterLocked(tenant, pre.limits, pre.tokens)
	}
}

// startsNowLocked reports whether a request of t for tokens, admitted now
// while nothing is queued, goes at once with nothing to decide: a slot is
// free, its tenant is eligible, its deadline is ahead, and neither the
// token gate, a quota, the provider account nor a hold has a say.
func (q *Queue) startsNowLocked(t *tenant, tokens int64, deadline, now time.Time) bool {
	return q.inflight < q.capacity && !t.out && t.cfg.Quota == nil &&
		q.up == nil && len(q.held) == 0 &&
		!q.overTokenCapLocked(tokens) &&
		(deadline.IsZero() || now.Before(deadline))
}

// startIdleLocked dispatches the new tk, in flow f, for which
// startsNowLocked holds, leaving what queueing and dispatching it would
// leave without the round trip through the heaps.
func (q *Queue) startIdleLocked(tk *Ticket, f *flow, now time.Time) {
	tk.f, tk.mark = f, f.in
	q.aheadTouchLocked(tk.t)
	f.in += tk.cost
	f.out += tk.cost
	f.drain = flowDrain{}
	q.startLocked(tk, now, tk.enqueued, false)
	q.dispatchDoneLocked(now, false)
}

// newTenantLocked creates the state of a tenant about to queue the request in.
// It starts on the idle list, so a tenant refused after this point is
// still forgotten.
func (q *Queue) newTenantLocked(name string, in *intake, now time.Time) *tenant {
	t := &tenant{name: name, weight: in.tc.Weight, known: in.known, cfg: in.tc, heldIdx: -1}
	t.flows = t.flowBuf[:0]
	if !in.known {
		t.group = q.group
		t.vt = q.group.vfloor
	}
	q.tenants[name] = t
	q.addRosterLocked(t)
	q.tenantPeak = max(q.tenantPeak, len(q.tenants))
	t.idleSince = now.UnixNano()
	q.idle.push(t)
	if q.circuit != nil {
		t.observeDemand(now, q.circuit.Config().Window, q.serviceTimeLocked(q.serviceOwnerLocked(t, name)), in.tokens)
	}
	return t
}

// liftLocked applies the counter lift to a tenant about to queue: an idle
// tenant (and an idle group) rejoins at the virtual time of the level it
// competes at, or where the service it received puts it if that is later.
// With nothing queued it is in no heap, so only the work-ahead index
// hears of the change.
func (q *Queue) liftLocked(t *tenant) {
	if g := t.group; g != nil && g.queued == 0 {
		g.remoteDebt = 0
		if v := max(g.vt-g.credit, q.vfloor); v != g.vt || g.credit != 0 {
			g.vt, g.credit = v, 0
			q.aheadTouchLocked(g)
		}
	}
	if t.queued == 0 {
		t.remoteDebt = 0
		if v := max(t.vt-t.credit, q.virtualTimeLocked(t)); v != t.vt || t.credit != 0 {
			t.vt, t.credit = v, 0
			q.aheadTouchLocked(t)
		}
	}
}

// admitLocked applies the caps that do not depend on the request's class:
// capacity, size, the tenant's and the group's queue, the global queue in
// requests, tokens and bytes. t is nil for a tenant the queue does not
// remember.
func (q *Queue) admitLocked(now time.Time, t *tenant, name string, tc *TenantConfig, known bool, tokens, bytes int64) *Rejection {
	if rej := q.closedLocked(); rej != nil {
		return rej
	}
	if q.healthy == 0 && !q.fallbackServesLocked(name) {
		return &Rejection{Reason: ReasonNoCapacity, RetryAfter: q.retryAfterLocked(0),
			Detail: "no healthy upstream"}
	}
	if rej := q.tooLargeLocked(tokens); rej != nil {
		return rej
	}
	if rej := q.tenantFullLocked(now, t, tc, known, tokens, bytes); rej != nil {
		return rej
	}
	full := func(what string, have, limit int64) *Rejection {
		return &Rejection{Reason: ReasonQueueFull, RetryAfter: q.drainRetryLocked(now, q.queuedWork),
			Detail: fmt.Sprintf("%d %s queued (limit %d)", have, what, limit)}
	}
	switch c := &q.cfg; {
	case c.MaxQueue > 0 && q.queued >= c.MaxQueue:
		return full("requests", int64(q.queued), int64(c.MaxQueue))
	case c.MaxQueueTokens > 0 && q.queuedCost+tokens > c.MaxQueueTokens:
		return full("tokens", q.queuedCost, c.MaxQueueTokens)
	case c.MaxQueueBytes > 0 && q.queuedBytes+bytes > c.MaxQueueBytes:
		return full("bytes", q.queuedBytes, c.MaxQueueBytes)
	}
	return nil
}

// tooLargeLocked refuses a request that no amount of waiting could admit:
// more estimated tokens than one upstream may hold in flight, or than the
// whole queue may hold.
func (q *Queue) tooLargeLocked(tokens int64) *Rejection {
	if m := q.cfg.MaxInflightTokens; m > 0 && tokens > m {
		return &Rejection{Reason: ReasonTooLarge,
			Detail: fmt.Sprintf("request estimated at %d tokens, more than the %d one model server may hold in flight (max_inflight_tokens)", tokens, m)}
	}
	if m := q.cfg.MaxQueueTokens; m > 0 && tokens > m {
		return &Rejection{Reason: ReasonTooLarge,
			Detail: fmt.Sprintf("request estimated at %d tokens, more than the %d the whole queue may hold (max_queue_tokens)", tokens, m)}
	}
	return nil
}

// tenantFullLocked applies the tenant's own queue cap and, for an
// undeclared tenant, the group's cap (Default.MaxQueue) and the
// per-undeclared-tenant cap.
func (q *Queue) tenantFullLocked(now time.Time, t *tenant, tc *TenantConfig, known bool, tokens, bytes int64) *Rejection {
	own := tc.MaxQueue
	if !known {
		own = q.cfg.DefaultPerTenantMaxQueue
		if rej := q.groupFullLocked(now, tc, tokens, bytes); rej != nil {
			return rej
		}
	}
	if own > 0 && t != nil && t.queued >= own {
		return &Rejection{Reason: ReasonTenantQueueFull, RetryAfter: q.drainRetryLocked(now, t.queuedWork),
			Detail: fmt.Sprintf("tenant has %d requests queued (limit %d)", t.queued, own)}
	}
	return nil
}

// groupFullLocked checks the undeclared tenants' room together: their
// queue cap (Default.MaxQueue) and the same share of MaxQueueBytes and
// MaxQueueTokens, so that undeclared traffic cannot fill the declared
// tenants' room either.
func (q *Queue) groupFullLocked(now time.Time, tc *TenantConfig, tokens, bytes int64) *Rejection {
	g := q.group
	if tc.MaxQueue <= 0 {
		return nil
	}
	full := func(what string, have, limit int64) *Rejection {
		return &Rejection{Reason: ReasonTenantQueueFull, RetryAfter: q.drainRetryLocked(now, g.queuedWork),
			Detail: fmt.Sprintf("undeclared tenants together have %d %s queued (limit %d)", have, what, limit)}
	}
	if g.queued >= tc.MaxQueue {
		return full("requests", int64(g.queued), int64(tc.MaxQueue))
	}
	share := 1.0
	if q.cfg.MaxQueue > 0 {
		share = min(float64(tc.MaxQueue)/float64(q.cfg.MaxQueue), 1)
	}
	if limit := int64(share * float64(q.cfg.MaxQueueBytes)); limit > 0 && g.queued > 0 && q.groupBytes+bytes > limit {
		return full("bytes", q.groupBytes, limit)
	}
	if limit := int64(share * float64(q.cfg.MaxQueueTokens)); limit > 0 && g.queued > 0 && g.queuedCost+tokens > limit {
		return full("tokens", g.queuedCost, limit)
	}
	return nil
}

// virtualTimeLocked is the virtual time an idle tenant rejoins at: V at the
// level where t competes (the group's inner one for an undeclared tenant).
func (q *Queue) virtualTimeLocked(t *tenant) float64 {
	if t.group != nil {
		return t.group.vfloor
	}
	return q.vfloor
}

// flowOfLocked returns t's flow of class cq, creating it (and, for an
// undeclared tenant, the group's flow of that class).
func (q *Queue) flowOfLocked(t *tenant, cq *classQ) *flow {
	for _, f := range t.flows {
		if f.cq == cq {
			return f
		}
	}
	q.flowSeq++
	f := &flow{t: t, cq: cq, seq: q.flowSeq}
	if t.group != nil {
		f.id = q.flowOfLocked(t.group, cq).sub.newID(f)
	} else {
		if t == q.group {
			f.sub, f.group, cq.group = &flowHeap{}, true, f
		}
		f.id = cq.flows.newID(f)
	}
	t.flows = append(t.flows, f)
	return f
}

// linkFlowLocked puts f, which has a head, into its heap, or re-keys it
// there, and re-keys its group flow.
func (q *Queue) linkFlowLocked(f *flow) {
	q.aheadTouchLocked(f.t)
	if p := f.parent(); p != nil {
		p.sub.put(f)
		f = p
	}
	f.cq.flows.put(f)
}

// unlinkFlowLocked takes f out of its heap if it is there; a group flow
// whose last member flow leaves goes too.
func (q *Queue) unlinkFlowLocked(f *flow) {
	q.aheadTouchLocked(f.t)
	p := f.parent()
	if !f.heap().remove(f) || p == nil {
		return
	}
	if p.sub.len() == 0 {
		p.cq.flows.remove(p)
	} else {
		p.cq.flows.rekey(p)
	}
}

// countLocked adds (sign 1) or removes (-1) a queued ticket from the
// counts of its tenant, its group and the queue. The boost lane counts as
// queued.
func (q *Queue) countLocked(tk *Ticket, sign int) {
	t := tk.t
	n, c := sign, int64(sign)
	t.queued += n
	t.queuedCost += c * tk.tokens
	t.queuedWork += c * tk.cost
	q.busyLocked(t)
	if g := t.group; g != nil {
		g.queued += n
		if (g.queued == 0) != (g.queued == n) {
			q.publishBackloggedLocked() // the group became backlogged or not
		}
		g.queuedCost += c * tk.tokens
		g.queuedWork += c * tk.cost
		q.groupBytes += c * tk.bytes
	}
	q.queued += n
	q.queuedCost += c * tk.tokens
	q.queuedWork += c * tk.cost
	q.queuedBytes += c * tk.bytes
	q.waterCost += c * min(tk.tokens, q.waterCap)
	q.aheadTouchLocked(t)
}

// takeLocked takes a queued or boosted ticket out of wherever it waits.
// With rekey false, a flow whose head tk was and that stays backlogged is
// left for the caller to re-key (dispatch does, once, after the charge).
func (q *Queue) takeLocked(tk *Ticket, rekey bool) {
	q.unlinkTicketLocked(tk, rekey)
	q.countLocked(tk, -1)
}

// unlinkTicketLocked takes tk out of its flow or the boost lane and out of
// the deadline heap, leaving the counts as they are (promotion keeps a
// ticket queued).
func (q *Queue) unlinkTicketLocked(tk *Ticket, rekey bool) {
	if tk.state == stateBoosted {
		q.boost.remove(tk)
		q.adm.boostCost -= tk.cost
	} else {
		f := tk.f
		wasHead := f.q.head == tk
		f.q.remove(tk)
		f.out += tk.cost
		f.tokens -= tk.tokens
		switch {
		case f.q.head == nil:
			q.unlinkFlowLocked(f)
		case wasHead && rekey && f.heap().contains(f.id):
			q.linkFlowLocked(f)
		}
	}
	if tk.dlIdx >= 0 {
		heap.Remove(&q.deadlines, int(tk.dlIdx))
	}
}

// fixFlowsLocked re-orders t's flows after its virtual time changed, and a
// member's group flows, whose keys read the members' heads.
func (q *Queue) fixFlowsLocked(t *tenant) {
	q.aheadTouchLocked(t)
	// Nothing queued (the boost lane counts) means no flow in a heap.
	if t.queued > 0 {
		for _, f := range t.flows {
			f.heap().rekey(f)
		}
	}
	if g := t.group; g != nil && g.queued > 0 {
		for _, f := range g.flows {
			f.cq.flows.rekey(f)
		}
	}
}

// capLocked makes t ineligible for dispatch while it is at its in-flight
// cap (its flows leave the heaps) and eligible again below it.
func (q *Queue) capLocked(t *tenant) {
	m := t.cfg.MaxInflight
	if at := m > 0 && t.inflight >= m; at != t.capped {
		t.capped = at
		q.relinkLocked(t)
	}
}

// relinkLocked takes t's flows out of the heaps while it is capped or held
// by its quota, and puts them back once it is neither.
func (q *Queue) relinkLocked(t *tenant) {
	out := t.capped || t.heldIdx >= 0
	if out == t.out {
		return
	}
	t.out = out
	for _, f := range t.flows {
		switch {
		case out:
			q.unlinkFlowLocked(f)
		case f.q.head != nil:
			q.linkFlowLocked(f)
		}
	}
}

// nextLocked returns the ticket dispatch would start now, or nil, and
// whether it overtakes tag order from the boost lane. The lane goes first
// while boosted requests in flight are under the boost budget; past it, it
// waits for tag order to run dry. Boosted requests of ineligible tenants
// are passed over (the lane is short: the boost budget bounds it).
func (q *Queue) nextLocked() (*Ticket, bool) {
	var best, bestPaused *classQ
	for _, cq := range q.classes {
		if cq.flows.len() == 0 {
			continue
		}
		top := cq.flows.top()
		if cq.paused {
			if bestPaused == nil || top.before(bestPaused.flows.top()) {
				bestPaused = cq
			}
		} else if best == nil || top.before(best.flows.top()) {
			best = cq
		}
	}
	if best == nil {
		best = bestPaused
	}
	lane := q.boost.head
	for lane != nil && lane.t.out {
		lane = lane.next
	}
	switch {
	case lane != nil && best == nil:
		return lane, false
	case lane != nil && q.boostRoomLocked():
		return lane, true
	case best == nil:
		return nil, false
	}
	return best.flows.flow(best.flows.top()).head(), false
}

// dispatchLocked starts requests while capacity allows: the work-conserving
// loop every state change ends with.
func (q *Queue) dispatchLocked(now time.Time) {
	gated := false
	if q.inflight < q.capacity || len(q.held) > 0 || q.up != nil {
		gated = q.dispatchLoopLocked(now)
	}
	q.dispatchDoneLocked(now, gated)
}

// dispatchDoneLocked is what dispatchLocked does once the primary's loop
// stopped, gated telling whether it stopped at a gate with a slot free.
func (q *Queue) dispatchDoneLocked(now time.Time, gated bool) {
	if q.fb != nil {
		q.dispatchFallbackLocked(now)
	}
	if len(q.holdNotes) > 0 {
		q.refuseHeldLocked(now)
	}
	// The throughput estimator counts completions only while a free slot
	// would be filled at once: the system's capacity, not its demand. A
	// capacity of 0 (a shared pool's grant, for now) serves nothing.
	busy := gated || q.capacity > 0 && q.inflight >= q.capacity
	if q.circuit != nil {
		q.noteSaturationLocked(now, busy)
	}
	if !q.busyTold || busy != q.busyWas {
		q.adm.rate.SetBusy(now, busy)
		q.busyTold, q.busyWas = true, busy
	}
}

// dispatchLoopLocked starts what it can and reports whether it stopped
// with a slot free and an eligible request waiting (a gate shut). The next
// request in tag order meets, in turn: the provider's pause, the token cap,
// its deadline, its tenant's quota and the provider account. Holds take a
// tenant's flows out of the heaps, so nextLocked never offers them.
func (q *Queue) dispatchLoopLocked(now time.Time) (gated bool) {
	if len(q.held) > 0 {
		q.unholdDueLocked(now)
	}
	if q.up != nil && !now.Before(q.up.until) && !q.up.until.IsZero() {
		q.up.until = time.Time{}
	}
	for q.inflight < q.capacity {
		if q.up != nil && now.Before(q.up.until) {
			q.up.heldAt = now
			return q.queued > 0 // the provider said: nothing until then
		}
		if q.queued == 0 {
			return false // what nextLocked would find: nothing
		}
		tk, overtakes := q.nextLocked()
		if tk == nil {
			return false
		}
		if q.overTokenCapLocked(tk.tokens) {
			return true
		}
		if !tk.deadline.IsZero() && !now.Before(tk.deadline) {
			q.takeLocked(tk, true)
			q.finishLocked(now, tk, stateExpired, q.timeoutLocked(now))
			continue
		}
		next, v := q.dispatchGatesLocked(now, tk)
		switch v {
		case gateHeld:
			continue
		case gateShut:
			return true
		}
		// startLocked re-keys the flow once, after the charge.
		q.takeLocked(next, false)
		q.startLocked(next, now, q.since(now), overtakes && next == tk)
	}
	return false
}

// gateVerdict is what a dispatch gate says of the candidate in tag order.
type gateVerdict int

const (
	gateOpen gateVerdict = iota // it goes (charged where the gate charges)
	gateHeld                    // its tenant is held: the next candidate may go
	gateShut                    // nothing more goes now
)

// overTokenCapLocked reports whether a request of tokens must wait for
// tokens in flight to drain. A request above the cap (a reload lowered
// it) still goes alone.
func (q *Queue) overTokenCapLocked(tokens int64) bool {
	return q.tokenCap > 0 && q.inflight > 0 && q.inflightCost+tokens > q.tokenCap
}

// dispatchGatesLocked passes tk through the gates after the slot, the
// token cap and the deadline: its tenant's quota, then the provider
// account, which may send another request instead (returned). With an
// account, an in-process quota is only asked here and charged once the
// account took the request.
func (q *Queue) dispatchGatesLocked(now time.Time, tk *Ticket) (*Ticket, gateVerdict) {
	if !q.quotaPassLocked(now, tk, q.up == nil) {
		return tk, gateHeld
	}
	if q.up == nil {
		return tk, gateOpen
	}
	return q.accountGateLocked(now, tk)
}

// quotaPassLocked reports whether tk's tenant quota lets it go now: on a
// shared store at its tenant's next booked time (gate.go); otherwise the
// in-process quota is charged, or with charge false only asked. A tenant
// the quota refuses is held.
func (q *Queue) quotaPassLocked(now time.Time, tk *Ticket, charge bool) bool {
	switch {
	case q.remoteStore:
		return q.bookedDueLocked(now, tk)
	case tk.t.cfg.Quota == nil:
		return true
	case charge:
		return q.chargeQuotaLocked(now, tk)
	}
	return q.quotaAllowsLocked(now, tk)
}

// accountGateLocked is the provider account's gate: the level the
// provider last reported, then a draw on the account. When the account
// cannot take tk in tag order, only reserved tenants go, on their
// reservations, until it can. Last, an in-process quota asked by
// dispatchGatesLocked is charged; if it refuses after all, the account
// gets its draw back.
func (q *Queue) accountGateLocked(now time.Time, tk *Ticket) (*Ticket, gateVerdict) {
	if !q.levelAllowsLocked(now, tk) {
		q.up.heldAt = now
		return tk, gateShut // the provider reported less left than tk needs
	}
	v := gateOpen
	if !q.upstreamChargeLocked(now, tk) {
		if tk = q.reservedNextLocked(now); tk == nil {
			return nil, gateShut
		}
		switch {
		case q.overTokenCapLocked(tk.tokens):
			v = gateShut
		case !q.quotaPassLocked(now, tk, false):
			v = gateHeld
		}
	}
	if v == gateOpen && !q.remoteStore && !q.quotaPassLocked(now, tk, true) {
		v = gateHeld
	}
	if v != gateOpen {
		q.refundUpstreamLocked(tk)
	}
	return tk, v
}

// timeoutLocked is the answer to a request whose budget ran out queued.
func (q *Queue) timeoutLocked(now time.Time) *Rejection {
	return &Rejection{Reason: ReasonQueueTimeout, RetryAfter: q.drainRetryLocked(now, q.queuedWork),
		Detail: "wait budget ran out while queued"}
}

// startLocked dispatches tk at now; at is since(now), the callers' to
// compute (the idle path has it already).
func (q *Queue) startLocked(tk *Ticket, now time.Time, at int64, overtakes bool) {
	t := tk.t
	if overtakes {
		tk.boosted = true
		q.boostedInflight++
	}
	tk.state = stateInflight
	tk.dispatched = at
	if tk.ch != nil && tk.ch.booked {
		q.useBookingLocked(tk)
	}
	if tk.fallback {
		q.fbInflight++
	} else {
		q.adm.cold.Start(now, float64(tk.cost))
		q.inflight++
		q.inflightCost += tk.tokens
	}
	t.inflight++
	q.busyLocked(t)
	if g := t.group; g != nil {
		g.inflight++
		g.vfloor = max(g.vfloor, t.vt)
		q.vfloor = max(q.vfloor, g.vt)
		g.vt += g.chargeLocked(float64(tk.cost) / g.weight)
	} else {
		q.vfloor = max(q.vfloor, t.vt)
	}
	t.vt += t.chargeLocked(float64(tk.cost) / t.weight)
	t.served += float64(tk.cost)
	q.noteServedLocked(t, float64(tk.cost))
	q.capLocked(t)
	q.fixFlowsLocked(t)
	tk.wakeLocked()
	q.emitLocked(EventDispatched, tk)
}

// chargeLocked returns how far a charge of dv moves t's virtual time:
// refunds owed for earlier over-estimates are paid here, so the start tag
// a newcomer was lifted to is never undercut.
func (t *tenant) chargeLocked(dv float64) float64 {
	if t.credit > 0 {
		use := min(t.credit, dv)
		t.credit -= use
		dv -= use
	}
	return dv
}

// finishLocked ends a ticket that will never be dispatched.
func (q *Queue) finishLocked(now time.Time, tk *Ticket, st ticketState, err error) {
	if tk.ch != nil && tk.ch.booked {
		q.unbookLocked(tk)
	}
	tk.state = st
	tk.err = err
	tk.wakeLocked()
	q.idleCheckLocked(tk.t, now)
	if st == stateExpired {
		q.emitLocked(EventExpired, tk)
	} else {
		q.emitLocked(EventCancelled, tk)
	}
}

// idleCheckLocked records that t is idle now if it has nothing queued or
// in flight, and puts it on the idle list unless it is there already.
func (q *Queue) idleCheckLocked(t *tenant, now time.Time) {
	if t.queued == 0 && t.inflight == 0 {
		t.idleSince = now.UnixNano()
		if !t.onIdle {
			q.idle.push(t)
		}
	}
}

func (q *Queue) emitLocked(ev Event, tk *Ticket) {
	if q.observer != nil {
		q.events = append(q.events, pendingEvent{ev, tk})
	}
}

// unlock releases the lock, makes the store calls left for after it, and
// tells the observer what happened, so an observer may call back into the
// queue. Only one goroutine delivers at a time, draining batches until none
// is left, which keeps the events in order.
func (q *Queue) unlock() {
	if calls := q.storeCalls; len(calls) > 0 {
		q.storeCalls = nil
		q.runStoreCalls(calls)
	}
	if len(q.events) == 0 || q.delivering {
		q.mu.Unlock()
		return
	}
	q.delivering = true
	for len(q.events) > 0 {
		evs, obs := q.events, q.observer
		q.events, q.spare = q.spare[:0], nil
		q.mu.Unlock()
		q.deliver(obs, evs)
		clear(evs)
		q.mu.Lock()
		q.spare = evs[:0]
	}
	q.delivering = false
	q.mu.Unlock()
}

// deliver hands evs to obs. If the observer panics, delivery is handed back
// so that later events are still delivered, and the panic goes on.
func (q *Queue) deliver(obs Observer, evs []pendingEvent) {
	done := false
	defer func() {
		if !done {
			q.mu.Lock()
			q.delivering = false
			q.mu.Unlock()
		}
	}()
	if obs != nil {
		for _, e := range evs {
			obs(e.ev, e.t)
		}
	}
	done = true
}

// maxForgetPerTick bounds the tenants one Tick forgets, so a tick stays
// short after a burst of one-shot tenants.
const maxForgetPerTick = 1024

// Tick expires queued tickets whose deadline is within ExpiryMargin and
// forgets tenants idle for longer than IdleForget. Callers run it on a
// short period (the handler) or at event times (the simulator).
func (q *Queue) Tick() {
	now := q.clock.Now()
	q.mu.Lock()
	limit := now.Add(q.cfg.ExpiryMargin)
	for len(q.deadlines) > 0 && !q.deadlines[0].tk.deadline.After(limit) {
		tk := q.deadlines[0].tk
		q.takeLocked(tk, true)
		q.finishLocked(now, tk, stateExpired, q.timeoutLocked(now))
	}
	q.recheckLocked(now)
	q.refuseLocked(now)
	q.observeWaterLocked(now)
	q.observeCircuitLocked(now)
	q.pruneLocked(now, maxForgetPerTick)
	// An expired head may have been what held the token gate closed.
	q.dispatchLocked(now)
	trs, obs := q.transitions, q.degradeObserver
	q.transitions = nil
	cevs, cobs := q.circuitEvents, q.circuitObserver
	q.circuitEvents = nil
	q.unlock()
	for _, tr := range trs {
		obs(tr)
	}
	if cobs != nil {
		for _, ev := range cevs {
			cobs(ev)
		}
	}
}

// pruneLocked forgets up to max tenants idle since IdleForget ago, the
// longest idle first. A forgotten tenant that returns has dropped at most
// one request's service debt, no more than a new tenant ID would. The idle
// list is kept lazily: at its head a busy tenant leaves it and one idle
// again since it was listed moves to the tail, so a tenant is forgotten
// within twice IdleForget, at O(1) a step.
func (q *Queue) pruneLocked(now time.Time, max int) {
	forget := q.cfg.IdleForget
	if forget <= 0 {
		forget = DefaultIdleForget
	}
	cut := now.Add(-forget).UnixNano()
	for n := 0; n < max; n++ {
		t := q.idle.head
		if t == nil || t.idleAt > cut {
			return
		}
		switch {
		case t.queued > 0 || t.inflight > 0:
			q.idle.remove(t)
		case t.idleSince > cut:
			q.idle.remove(t)
			q.idle.push(t)
		default:
			q.forgetLocked(t)
		}
	}
}

// forgetLocked drops an idle tenant's state: its flows' heap slots, its
// place on the idle list and, for an undeclared tenant, its boost history
// (declared tenants keep theirs for the hourly limit).
func (q *Queue) forgetLocked(t *tenant) {
	for _, f := range t.flows {
		f.heap().freeID(f.id)
	}
	if t.onIdle {
		q.idle.remove(t)
	}
	if t.heldIdx >= 0 {
		heap.Remove(&q.held, int(t.heldIdx))
	}
	if !t.known {
		q.adm.boosts.Forget(t.name)
	}
	delete(q.tenants, t.name)
	q.removeRosterLocked(t)
	// A Go map keeps its buckets when entries are deleted: once most of the
	// tenants seen at the peak are gone, move the rest to a fresh map.
	if n := len(q.tenants); n > q.tenantPeak {
		q.tenantPeak = n
	} else if q.tenantPeak >= 1024 && n < q.tenantPeak/4 {
		m := make(map[string]*tenant, n)
		for k, v := range q.tenants {
			m[k] = v
		}
		q.tenants, q.tenantPeak = m, n
	}
}

// release ends tk as its owner asked: a queued ticket is cancelled, a
// dispatched one completes with its actual cost and the prompt tokens the
// upstream reported (negative: not reported).
func (q *Queue) release(tk *Ticket, actual, prompt int64) {
	q.mu.Lock()
	now := q.clock.Now()
	switch tk.state {
	case stateQueued, stateBoosted:
		q.takeLocked(tk, true)
		q.finishLocked(now, tk, stateCancelled, &Rejection{Reason: ReasonCancelled,
			Detail: "request cancelled while queued"})
		// The cancelled ticket may have been the head that did not fit the
		// free token capacity; what follows it may fit.
		q.dispatchLocked(now)
	case stateInflight:
		// A shared store's reconciliations wait for the lock to go.
		if d, ok := q.deferReconcileLocked(tk, actual, prompt); ok {
			q.completeLocked(now, tk, actual, prompt)
			q.unlock()
			q.reconcileDeferred(d)
			return
		}
		q.completeLocked(now, tk, actual, prompt)
	}
	q.unlock()
}

func (q *Queue) completeLocked(now time.Time, tk *Ticket, actual, prompt int64) {
	t := tk.t
	if !tk.fallback {
		// The fallback's completions say nothing of the primary's rate.
		q.adm.rate.Observe(now, float64(tk.cost), q.healthy)
		q.adm.cold.Finish(now, tk.dispatchedLocked(), float64(tk.cost))
		if q.circuit != nil {
			q.noteServiceLocked(tk, now)
		}
	}
	if tk.ch != nil {
		// Both correct what dispatch charged, which tk.ch records.
		q.reconcileQuotaLocked(tk, actual)
		q.reconcileUpstreamLocked(tk, providerCount(tk, prompt))
	}
	tk.state = stateReleased
	tk.actual = actual
	q.leaveSlotLocked(tk)
	if actual >= 0 && q.cfg.CostUnit == CostLearned {
		// actual is tokens: price them as the estimate was.
		actual = q.learnedCostLocked(min(tk.prompt, actual), actual-min(tk.prompt, actual))
	}
	if actual >= 0 && q.cfg.CostUnit != CostRequests && actual != tk.cost {
		q.correctChargeLocked(t, float64(actual-tk.cost))
	}
	q.capLocked(t)
	q.idleCheckLocked(t, now)
	q.emitLocked(EventReleased, tk)
	q.dispatchLocked(now)
}

// leaveSlotLocked takes a dispatched tk off the counts of what is in
// flight: its channel's, its tenant's and group's, and the boost budget's.
func (q *Queue) leaveSlotLocked(tk *Ticket) {
	if tk.fallback {
		q.fbInflight--
	} else {
		q.inflight--
		q.inflightCost -= tk.tokens
	}
	tk.t.inflight--
	q.busyLocked(tk.t)
	if g := tk.t.group; g != nil {
		g.inflight--
	}
	if tk.boosted {
		q.boostedInflight--
	}
}

// correctChargeLocked corrects the service charged to t, and its group, by d:
// an over-estimate is refunded as credit (see doc.go).
func (q *Queue) correctChargeLocked(t *tenant, d float64) {
	t.served += d
	q.noteServedLocked(t, d)
	moved := t.backfillLocked(d)
	if g := t.group; g != nil && g.backfillLocked(d) {
		moved = true
	}
	if moved {
		q.fixFlowsLocked(t)
	}
}

// backfillLocked applies a cost correction of d to t (credit for a refund,
// paid from credit first for a surcharge) and reports whether vt moved.
func (t *tenant) backfillLocked(d float64) bool {
	dv := d / t.weight
	if dv < 0 {
		t.credit -= dv
		return false
	}
	use := min(t.credit, dv)
	t.credit -= use
	if dv > use {
		t.vt += dv - use
		return true
	}
	return false
}

// idleList is an intrusive FIFO of tenants that were idle when listed,
// in about the order they became idle (see pruneLocked).
type idleList struct{ head, tail *tenant }

func (l *idleList) push(t *tenant) {
	t.idleAt, t.onIdle = t.idleSince, true
	t.idlePrev, t.idleNext = l.tail, nil
	if l.tail != nil {
		l.tail.idleNext = t
	} else {
		l.head = t
	}
	l.tail = t
}

func (l *idleList) remove(t *tenant) {
	if t.idlePrev != nil {
		t.idlePrev.idleNext = t.idleNext
	} else {
		l.head = t.idleNext
	}
	if t.idleNext != nil {
		t.idleNext.idlePrev = t.idlePrev
	} else {
		l.tail = t.idlePrev
	}
	t.idlePrev, t.idleNext, t.onIdle = nil, nil, false
}
