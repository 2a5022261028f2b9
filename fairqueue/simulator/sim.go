package simulator

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Epoch is the virtual start of every run.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// State is where a request ended up.
type State uint8

// Request states.
const (
	StateNone State = iota
	StateQueued
	StateInflight
	StateCompleted
	StateExpired
	StateRejected
)

// Record is what one run did with one request. Times are virtual, since
// the start of the run.
type Record struct {
	State    State
	Dispatch time.Duration
	Complete time.Duration
	// Left is when the request left the queue: dispatched or expired.
	Left time.Duration
	// Limit and OrderLimit are the slot-free and in-order limits (see the
	// package doc).
	Limit, OrderLimit time.Duration

	// Reason says why a rejected or expired request was not dispatched.
	Reason fairqueue.Reason
	// Fallback reports a dispatch to the fallback channel.
	Fallback bool
	// Queued reports that the request was not dispatched inside Submit.
	Queued bool
	// Predicted is the wait predicted at admission (Ticket.ETA, or the
	// ETA a fast-fail states); HasPrediction says there is one.
	Predicted     time.Duration
	HasPrediction bool
	// Boosted reports a dispatch from the boost lane.
	Boosted bool
	// Light reports that light mode trimmed the request (Request holds
	// the trimmed sizes).
	Light bool
	// WhileQueued reports a fast-fail made from the queue, after
	// admission; Left is when.
	WhileQueued bool
}

// Wait is the time from arrival until dispatch (or expiry).
func (rec *Record) Wait(r *Request) time.Duration { return rec.Left - r.Arrival }

// Served reports that the request was dispatched: in flight or completed.
func (rec *Record) Served() bool { return rec.State == StateInflight || rec.State == StateCompleted }

// event kinds, in the order they are processed when their times are equal:
// a completion frees its slot before anything else happens at that
// instant, a capacity change applies before arrivals see it, and ticks
// come last so they observe the instant's final state.
const (
	evComplete = iota
	evHealth
	evArrival
	evTick
	evExhaust
)

// Sample is the degrade state at one instant of a run.
type Sample struct {
	At     time.Duration
	Water  float64
	Level  int
	Queued int
}

type event struct {
	at   time.Duration
	kind int
	// seq breaks ties in creation order: an open-loop arrival's request
	// ID, else len(open-loop) + a counter.
	seq uint64
	arg int
}

func (a event) less(b event) bool {
	return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.seq, b.seq)) < 0
}

// limitEntry waits for the target-th freed slot to set a request's Limit
// (with order, its OrderLimit).
type limitEntry struct {
	target uint64
	id     int
	order  bool
}

func (e limitEntry) less(o limitEntry) bool {
	return cmp.Or(cmp.Compare(e.target, o.target), cmp.Compare(e.id, o.id)) < 0
}

// interval is a half-open span of virtual time.
type interval struct{ from, to time.Duration }

type sim struct {
	sc    *Scenario
	w     *Workload
	clock *fairqueue.ManualClock
	sched Scheduler

	now    time.Duration
	events minHeap[event]
	seq    uint64
	open   int // next open-loop request to arrive

	reqs []Request
	recs []Record

	capacity     int
	inflight     int
	queued       int
	tenantQueued []int
	// served is each tenant's service: the estimate at dispatch, corrected
	// to the actual cost at completion, so every policy is measured alike.
	served []float64

	freed  uint64 // slots freed so far
	limits minHeap[limitEntry]

	tickPending  bool
	inContention bool
	contendFrom  time.Duration
	contended    []interval

	closed []*rand.Rand // each closed-loop tenant's stream, else nil
	diff   *diffTracker

	violations []string
	nViolation int
	mayIdle    bool
	fbInflight int // on the fallback channel

	budgets bool             // deadlines are enforced
	eng     *engineScheduler // nil for a baseline
	ladder  bool             // eng has a degrade ladder
	// boostLimit is the boost budget at the current capacity;
	// boostedAtDrop the boosted requests in flight when it last shrank,
	// which may exceed the new limit until they complete.
	boostLimit    int
	boostedAtDrop int
	maxBoosted    int
	boostViol     int
	timeline      []Sample
}

// Run replays w under p and measures it. Scheduler misbehaviour is not an
// error but listed in Result.Violations.
func Run(w *Workload, p Policy) (*Result, error) {
	sc := w.Scenario
	s := &sim{
		sc:           sc,
		w:            w,
		clock:        fairqueue.NewManualClock(Epoch),
		reqs:         append([]Request(nil), w.Requests...),
		recs:         make([]Record, len(w.Requests)),
		tenantQueued: make([]int, len(sc.Tenants)),
		served:       make([]float64, len(sc.Tenants)),
		closed:       make([]*rand.Rand, len(sc.Tenants)),
		diff:         newDiffTracker(sc),
	}
	sched, err := p.New(sc, s.clock, s)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", p.Name(), err)
	}
	s.sched = sched
	if e, ok := sched.(*engineScheduler); ok {
		s.eng, s.mayIdle, s.ladder = e, e.mayIdle, e.ladder
	}
	ep, _ := p.(EnginePolicy)
	s.budgets = sc.EnforceBudgets || ep.Budgets
	s.setHealthy(sc.Upstreams)
	for _, h := range sc.Health {
		s.push(event{at: h.At, kind: evHealth, arg: h.Healthy})
	}
	for i, x := range sc.Exhausted {
		s.push(event{at: x.At, kind: evExhaust, arg: i})
	}
	for i, t := range sc.Tenants {
		if t.Arrivals.Kind == ArrivalBacklogged {
			s.closed[i] = stream(w.Seed, t.Name)
			for k := 0; k < t.Arrivals.Queue; k++ {
				s.arriveClosed(i, t.Arrivals.Start)
			}
		}
	}
	s.loop()
	if s.eng != nil && s.eng.err != nil {
		s.violate("%v", s.eng.err)
	}
	return s.result(p.Name()), nil
}

func (s *sim) push(e event) {
	s.seq++
	e.seq = uint64(len(s.w.Requests)) + s.seq
	s.events.push(e)
}

// next pops the earliest event: the top of the heap or the next open-loop
// arrival (kept off the heap so 100k arrivals cost nothing until then).
func (s *sim) next() (event, bool) {
	var arr event
	haveArr := s.open < len(s.w.Requests)
	if haveArr {
		r := &s.w.Requests[s.open]
		arr = event{at: r.Arrival, kind: evArrival, seq: uint64(r.ID), arg: r.ID}
	}
	switch {
	case len(s.events) > 0 && (!haveArr || s.events[0].less(arr)):
		return s.events.pop(), true
	case haveArr:
		s.open++
		return arr, true
	}
	return event{}, false
}

func (s *sim) loop() {
	for {
		ev, ok := s.next()
		if !ok {
			break
		}
		s.now = ev.at
		s.clock.Set(Epoch.Add(ev.at))
		switch ev.kind {
		case evComplete:
			s.complete(ev.arg)
		case evHealth:
			s.setHealthy(ev.arg)
		case evArrival:
			s.arrive(ev.arg)
		case evExhaust:
			if s.eng != nil {
				s.eng.q.AccountExhausted(Epoch.Add(s.now + s.sc.Exhausted[ev.arg].For))
			}
		case evTick:
			s.tickPending = false
			s.sched.Tick()
			if s.ladder && s.now%time.Second == 0 {
				s.sample()
			}
		}
		s.afterEvent()
	}
	if s.inContention {
		s.contended = append(s.contended, interval{s.contendFrom, s.now})
	}
	if s.queued > 0 || s.inflight > 0 {
		s.violate("run ended with %d queued and %d in flight", s.queued, s.inflight)
	}
}

// afterEvent checks work conservation, tracks contention and keeps the
// tick going while there is work (only then: idle gaps cost nothing).
func (s *sim) afterEvent() {
	if s.queued > 0 && s.inflight < s.capacity && !s.mayIdle {
		s.violate("t=%v: %d queued but only %d of %d slots busy", s.now, s.queued, s.inflight, s.capacity)
	}
	switch {
	case s.queued > 0 && !s.inContention:
		s.inContention, s.contendFrom = true, s.now
	case s.queued == 0 && s.inContention:
		s.inContention = false
		s.contended = append(s.contended, interval{s.contendFrom, s.now})
	}
	// With a ladder, ticks go on while it is engaged: the ladder releases
	// only on an observation.
	if !s.tickPending && (s.queued > 0 || s.inflight > 0 || s.ladder && s.eng.q.DegradeLevel() > 0) {
		p := s.sc.tickPeriod()
		s.tickPending = true
		s.push(event{at: (s.now/p + 1) * p, kind: evTick})
	}
}

func (s *sim) violate(format string, args ...any) {
	s.nViolation++
	if len(s.violations) < 20 {
		s.violations = append(s.violations, fmt.Sprintf(format, args...))
	}
}

// Now implements Env.
func (s *sim) Now() time.Duration { return s.now }

func (s *sim) sample() {
	s.timeline = append(s.timeline, Sample{At: s.now, Water: s.eng.q.Water(), Level: s.eng.q.DegradeLevel(), Queued: s.queued})
}

func (s *sim) setHealthy(n int) {
	old := s.capacity
	s.capacity = n * s.sc.Slots
	if free := s.capacity - max(old, s.inflight); free > 0 {
		s.slotsFreed(free)
	}
	if s.eng != nil {
		if s.capacity < old {
			s.boostedAtDrop = s.eng.boostedInflight()
		}
		s.boostLimit = s.eng.boosts.Limit(s.capacity)
	}
	s.sched.SetHealthy(n)
}

// slotsFreed records n freed slots and resolves the limits they complete.
func (s *sim) slotsFreed(n int) {
	s.freed += uint64(n)
	for len(s.limits) > 0 && s.limits[0].target <= s.freed {
		e := s.limits.pop()
		rec := &s.recs[e.id]
		if e.order {
			rec.OrderLimit = s.now - s.reqs[e.id].Arrival
		} else {
			rec.Limit = s.now - s.reqs[e.id].Arrival
		}
	}
}

func (s *sim) arriveClosed(tenant int, at time.Duration) {
	t := &s.sc.Tenants[tenant]
	p, m, o := t.sizes(s.closed[tenant], nil)
	id := len(s.reqs)
	s.reqs = append(s.reqs, Request{ID: id, Tenant: tenant, Arrival: at, Prompt: p, MaxTokens: m, Output: o})
	s.recs = append(s.recs, Record{})
	s.push(event{at: at, kind: evArrival, arg: id})
}

func (s *sim) arrive(id int) {
	if s.ladder {
		if a, ok := s.eng.q.LightMode(s.eng.classes[s.reqs[id].Tenant]); ok {
			trim(&s.reqs[id], a)
			s.recs[id].Light = true
		}
	}
	r := s.reqs[id]
	rec := &s.recs[id]
	rec.State = StateQueued
	if s.inflight >= s.capacity {
		q := uint64(s.tenantQueued[r.Tenant])
		s.limits.push(limitEntry{target: s.freed + 1, id: id})
		s.limits.push(limitEntry{target: s.freed + q + 1, id: id, order: true})
	}
	s.addQueued(r.Tenant, 1)
	j := Job{ID: id, Tenant: r.Tenant, Estimate: r.Estimate(), Prompt: r.Prompt}
	if s.budgets {
		if b := s.sc.Budget(r.Tenant); b > 0 {
			j.Deadline = r.Arrival + b
		}
	}
	if err := s.sched.Submit(j); err != nil {
		s.rejected(id, err)
		return
	}
	// Submit may have grown s.recs (a closed-loop refill on dispatch).
	rec = &s.recs[id]
	rec.Queued = rec.State == StateQueued
	if s.eng != nil && rec.Queued {
		// Read at once: a later re-check replaces the ticket's ETA.
		if eta, ok := s.eng.prediction(id); ok && eta > 0 {
			rec.Predicted, rec.HasPrediction = eta, true
		}
	}
}

// rejected records the refusal of request id at admission.
func (s *sim) rejected(id int, err error) {
	rec := &s.recs[id]
	rec.State, rec.Left, rec.Reason = StateRejected, s.now, fairqueue.ReasonNoCapacity
	var rej *fairqueue.Rejection
	if errors.As(err, &rej) {
		rec.Reason = rej.Reason
		if eta, ok := refusalETA(rej); ok {
			rec.Predicted, rec.HasPrediction = eta, true
		}
	}
	s.addQueued(s.reqs[id].Tenant, -1)
}

// refusalETA reads the predicted wait out of a fast-fail's detail
// ("estimated wait 5m31.2s, budget 5m0s"): the Rejection has no field for it.
func refusalETA(rej *fairqueue.Rejection) (time.Duration, bool) {
	const key = "estimated wait "
	if rej.Reason != fairqueue.ReasonBudgetExceeded {
		return 0, false
	}
	i := strings.Index(rej.Detail, key)
	if i < 0 {
		return 0, false
	}
	v := rej.Detail[i+len(key):]
	if j := strings.IndexByte(v, ','); j >= 0 {
		v = v[:j]
	}
	d, err := time.ParseDuration(v)
	return d, err == nil
}

// trim applies a light-mode action to a request; the output is cut with
// max_tokens, so both the estimate and the service time drop.
func trim(r *Request, a degrade.Action) {
	if n := int64(a.MaxInputTokens); n > 0 && r.Prompt > n {
		r.Prompt = n
	}
	if n := int64(a.MaxTokens); n > 0 && r.MaxTokens > n {
		r.MaxTokens = n
		r.Output = min(r.Output, n)
	}
}

// Dispatched implements Env: schedule the completion.
func (s *sim) Dispatched(id int) {
	if !s.dispatch(id, false) {
		return
	}
	s.inflight++
	if s.inflight > s.capacity {
		s.violate("t=%v: %d in flight exceeds capacity %d", s.now, s.inflight, s.capacity)
	}
	if s.eng != nil {
		s.checkBoost(id)
	}
	s.started(id)
}

// dispatch marks a queued request dispatched; false, and a violation, if
// it was not queued.
func (s *sim) dispatch(id int, fallback bool) bool {
	rec := &s.recs[id]
	if rec.State != StateQueued {
		s.violate("t=%v: request %d dispatched in state %d", s.now, id, rec.State)
		return false
	}
	rec.State, rec.Dispatch, rec.Left, rec.Fallback = StateInflight, s.now, s.now, fallback
	return true
}

// started accounts a dispatched request's service and schedules its
// completion.
func (s *sim) started(id int) {
	r := &s.reqs[id]
	s.served[r.Tenant] += float64(r.Estimate())
	// Sample while the tenant still counts as backlogged: the request
	// being dispatched was queued until this instant.
	s.diff.sample(r.Tenant, s.served)
	s.addQueued(r.Tenant, -1)
	s.push(event{at: s.now + r.Service(), kind: evComplete, arg: id})
	s.refill(r.Tenant)
}

// DispatchedFallback implements Env.
func (s *sim) DispatchedFallback(id int) {
	if !s.dispatch(id, true) {
		return
	}
	s.fbInflight++
	if s.sc.Fallback == nil || s.fbInflight > s.sc.Fallback.Slots {
		s.violate("t=%v: %d in flight on the fallback, more than its slots", s.now, s.fbInflight)
	}
	s.started(id)
}

// checkBoost records whether id was boosted and checks the boost budget.
func (s *sim) checkBoost(id int) {
	rec := &s.recs[id]
	rec.Boosted = s.eng.boosted(id)
	b := s.eng.boostedInflight()
	s.maxBoosted = max(s.maxBoosted, b)
	if b > s.boostLimit && (rec.Boosted || b > s.boostedAtDrop) {
		s.boostViol++
		s.violate("t=%v: %d boosted in flight exceeds the boost budget %d at capacity %d", s.now, b, s.boostLimit, s.capacity)
	}
	if b <= s.boostLimit {
		s.boostedAtDrop = 0
	}
}

// Expired implements Env.
func (s *sim) Expired(id int, reason fairqueue.Reason) {
	rec := &s.recs[id]
	if rec.State != StateQueued {
		s.violate("t=%v: request %d expired in state %d", s.now, id, rec.State)
		return
	}
	rec.State, rec.Left, rec.Reason = StateExpired, s.now, reason
	if reason == fairqueue.ReasonBudgetExceeded {
		// Refused from the queue: told, not starved.
		rec.State, rec.WhileQueued = StateRejected, true
	}
	s.addQueued(s.reqs[id].Tenant, -1)
	s.refill(s.reqs[id].Tenant)
}

// refill keeps a closed-loop tenant's queue full: the next request arrives
// the instant one leaves the queue.
func (s *sim) refill(tenant int) {
	if s.closed[tenant] != nil && s.now < s.sc.Duration {
		s.arriveClosed(tenant, s.now)
	}
}

func (s *sim) complete(id int) {
	rec := &s.recs[id]
	r := &s.reqs[id]
	rec.State, rec.Complete = StateCompleted, s.now
	s.served[r.Tenant] += float64(r.Actual() - r.Estimate())
	if rec.Fallback {
		s.fbInflight--
	} else {
		s.inflight--
		if s.inflight < s.capacity {
			s.slotsFreed(1)
		}
	}
	s.sched.Complete(id, r.Actual())
}

func (s *sim) addQueued(tenant, d int) {
	before := s.tenantQueued[tenant]
	s.tenantQueued[tenant] += d
	s.queued += d
	switch {
	case before == 0 && d > 0:
		s.diff.join(tenant)
	case before > 0 && s.tenantQueued[tenant] == 0:
		s.diff.leave(tenant)
	}
}

// diffTracker measures the max service diff (see the package doc): for
// each pair of equal-weight tenants and each period both stay backlogged,
// it tracks D = served_i - served_j at every dispatch of either and keeps
// the largest max(D) - min(D). Groups above maxDiffGroup are left out
// (O(group) per dispatch).
type diffTracker struct {
	group   []int   // tenant -> index of its weight group
	back    [][]int // group -> backlogged tenants
	pos     []int   // tenant -> position in back[group], -1 if not backlogged
	epoch   []uint32
	pairs   map[[2]int]pairState
	max     float64
	tracked bool // some group qualifies
}

type pairState struct {
	ei, ej   uint32
	min, max float64
}

func newDiffTracker(sc *Scenario) *diffTracker {
	d := &diffTracker{group: make([]int, len(sc.Tenants)), pos: make([]int, len(sc.Tenants)),
		epoch: make([]uint32, len(sc.Tenants)), pairs: map[[2]int]pairState{}}
	size := map[float64]int{}
	for _, t := range sc.Tenants {
		size[t.Weight]++
	}
	byWeight := map[float64]int{}
	for i, t := range sc.Tenants {
		d.pos[i] = -1
		if n := size[t.Weight]; n < 2 || n > maxDiffGroup {
			d.group[i] = -1
			continue
		}
		d.tracked = true
		g, ok := byWeight[t.Weight]
		if !ok {
			g = len(d.back)
			byWeight[t.Weight] = g
			d.back = append(d.back, nil)
		}
		d.group[i] = g
	}
	return d
}

// maxDiffGroup is the largest weight group whose pairs are tracked.
const maxDiffGroup = 64

func (d *diffTracker) join(t int) {
	d.epoch[t]++
	g := d.group[t]
	if g < 0 {
		return
	}
	d.pos[t] = len(d.back[g])
	d.back[g] = append(d.back[g], t)
}

func (d *diffTracker) leave(t int) {
	g := d.group[t]
	if g < 0 {
		return
	}
	b := d.back[g]
	i, last := d.pos[t], len(b)-1
	b[i] = b[last]
	d.pos[b[i]] = i
	d.back[g] = b[:last]
	d.pos[t] = -1
}

func (d *diffTracker) sample(t int, served []float64) {
	if d.group[t] < 0 {
		return
	}
	for _, o := range d.back[d.group[t]] {
		if o == t {
			continue
		}
		i, j := min(t, o), max(t, o)
		D := served[i] - served[j]
		ps, ok := d.pairs[[2]int{i, j}]
		if !ok || ps.ei != d.epoch[i] || ps.ej != d.epoch[j] {
			// A new joint-backlog period: earlier service does not count.
			ps = pairState{ei: d.epoch[i], ej: d.epoch[j], min: D, max: D}
		}
		ps.min, ps.max = min(ps.min, D), max(ps.max, D)
		d.pairs[[2]int{i, j}] = ps
		d.max = max(d.max, ps.max-ps.min)
	}
}
