package fairqueue

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// Tiered circuit breaking (degrade.Circuit) as the queue applies it.
// Demand is measured per resource in units whose capacity does not swing
// with the mix of requests: slots (busy time), inflight_tokens (tokens times
// busy time), account_tokens and account_requests. Every request that
// reaches Enqueue counts, refused ones included. A tier is shed only when
// the upstreams were saturated for most of the window: demand over the line
// while capacity idles is a wrong estimate, not overload.

// The circuit's resources, by name (metrics label them so).
const (
	ResourceSlots           = "slots"
	ResourceInflightTokens  = "inflight_tokens"
	ResourceAccountTokens   = "account_tokens"
	ResourceAccountRequests = "account_requests"
)

// serviceAlpha and serviceAlphaQueue are the weights of one completion in
// a caller's and the queue's mean busy time: a caller's mean follows its
// last few dozen requests, the queue's a few hundred.
const (
	serviceAlpha      = 1.0 / 16
	serviceAlphaQueue = 1.0 / 64
)

// CircuitEvent is one circuit transition as the queue reports it: when a
// tier was shed, with the callers of that tier that were sending, the
// largest first (the alert's "who tripped it and by how much").
type CircuitEvent struct {
	degrade.CircuitTransition
	// BacklogTrend is how fast the queued requests grew over the
	// circuit's window, requests per second (negative: shrinking).
	BacklogTrend float64
	Callers      []CircuitCaller
}

// CircuitCaller is one shed caller's demand at the moment its tier was
// shed.
type CircuitCaller struct {
	Tenant string
	// Demand is the caller's arriving busy time per second (slot-seconds
	// per second: how many slots it would keep busy), averaged over the
	// circuit's window.
	Demand float64
	// Share is Demand over the slots.
	Share float64
	// JointOccupancy is the caller's arriving request-equivalents per
	// second over its quota's joint rate (qps x joint_cap): 1 is exactly
	// its quota. 0 when it has no joint quota.
	JointOccupancy float64
}

// maxCircuitCallers bounds the callers one event names.
const maxCircuitCallers = 10

// newCircuit builds cfg's circuit, measuring demand in the resources cfg
// has, and carries old's state over.
func newCircuit(cfg *Config, old *degrade.Circuit) (*degrade.Circuit, error) {
	if cfg.Circuit == nil {
		return nil, nil
	}
	res := []string{ResourceSlots}
	if cfg.MaxInflightTokens > 0 {
		res = append(res, ResourceInflightTokens)
	}
	if u := cfg.UpstreamQuota; u != nil {
		if u.TPM > 0 {
			res = append(res, ResourceAccountTokens)
		}
		if u.RPM > 0 {
			res = append(res, ResourceAccountRequests)
		}
	}
	c, err := degrade.NewCircuit(*cfg.Circuit, res...)
	if err != nil {
		return nil, err
	}
	if old != nil {
		c.Carry(old)
	}
	return c, nil
}

// circuitLocked counts a request's demand and refuses it if its tier is
// shed. t is nil for a tenant the queue does not remember.
func (q *Queue) circuitLocked(now time.Time, t *tenant, tc *TenantConfig, name string, tokens int64) *Rejection {
	c := q.circuit
	busy := q.serviceTimeLocked(q.serviceOwnerLocked(t, name))
	units := q.circuitUnits[:0]
	for _, r := range q.circuitRes {
		switch r {
		case ResourceSlots:
			units = append(units, busy)
		case ResourceInflightTokens:
			units = append(units, busy*float64(tokens))
		case ResourceAccountTokens:
			units = append(units, float64(tokens))
		case ResourceAccountRequests:
			units = append(units, 1)
		}
	}
	q.circuitUnits = units
	c.Arrive(now, tc.Tier, units...)
	if t != nil {
		t.observeDemand(now, c.Config().Window, busy, tokens)
	}
	if tc.Tier == "" || !c.Shed(tc.Tier) {
		return nil
	}
	wait := max(c.ReadmitIn(now, tc.Tier), c.Config().Hold)
	return &Rejection{Reason: ReasonCircuitOpen, RetryAfter: q.retryAfterLocked(wait),
		Detail: fmt.Sprintf("tier %s is shed while demand exceeds %.2fx what the model servers serve and they are saturated", tc.Tier, c.Config().Trigger)}
}

// serviceOwnerLocked is whose mean busy time prices a request of tenant
// name (state t, nil when none): the tenant, or the group for an undeclared
// one; nil for a declared tenant the queue does not remember.
func (q *Queue) serviceOwnerLocked(t *tenant, name string) *tenant {
	if t != nil {
		if t.group != nil {
			return t.group
		}
		return t
	}
	if _, declared := q.declared[name]; !declared {
		return q.group
	}
	return nil
}

// serviceTimeLocked is the busy time a request of owner is expected to
// take, in seconds: owner's mean, else the queue's, else 0 (nothing has
// completed yet).
func (q *Queue) serviceTimeLocked(owner *tenant) float64 {
	if owner != nil && owner.demand != nil && owner.demand.busyW > 0 {
		return owner.demand.busySum / owner.demand.busyW
	}
	if q.busyW > 0 {
		return q.busySum / q.busyW
	}
	return 0
}

// noteServiceLocked adds a completed request's busy time to its owner's
// and the queue's means (kept only with a circuit).
func (q *Queue) noteServiceLocked(tk *Ticket, now time.Time) {
	busy := now.Sub(tk.dispatchedLocked()).Seconds()
	if !(busy >= 0) {
		return
	}
	q.busySum = q.busySum*(1-serviceAlphaQueue) + busy
	q.busyW = q.busyW*(1-serviceAlphaQueue) + 1
	d := q.serviceOwnerLocked(tk.t, "").demandLocked()
	d.busySum = d.busySum*(1-serviceAlpha) + busy
	d.busyW = d.busyW*(1-serviceAlpha) + 1
}

// observeDemand adds a request to the tenant's arriving rates: an
// exponential average with the circuit's window as time constant, kept
// only while a circuit is configured.
func (t *tenant) observeDemand(now time.Time, window time.Duration, busy float64, tokens int64) {
	dm := t.demandLocked()
	ns := now.UnixNano()
	tau := float64(window)
	if dm.at != 0 && ns > dm.at {
		decay := math.Exp(-float64(ns-dm.at) / tau)
		dm.busy *= decay
		dm.reqs *= decay
		dm.tokens *= decay
	}
	dm.at = max(dm.at, ns)
	// Each arrival adds 1/tau per second of its units: a steady stream of
	// r per second converges to r.
	dm.busy += busy * 1e9 / tau
	dm.reqs += 1e9 / tau
	dm.tokens += float64(tokens) * 1e9 / tau
}

// tenantDemand is what only some tenants need: the arriving busy time,
// requests and tokens per second, decayed from at (Unix ns); the mean busy
// time of an owner's completions (serviceOwnerLocked); a quota's ratio
// (quotaRatio); and the times booked on its quota, earliest first
// (gate.go).
type tenantDemand struct {
	at                 int64
	busy, reqs, tokens float64
	busySum, busyW     float64
	estSum, actSum     float64
	estN               int
	bookings           []int64
}

// demandLocked returns t's demand, making it on first use.
func (t *tenant) demandLocked() *tenantDemand {
	if t.demand == nil {
		t.demand = &tenantDemand{}
	}
	return t.demand
}

// demandAtLocked is t's arriving rates decayed to now.
func (t *tenant) demandAtLocked(now time.Time, window time.Duration) (busy, reqs, tokens float64) {
	dm := t.demand
	if dm == nil || dm.at == 0 {
		return 0, 0, 0
	}
	d := math.Exp(-float64(max(now.UnixNano()-dm.at, 0)) / float64(window))
	return dm.busy * d, dm.reqs * d, dm.tokens * d
}

// circuitCapacityLocked fills the capacity of each of the circuit's
// resources, in its units per second; 0 is no data (no transition on it).
func (q *Queue) circuitCapacityLocked() []float64 {
	caps := q.circuitCaps[:0]
	for _, r := range q.circuitRes {
		v := 0.0
		switch r {
		case ResourceSlots:
			v = float64(q.capacity)
		case ResourceInflightTokens:
			v = float64(q.tokenCap)
		case ResourceAccountTokens:
			if q.up != nil {
				v = q.up.tokensPerSec
			}
		case ResourceAccountRequests:
			if q.up != nil {
				v = q.up.requestsPerSec
			}
		}
		caps = append(caps, v)
	}
	q.circuitCaps = caps
	return caps
}

// noteSaturationLocked tells the circuit, on a change, whether the
// upstreams are saturated with requests waiting: busy (every slot taken,
// or a gate holding dispatch with a slot free) and something queued.
func (q *Queue) noteSaturationLocked(now time.Time, busy bool) {
	sat := busy && q.queued > 0
	if !q.satTold || sat != q.satWas {
		q.circuit.Saturated(now, sat)
		q.satTold, q.satWas = true, sat
	}
}

// backlogMarks keeps the queued count at most every Window/10 over the
// circuit's window, for the backlog trend.
type backlogMarks struct {
	at     [11]int64 // Unix ns; 0: empty
	queued [11]int
	n      int // marks taken; the latest at (n-1) % 11
}

// mark takes a mark of queued at now when a tenth of the window has
// passed since the last.
func (m *backlogMarks) mark(now time.Time, window time.Duration, queued int) {
	ns := now.UnixNano()
	if m.n > 0 && ns-m.at[(m.n-1)%len(m.at)] < int64(window/10) {
		return
	}
	k := m.n % len(m.at)
	m.at[k], m.queued[k] = ns, queued
	m.n++
}

// backlogTrendLocked is the change of the queued requests per second
// since the oldest mark (about a window ago); 0 without one.
func (q *Queue) backlogTrendLocked(now time.Time) float64 {
	m := &q.backlog
	if m.n == 0 {
		return 0
	}
	k := 0
	if m.n >= len(m.at) {
		k = m.n % len(m.at)
	}
	dt := float64(now.UnixNano()-m.at[k]) / 1e9
	if dt <= 0 {
		return 0
	}
	return float64(q.queued-m.queued[k]) / dt
}

// observeCircuitLocked moves the circuit on the tick and queues its events
// for delivery after the lock is released.
func (q *Queue) observeCircuitLocked(now time.Time) {
	if q.circuit == nil {
		return
	}
	q.backlog.mark(now, q.circuit.Config().Window, q.queued)
	caps := q.circuitCapacityLocked()
	for _, tr := range q.circuit.Observe(now, caps...) {
		ev := CircuitEvent{CircuitTransition: tr, BacklogTrend: q.backlogTrendLocked(now)}
		if tr.Up {
			ev.Callers = q.shedCallersLocked(now, tr.Tier, caps[0])
		}
		q.circuitEvents = append(q.circuitEvents, ev)
	}
}

// shedCallersLocked lists the tenants of tier that were sending, the
// largest demand first: O(tenants), at a shed only.
func (q *Queue) shedCallersLocked(now time.Time, tier string, slots float64) []CircuitCaller {
	window := q.circuit.Config().Window
	var out []CircuitCaller
	for _, t := range q.tenants {
		if t.cfg.Tier != tier {
			continue
		}
		busy, reqs, tokens := t.demandAtLocked(now, window)
		if reqs <= 0 {
			continue
		}
		c := CircuitCaller{Tenant: t.name, Demand: busy}
		if slots > 0 {
			c.Share = busy / slots
		}
		if l := t.cfg.Quota; l != nil && l.Config().JointCap > 0 {
			qc := l.Config()
			c.JointOccupancy = (reqs + tokens*qc.TokenToQPSWeight) / (qc.QPS * qc.JointCap)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b CircuitCaller) int { return cmp.Compare(b.Demand, a.Demand) })
	if len(out) > maxCircuitCallers {
		out = out[:maxCircuitCallers]
	}
	return out
}

// CircuitState is the circuit's state for metrics and reports.
type CircuitState struct {
	// Configured is false when the queue has no circuit; the rest is zero.
	Configured bool
	Level      int
	Tiers      []string
	Shed       []bool
	// Demand is each tier's arriving busy time per second, slot-seconds
	// (Tiers' order); Tierless is the demand of tenants without a tier.
	Demand   []float64
	Tierless float64
	// Capacity is the slots: slot-seconds per second.
	Capacity float64
	// Resources lists every resource demand is measured in (slots first);
	// ResourceDemand[r][i] is tier i's demand on resource r, in its units
	// per second (the last entry, one past the tiers, is the tier-less
	// demand), and ResourceCapacity[r] its capacity.
	Resources        []string
	ResourceDemand   [][]float64
	ResourceCapacity []float64
	// Signals is, for each tier but the top, what the circuit compares
	// with its lines: the largest over the resources of the demand of the
	// tier, the tiers above it and tier-less tenants, over capacity.
	Signals []float64
	// Saturation is the share of the window during which the upstreams
	// were saturated with requests waiting; a tier is shed only above the
	// configured share.
	Saturation float64
	// BacklogTrend is the queued requests' growth over the window, per
	// second.
	BacklogTrend float64
}

// Circuit returns the circuit's state.
func (q *Queue) Circuit() CircuitState {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.circuit
	if c == nil {
		return CircuitState{}
	}
	now := q.clock.Now()
	caps := slices.Clone(q.circuitCapacityLocked())
	st := CircuitState{Configured: true, Level: c.Level(), Tiers: c.Tiers(), Resources: c.Resources(),
		ResourceCapacity: caps, Capacity: caps[0], Saturation: c.Saturation(now),
		Signals: c.Signals(now, caps...), BacklogTrend: q.backlogTrendLocked(now)}
	for r := range st.Resources {
		per, tierless, _ := c.Demand(now, r)
		st.ResourceDemand = append(st.ResourceDemand, append(per, tierless))
		if r == 0 {
			st.Demand, st.Tierless = per, tierless
		}
	}
	st.Shed = make([]bool, len(st.Tiers))
	for i, tier := range st.Tiers {
		st.Shed[i] = c.Shed(tier)
	}
	return st
}

// SetCircuitObserver installs fn to be told of every circuit transition,
// outside the queue's lock, in order.
func (q *Queue) SetCircuitObserver(fn func(CircuitEvent)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.circuitObserver = fn
}
