package fairqueue

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// Request is what a caller asks the queue to schedule.
type Request struct {
	// Tenant names the tenant; unknown names get Config.Default.
	Tenant string
	// Class overrides the tenant's class when non-empty; the caller decides
	// whether the override is allowed (only lowering, per the HTTP contract).
	Class string
	// Cost is the estimated cost in tokens. With CostRequests the tenant is
	// charged 1 per request instead, but Cost still counts against the
	// token caps (MaxInflightTokens, MaxQueueTokens).
	Cost int64
	// Deadline is when the request must have been dispatched; zero = none.
	Deadline time.Time
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
// at a time (never concurrently) and in the order the events happened, over
// all goroutines: a ticket's EventDispatched always comes before its
// EventReleased. Normally the call that caused an event delivers it before
// returning. When another goroutine is delivering at that moment, that
// goroutine delivers it instead; in particular a call the observer itself
// makes into the queue returns at once and its events follow as soon as the
// current one has been handled. The simulator uses it to schedule
// completions; metrics use it to record waits.
type Observer func(ev Event, t *Ticket)

// Queue is a weighted fair queue over a pool of upstream slots. All methods
// are safe for concurrent use.
type Queue struct {
	clock Clock

	mu       sync.Mutex
	cfg      Config
	healthy  int
	capacity int
	tokenCap int64

	classes   []*classQ
	tenants   map[string]*tenant
	boost     ticketList
	deadlines deadlineHeap

	// vfloor is the start tag of the latest dispatch: the virtual time an
	// arriving tenant is lifted to when nobody is backlogged.
	vfloor  float64
	flowSeq uint64

	queued          int
	queuedCost      int64
	inflight        int
	inflightCost    int64
	boostedInflight int
	lastPrune       time.Time

	observer Observer

	ov              *overload
	adm             *admission
	degradeObserver func(degrade.Transition)
	transitions     []degrade.Transition
	// events are produced under mu and not yet delivered; delivering is set
	// while one goroutine hands them to the observer; spare is a delivered
	// buffer kept for reuse, so steady operation does not allocate.
	events     []pendingEvent
	spare      []pendingEvent
	delivering bool
}

type pendingEvent struct {
	ev Event
	t  *Ticket
}

// classQ holds the backlogged flows of one class.
type classQ struct {
	name   string
	paused bool
	flows  flowHeap
}

type tenant struct {
	name   string
	weight float64
	known  bool
	cfg    TenantConfig // the settings in force, refreshed by Reconfigure
	// vt is the tenant's virtual time: service received / weight. It never
	// goes backwards while the tenant is backlogged: a refund for an
	// over-estimate is kept in credit and taken off the tenant's next charges.
	vt     float64
	credit float64
	flows  []*flow
	// flowBuf backs flows for the usual one or two classes, so that
	// finding a tenant's flows reads the tenant's own memory.
	flowBuf [2]*flow

	queued     int
	queuedCost int64
	inflight   int
	// stamp marks the tenant as counted in the current ETA pass.
	stamp uint64
	// served is the cost charged so far (estimates, corrected by back-fill).
	served float64
}

// flow is one tenant's FIFO of one class.
type flow struct {
	t  *tenant
	cq *classQ
	q  ticketList
	// in and out count the cost that ever entered and left the flow, and
	// queuedCost what is in it; a ticket's mark is in when it entered, so
	// mark-out is the cost still ahead of it.
	in, out, queuedCost int64
	id                  int32 // position slot in cq.flows
	seq                 uint64
	drain               flowDrain // early refusal's drain rate (refuse.go)
}

// entry returns the flow's heap key: the start and finish tags of its head
// request. The flow must have a head.
func (f *flow) entry() flowEntry {
	return flowEntry{start: f.t.vt, finish: f.t.vt + float64(f.q.head.cost)/f.t.weight,
		seq: f.seq, id: f.id}
}

// New returns a queue with no healthy upstream; call SetHealthy before
// expecting dispatches.
func New(cfg Config, clock Clock) (*Queue, error) {
	if clock == nil {
		clock = RealClock{}
	}
	q := &Queue{clock: clock, tenants: make(map[string]*tenant)}
	if err := q.Reconfigure(cfg); err != nil {
		return nil, err
	}
	return q, nil
}

// SetObserver installs fn to be told of every ticket event.
func (q *Queue) SetObserver(fn Observer) {
	q.mu.Lock()
	q.observer = fn
	q.mu.Unlock()
}

// Clock returns the queue's clock.
func (q *Queue) Clock() Clock { return q.clock }

// Config returns a copy of the current configuration.
func (q *Queue) Config() Config {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

// Reconfigure applies cfg while requests are queued and in flight: weights,
// caps, classes and capacity change; nothing queued or in flight is lost,
// dropped or dispatched twice. Queued requests above a lowered cap stay.
func (q *Queue) Reconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	q.mu.Lock()
	ov, err := newOverload(&cfg, q.ov)
	if err != nil {
		q.mu.Unlock()
		return err
	}
	q.cfg, q.ov = cfg, ov
	q.adm = newAdmission(&cfg.Admission, q.adm)
	for _, cl := range cfg.Classes {
		if q.class(cl.Name) == nil {
			q.classes = append(q.classes, &classQ{name: cl.Name})
		}
	}
	for name, t := range q.tenants {
		tc, known := cfg.Tenant(name)
		t.weight, t.known, t.cfg = tc.Weight, known, tc
	}
	// Finish tags depend on weights, so every heap is re-keyed.
	for _, cq := range q.classes {
		cq.flows.rebuild()
	}
	q.setCapacityLocked(q.healthy)
	q.applyPausesLocked()
	q.unlock()
	return nil
}

// SetHealthy sets the number of healthy upstreams; capacity follows at once.
func (q *Queue) SetHealthy(n int) {
	if n < 0 {
		n = 0
	}
	q.mu.Lock()
	if n != q.healthy {
		now := q.clock.Now()
		q.healthChangedLocked(now, n) // capacity, and early refusal's re-check
		q.dispatchLocked(now)
	}
	q.unlock()
}

func (q *Queue) setCapacityLocked(healthy int) {
	q.healthy = healthy
	q.capacity = q.cfg.MaxInflight * healthy
	q.tokenCap = q.cfg.MaxInflightTokens * int64(healthy)
}

// SetPaused makes a class yield (paused) or compete normally. A paused
// class is dispatched only when no unpaused class has a request waiting.
func (q *Queue) SetPaused(class string, paused bool) {
	q.mu.Lock()
	if cq := q.class(class); cq != nil && cq.paused != paused {
		cq.paused = paused
		q.dispatchLocked(q.clock.Now())
	}
	q.unlock()
}

func (q *Queue) class(name string) *classQ {
	for _, cq := range q.classes {
		if cq.name == name {
			return cq
		}
	}
	return nil
}

// Enqueue admits r or refuses it with a *Rejection. An admitted request may
// be dispatched before Enqueue returns. The caller must end the ticket with
// Release (or let Wait end it), exactly as the Ticket documents.
func (q *Queue) Enqueue(r Request) (*Ticket, error) {
	now := q.clock.Now()
	q.mu.Lock()
	// A known tenant carries its settings, so the hot path does one map
	// lookup, not one in the config and one in the state.
	t := q.tenants[r.Tenant]
	tc, known := q.cfg.Default, false
	if t != nil {
		tc, known = t.cfg, t.known
	} else {
		tc, known = q.cfg.Tenant(r.Tenant)
	}
	cls := r.Class
	if cls == "" || q.class(cls) == nil {
		cls = tc.Class
	}
	tokens := r.Cost
	if tokens < 1 {
		tokens = 1
	}
	cost := tokens
	if q.cfg.CostUnit == CostRequests {
		cost = 1
	}
	rej := q.admitLocked(t, tc, tokens)
	if rej == nil {
		rej = q.throttleLocked(now, cls, tokens)
	}
	if rej != nil {
		q.mu.Unlock()
		return nil, rej
	}
	if t == nil {
		t = &tenant{name: r.Tenant, weight: tc.Weight, known: known, cfg: tc}
		t.flows = t.flowBuf[:0]
		q.tenants[r.Tenant] = t
	}
	if t.queued == 0 {
		// Counter lift: an idle tenant rejoins at the current virtual time,
		// or where the service it really received puts it if that is later.
		if v := max(t.vt-t.credit, q.virtualTimeLocked()); v != t.vt || t.credit != 0 {
			t.vt, t.credit = v, 0
			q.fixFlows(t)
		}
	}
	cq := q.class(cls)
	decision, est := q.decideLocked(now, t, cq, cost, r.Deadline)
	if decision == budget.Reject {
		q.mu.Unlock()
		return nil, budgetRejection(est, r.Deadline.Sub(now))
	}
	tk := &Ticket{q: q, t: t, cost: cost, tokens: tokens, class: cls, deadline: r.Deadline,
		enqueued: now, dlIdx: -1, eta: est.ETA}
	q.pushFlow(tk, q.flowOf(t, cq))
	if !r.Deadline.IsZero() {
		q.deadlines.push(tk)
	}
	if decision == budget.Boost {
		q.promoteLocked(now, tk)
	}
	q.dispatchLocked(now)
	q.unlock()
	return tk, nil
}

func (q *Queue) admitLocked(t *tenant, tc TenantConfig, tokens int64) *Rejection {
	if q.capacity == 0 {
		return &Rejection{Reason: ReasonNoCapacity, RetryAfter: time.Second,
			Detail: "no healthy upstream"}
	}
	if tc.MaxQueue > 0 {
		if t != nil && t.queued >= tc.MaxQueue {
			return &Rejection{Reason: ReasonTenantQueueFull, RetryAfter: time.Second,
				Detail: fmt.Sprintf("tenant has %d requests queued (limit %d)", t.queued, tc.MaxQueue)}
		}
	}
	if q.cfg.MaxQueue > 0 && q.queued >= q.cfg.MaxQueue {
		return &Rejection{Reason: ReasonQueueFull, RetryAfter: time.Second,
			Detail: fmt.Sprintf("%d requests queued (limit %d)", q.queued, q.cfg.MaxQueue)}
	}
	if q.cfg.MaxQueueTokens > 0 && q.queued > 0 && q.queuedCost+tokens > q.cfg.MaxQueueTokens {
		return &Rejection{Reason: ReasonQueueFull, RetryAfter: time.Second,
			Detail: fmt.Sprintf("%d tokens queued (limit %d)", q.queuedCost, q.cfg.MaxQueueTokens)}
	}
	return nil
}

// virtualTimeLocked is V, the system's virtual time: the largest start tag
// dispatched so far. It never decreases, and lifting an arriving tenant to
// it is what a tenant that never left would have reached by now (the
// self-clocked rule of SCFQ, with the start rather than the finish tag so a
// newcomer is not put behind the request just dispatched).
func (q *Queue) virtualTimeLocked() float64 { return q.vfloor }

func (q *Queue) flowOf(t *tenant, cq *classQ) *flow {
	for _, f := range t.flows {
		if f.cq == cq {
			return f
		}
	}
	q.flowSeq++
	f := &flow{t: t, cq: cq, seq: q.flowSeq}
	f.id = cq.flows.newID(f)
	t.flows = append(t.flows, f)
	return f
}

func (q *Queue) pushFlow(tk *Ticket, f *flow) {
	tk.f = f
	tk.state = stateQueued
	tk.mark = f.in
	f.in += tk.cost
	f.queuedCost += tk.tokens
	f.q.pushBack(tk)
	if !f.cq.flows.contains(f.id) {
		f.drain = flowDrain{} // backlogged anew: an idle gap is no drain
		f.cq.flows.push(f)
	}
	tk.t.queued++
	tk.t.queuedCost += tk.tokens
	q.queued++
	q.queuedCost += tk.tokens
}

// unqueue takes a queued or boosted ticket out of wherever it waits.
func (q *Queue) unqueue(tk *Ticket) { q.take(tk, true) }

// take is unqueue; with rekey false, a flow whose head tk was and that stays
// backlogged is left for the caller to re-key (dispatch does, once, after
// charging the tenant).
func (q *Queue) take(tk *Ticket, rekey bool) {
	if tk.state == stateBoosted {
		q.boost.remove(tk)
		q.adm.boostCost -= tk.cost
	} else {
		f := tk.f
		wasHead := f.q.head == tk
		f.q.remove(tk)
		f.out += tk.cost
		f.queuedCost -= tk.tokens
		switch {
		case f.q.head == nil:
			f.cq.flows.remove(f)
		case wasHead && rekey:
			f.cq.flows.rekey(f)
		}
	}
	if tk.dlIdx >= 0 {
		q.deadlines.remove(tk)
	}
	tk.t.queued--
	tk.t.queuedCost -= tk.tokens
	q.queued--
	q.queuedCost -= tk.tokens
}

// fixFlows re-orders t's flows after its virtual time changed.
func (q *Queue) fixFlows(t *tenant) {
	for _, f := range t.flows {
		if f.cq.flows.contains(f.id) {
			f.cq.flows.rekey(f)
		}
	}
}

// next returns the ticket dispatch would start now, or nil, and whether it
// overtakes tag order from the boost lane. The lane goes first while
// boosted requests in flight are under the boost budget; past it, the lane
// waits for tag order to run dry rather than idle a slot, and such a
// dispatch overtakes nobody.
func (q *Queue) next() (*Ticket, bool) {
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
	if lane := q.boost.head; lane != nil {
		if best == nil {
			return lane, false
		}
		if q.boostRoomLocked() {
			return lane, true
		}
	}
	if best == nil {
		return nil, false
	}
	return best.flows.flow(best.flows.top()).q.head, false
}

// dispatchLocked starts requests while capacity allows: the work-conserving
// loop every state change ends with.
func (q *Queue) dispatchLocked(now time.Time) {
	q.dispatchLoop(now)
	// The throughput estimator counts completions only while a free slot
	// would be filled at once: the system's capacity, not its demand.
	q.adm.rate.SetBusy(now, q.queued > 0 || q.inflight >= q.capacity)
}

func (q *Queue) dispatchLoop(now time.Time) {
	for q.inflight < q.capacity {
		tk, overtakes := q.next()
		if tk == nil {
			return
		}
		if q.tokenCap > 0 && q.inflight > 0 && q.inflightCost+tk.tokens > q.tokenCap {
			return
		}
		expired := !tk.deadline.IsZero() && !now.Before(tk.deadline)
		// A dispatched ticket's flow is re-keyed once, by startLocked
		// after the charge, rather than also here for the new head.
		q.take(tk, expired)
		if expired {
			// Never dispatched after its deadline: the caller answers instead.
			q.finishLocked(tk, stateExpired, &Rejection{Reason: ReasonQueueTimeout,
				RetryAfter: time.Second, Detail: "wait budget ran out while queued"})
			continue
		}
		q.startLocked(tk, now, overtakes)
	}
}

func (q *Queue) startLocked(tk *Ticket, now time.Time, overtakes bool) {
	t := tk.t
	if overtakes {
		tk.boosted = true
		q.boostedInflight++
	}
	tk.state = stateInflight
	tk.dispatched = now
	q.adm.cold.Start(now, float64(tk.cost))
	q.inflight++
	q.inflightCost += tk.tokens
	t.inflight++
	if t.vt > q.vfloor {
		q.vfloor = t.vt
	}
	charge := float64(tk.cost) / t.weight
	if t.credit > 0 {
		// Refunds owed for earlier over-estimates are paid here, so the
		// start tag a newcomer was lifted to is never undercut.
		use := min(t.credit, charge)
		t.credit -= use
		charge -= use
	}
	t.vt += charge
	t.served += float64(tk.cost)
	q.fixFlows(t)
	tk.wake()
	q.emit(EventDispatched, tk)
}

// finishLocked ends a ticket that will never be dispatched.
func (q *Queue) finishLocked(tk *Ticket, st ticketState, err error) {
	tk.state = st
	tk.err = err
	tk.wake()
	if st == stateExpired {
		q.emit(EventExpired, tk)
	} else {
		q.emit(EventCancelled, tk)
	}
}

func (q *Queue) emit(ev Event, tk *Ticket) {
	if q.observer != nil {
		q.events = append(q.events, pendingEvent{ev, tk})
	}
}

// unlock releases the lock and then tells the observer what happened, so an
// observer may call back into the queue. Only one goroutine delivers at a
// time, draining batches until none is left, which keeps the events in the
// order they happened even when batches are produced on several goroutines
// or by the observer itself.
func (q *Queue) unlock() {
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

// Promote moves a queued ticket into the boost lane, ahead of tag order. It
// reports false when the ticket is no longer queued or already boosted.
func (q *Queue) Promote(tk *Ticket) bool {
	q.mu.Lock()
	if tk.state != stateQueued {
		q.mu.Unlock()
		return false
	}
	now := q.clock.Now()
	q.promoteLocked(now, tk)
	q.dispatchLocked(now)
	q.unlock()
	return true
}

// Tick expires queued tickets whose deadline is within ExpiryMargin and
// forgets idle tenants that carry no state worth keeping. Callers run it on
// a short period (the handler) or at event times (the simulator).
func (q *Queue) Tick() {
	now := q.clock.Now()
	q.mu.Lock()
	limit := now.Add(q.cfg.ExpiryMargin)
	for len(q.deadlines) > 0 && !q.deadlines[0].tk.deadline.After(limit) {
		tk := q.deadlines[0].tk
		q.unqueue(tk)
		q.finishLocked(tk, stateExpired, &Rejection{Reason: ReasonQueueTimeout,
			RetryAfter: time.Second, Detail: "wait budget ran out while queued"})
	}
	q.recheckLocked(now)
	q.refuseLocked(now)
	q.observeWaterLocked(now)
	if now.Sub(q.lastPrune) >= 10*time.Second {
		q.lastPrune = now
		q.pruneLocked()
	}
	// An expired head may have been what held the token gate closed.
	q.dispatchLocked(now)
	trs, obs := q.transitions, q.degradeObserver
	q.transitions = nil
	q.unlock()
	for _, tr := range trs {
		obs(tr)
	}
}

// pruneLocked drops idle tenants whose virtual time is at or below V: the
// counter lift would give them V on return anyway, so forgetting them loses
// nothing and keeps memory bounded by active tenants.
func (q *Queue) pruneLocked() {
	v := q.virtualTimeLocked()
	for name, t := range q.tenants {
		if t.queued == 0 && t.inflight == 0 && t.vt-t.credit <= v {
			for _, f := range t.flows {
				f.cq.flows.freeID(f.id)
			}
			delete(q.tenants, name)
		}
	}
}

// release ends tk as its owner asked: a queued ticket is cancelled, a
// dispatched one completes with its actual cost.
func (q *Queue) release(tk *Ticket, actual int64) {
	q.mu.Lock()
	switch tk.state {
	case stateQueued, stateBoosted:
		q.unqueue(tk)
		q.finishLocked(tk, stateCancelled, &Rejection{Reason: ReasonCancelled,
			Detail: "request cancelled while queued"})
		// The cancelled ticket may have been the head that did not fit the
		// free token capacity; what follows it may fit.
		q.dispatchLocked(q.clock.Now())
	case stateInflight:
		q.completeLocked(tk, actual)
	}
	q.unlock()
}

func (q *Queue) completeLocked(tk *Ticket, actual int64) {
	t := tk.t
	now := q.clock.Now()
	q.adm.rate.Observe(now, float64(tk.cost), q.healthy)
	q.adm.cold.Finish(now, tk.dispatched, float64(tk.cost))
	tk.state = stateReleased
	tk.actual = actual
	q.inflight--
	q.inflightCost -= tk.tokens
	t.inflight--
	if tk.boosted {
		q.boostedInflight--
	}
	if actual >= 0 && q.cfg.CostUnit == CostTokens && actual != tk.cost {
		// Back-fill. Over-estimates are refunded through credit rather than
		// by moving vt back: lowering vt now would let this tenant undercut
		// the start tag a newcomer was lifted to while vt still held the
		// estimate, and the small newcomer would lose its next-slot turn.
		d := float64(actual - tk.cost)
		t.served += d
		if dv := d / t.weight; dv < 0 {
			t.credit -= dv
		} else {
			use := min(t.credit, dv)
			t.credit -= use
			if dv > use {
				t.vt += dv - use
				q.fixFlows(t)
			}
		}
	}
	q.emit(EventReleased, tk)
	q.dispatchLocked(q.clock.Now())
}
