package fairqueue

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// Tiered circuit breaking (degrade.Circuit) as the queue applies it.
//
// Every request that reaches Enqueue is counted as demand of its tenant's
// tier (TenantConfig.Tier), in the queue's cost unit: the unit the
// throughput estimator measures what the upstreams serve in, so that
// demand / capacity compares like with like. Capacity is the estimator's
// busy-time mean rate times the healthy upstreams: what the upstreams do
// when they have work, not what they were given (which follows admitted
// demand, and would never let a shed tier back). Each Tick observes the
// circuit; a request of a shed tier is refused at once (ReasonCircuitOpen)
// before it costs anything else.

// CircuitEvent is one circuit transition as the queue reports it: when a
// tier was shed, with the callers of that tier that were sending, the
// largest first (the alert's "who tripped it and by how much").
type CircuitEvent struct {
	degrade.CircuitTransition
	Callers []CircuitCaller
}

// CircuitCaller is one shed caller's demand at the moment its tier was
// shed.
type CircuitCaller struct {
	Tenant string
	// Demand is the caller's arriving cost per second (the queue's cost
	// unit), averaged over the circuit's window.
	Demand float64
	// Share is Demand over the upstreams' capacity.
	Share float64
	// JointOccupancy is the caller's arriving request-equivalents per
	// second over its quota's joint rate (qps x joint_cap): 1 is exactly
	// its quota. 0 when it has no joint quota.
	JointOccupancy float64
}

// maxCircuitCallers bounds the callers one event names.
const maxCircuitCallers = 10

// newCircuit builds cfg's circuit and carries old's state over.
func newCircuit(cfg *Config, old *degrade.Circuit) (*degrade.Circuit, error) {
	if cfg.Circuit == nil {
		return nil, nil
	}
	c, err := degrade.NewCircuit(*cfg.Circuit)
	if err != nil {
		return nil, err
	}
	if old != nil {
		c.Carry(old)
	}
	return c, nil
}

// circuitLocked counts a request's demand and refuses it if its tier is
// shed.
func (q *Queue) circuitLocked(now time.Time, t *tenant, tc *TenantConfig, cost, tokens int64) *Rejection {
	c := q.circuit
	c.Arrive(now, tc.Tier, float64(cost))
	if t != nil {
		t.observeDemand(now, c.Config().Window, cost, tokens)
	}
	if tc.Tier == "" || !c.Shed(tc.Tier) {
		return nil
	}
	wait := max(c.ReadmitIn(now, tc.Tier), c.Config().Hold)
	return &Rejection{Reason: ReasonCircuitOpen, RetryAfter: q.retryAfterLocked(wait),
		Detail: fmt.Sprintf("tier %s is shed while demand exceeds %.2fx what the model servers serve", tc.Tier, c.Config().Trigger)}
}

// observeDemand adds a request to the tenant's arriving rates: an
// exponential average with the circuit's window as time constant, kept
// only while a circuit is configured.
func (t *tenant) observeDemand(now time.Time, window time.Duration, cost, tokens int64) {
	if t.demand == nil {
		t.demand = &tenantDemand{}
	}
	dm := t.demand
	ns := now.UnixNano()
	tau := float64(window)
	if dm.at != 0 && ns > dm.at {
		decay := math.Exp(-float64(ns-dm.at) / tau)
		dm.cost *= decay
		dm.reqs *= decay
		dm.tokens *= decay
	}
	if ns > dm.at {
		dm.at = ns
	}
	// Each arrival adds 1/tau per second of its units: a steady stream of
	// r per second converges to r.
	dm.cost += float64(cost) * 1e9 / tau
	dm.reqs += 1e9 / tau
	dm.tokens += float64(tokens) * 1e9 / tau
}

// tenantDemand is a tenant's arriving cost, requests and tokens per
// second, decayed from at (Unix ns).
type tenantDemand struct {
	at                 int64
	cost, reqs, tokens float64
}

// demandAtLocked is t's arriving rates decayed to now.
func (t *tenant) demandAtLocked(now time.Time, window time.Duration) (cost, reqs, tokens float64) {
	dm := t.demand
	if dm == nil || dm.at == 0 {
		return 0, 0, 0
	}
	d := math.Exp(-float64(max(now.UnixNano()-dm.at, 0)) / float64(window))
	return dm.cost * d, dm.reqs * d, dm.tokens * d
}

// circuitCapacityLocked is what the upstreams serve, in cost units per
// second: the estimator's busy-time mean per upstream times the healthy
// upstreams; 0 before anything was measured (no transition then). The
// estimator measures only while the upstreams are busy, so once an
// overload ends its window empties; the last measured rate stands in
// then, or a shed tier could never be readmitted.
func (q *Queue) circuitCapacityLocked(now time.Time) float64 {
	if m := q.adm.rate.Stats(now, q.healthy).Mean; m > 0 {
		q.circuitPerUpstream = m
	}
	return q.circuitPerUpstream * float64(q.healthy)
}

// observeCircuitLocked moves the circuit on the tick and queues its events
// for delivery after the lock is released.
func (q *Queue) observeCircuitLocked(now time.Time) {
	if q.circuit == nil {
		return
	}
	capacity := q.circuitCapacityLocked(now)
	for _, tr := range q.circuit.Observe(now, capacity) {
		ev := CircuitEvent{CircuitTransition: tr}
		if tr.Up {
			ev.Callers = q.shedCallersLocked(now, tr.Tier, capacity)
		}
		q.circuitEvents = append(q.circuitEvents, ev)
	}
}

// shedCallersLocked lists the tenants of tier that were sending, the
// largest demand first. It scans the remembered tenants: O(tenants), at a
// shed only, which the circuit's hold makes rare.
func (q *Queue) shedCallersLocked(now time.Time, tier string, capacity float64) []CircuitCaller {
	window := q.circuit.Config().Window
	var out []CircuitCaller
	for _, t := range q.tenants {
		if t.cfg.Tier != tier {
			continue
		}
		cost, reqs, tokens := t.demandAtLocked(now, window)
		if cost <= 0 {
			continue
		}
		c := CircuitCaller{Tenant: t.name, Demand: cost}
		if capacity > 0 {
			c.Share = cost / capacity
		}
		if l := t.cfg.Quota; l != nil && l.Config().JointCap > 0 {
			qc := l.Config()
			c.JointOccupancy = (reqs + tokens*qc.TokenToQPSWeight) / (qc.QPS * qc.JointCap)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b CircuitCaller) int {
		switch {
		case a.Demand > b.Demand:
			return -1
		case a.Demand < b.Demand:
			return 1
		}
		return 0
	})
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
	// Demand is each tier's arriving cost per second (Tiers' order);
	// Tierless is the demand of tenants without a tier.
	Demand   []float64
	Tierless float64
	// Capacity is what the upstreams serve, cost units per second.
	Capacity float64
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
	st := CircuitState{Configured: true, Level: c.Level(), Tiers: c.Tiers(),
		Capacity: q.circuitCapacityLocked(now)}
	st.Demand, st.Tierless, _ = c.Demand(now)
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
	q.circuitObserver = fn
	q.mu.Unlock()
}
