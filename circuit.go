package caddyfairqueue

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// CircuitBreakConfig sheds callers tier by tier under real overload: while
// the model servers are saturated with requests waiting (for Saturation
// of Window) and the demand of the tiers still admitted stays above
// Trigger times capacity, the lowest of them is shed (429 circuit_open);
// the last shed tier is readmitted once demand with it is below Recover.
// The top tier of Order is never shed, nor is a tenant without a tier.
type CircuitBreakConfig struct {
	// Trigger is the demand/capacity ratio above which the next tier is
	// shed. Default 1.3.
	Trigger float64 `json:"trigger,omitempty"`
	// Recover is the ratio, counting the last shed tier's demand, below
	// which that tier is readmitted; below Trigger. Default 1.0.
	Recover float64 `json:"recover,omitempty"`
	// Hold is the least time between two moves of one tier. Default 10s.
	Hold caddy.Duration `json:"hold,omitempty"`
	// Window is the span demand is averaged over. Default 10s.
	Window caddy.Duration `json:"window,omitempty"`
	// Order lists the tiers, lowest (shed first) to highest (never shed);
	// tenants name theirs with tier. At least two.
	Order []string `json:"order,omitempty"`
	// Saturation is the least share of Window the upstreams must have been
	// saturated, with requests waiting, for a tier to be shed. In (0, 1];
	// default 0.9.
	Saturation float64 `json:"saturation,omitempty"`
}

// circuitEvent is the Caddy event emitted on every circuit transition.
const circuitEvent = "fair_queue_circuit"

func (c *CircuitBreakConfig) engine() *degrade.CircuitConfig {
	if c == nil {
		return nil
	}
	return &degrade.CircuitConfig{Trigger: c.Trigger, Recover: c.Recover,
		Hold: time.Duration(c.Hold), Window: time.Duration(c.Window), Order: c.Order, Saturation: c.Saturation}
}

// onCircuit logs, counts and emits one circuit transition, with the
// callers of the tier and how much each was sending.
func (h *Handler) onCircuit(ev fairqueue.CircuitEvent) {
	dir := "readmitted"
	if ev.Up {
		dir = "shed"
	}
	circuitTransitions.WithLabelValues(h.Name, ev.Tier, dir).Inc()
	h.history().Circuit(ev.At, ev.Tier, ev.Up, ev.From, ev.To, ev.Ratio)
	callers := make([]map[string]any, 0, len(ev.Callers))
	fields := []zap.Field{zap.String("queue", h.Name), zap.String("tier", ev.Tier), zap.String("direction", dir),
		zap.Int("level", ev.To), zap.Float64("demand_ratio", ev.Ratio), zap.String("resource", ev.Resource),
		zap.Float64("demand", ev.Demand), zap.Float64("capacity", ev.Capacity),
		zap.Float64("saturation", ev.Saturation), zap.Float64("backlog_trend", ev.BacklogTrend)}
	for _, c := range ev.Callers {
		callers = append(callers, map[string]any{"tenant": c.Tenant, "demand": c.Demand,
			"share_of_capacity": c.Share, "joint_occupancy": c.JointOccupancy})
	}
	if len(callers) > 0 {
		fields = append(fields, zap.Any("callers", callers))
	}
	h.logger.Warn("circuit breaker: "+ev.String(), fields...)
	if h.events != nil {
		h.events.Emit(h.ctx, circuitEvent, map[string]any{
			"queue": h.Name, "tier": ev.Tier, "direction": dir, "level": ev.To,
			"demand_ratio": ev.Ratio, "resource": ev.Resource, "saturation": ev.Saturation,
			"backlog_trend": ev.BacklogTrend, "callers": callers,
		})
	}
}

var (
	circuitTransitions = counterVec("circuit_transitions_total",
		"Circuit breaker transitions, by tier and direction (shed, readmitted).",
		"queue", "tier", "direction")
	descCircuitShed = prometheus.NewDesc(fqName("circuit_shed"),
		"1 while the circuit breaker sheds the tier, else 0.", []string{"queue", "tier"}, nil)
	descCircuitDemand = prometheus.NewDesc(fqName("circuit_demand"),
		"Arriving demand per tier (\"\" for tenants without one) on each resource the circuit measures, in its units per second over the circuit's window: slots in busy seconds (slot-seconds), inflight_tokens in token-seconds, account_tokens in tokens (prompt + output cap), account_requests in requests.", []string{"queue", "tier", "resource"}, nil)
	descCircuitCapacity = prometheus.NewDesc(fqName("circuit_capacity"),
		"Each resource's capacity, in the units of circuit_demand per second: the slots, the in-flight token capacity, the account's rates.", []string{"queue", "resource"}, nil)
	descCircuitSignal = prometheus.NewDesc(fqName("circuit_signal"),
		"What the circuit compares with trigger and recover, per sheddable tier: the largest over the resources of the demand of the tier, the tiers above it and tier-less tenants, over capacity.", []string{"queue", "tier"}, nil)
	descCircuitSaturation = prometheus.NewDesc(fqName("circuit_saturation"),
		"Share of the circuit's window during which every slot was busy (or the account or the token capacity held dispatch) with requests waiting; a tier is shed only above circuit_break's saturation.", []string{"queue"}, nil)
	descCircuitBacklogTrend = prometheus.NewDesc(fqName("circuit_backlog_trend"),
		"How fast the queued requests grew over the circuit's window, requests per second (negative: shrinking).", []string{"queue"}, nil)
)

// collectCircuit reports a queue's circuit at scrape time.
func collectCircuit(ch chan<- prometheus.Metric, name string, st fairqueue.CircuitState) {
	if !st.Configured {
		return
	}
	gauge(ch, descCircuitSaturation, st.Saturation, name)
	gauge(ch, descCircuitBacklogTrend, st.BacklogTrend, name)
	for r, res := range st.Resources {
		gauge(ch, descCircuitCapacity, st.ResourceCapacity[r], name, res)
		d := st.ResourceDemand[r]
		gauge(ch, descCircuitDemand, d[len(d)-1], name, "", res)
		for i, tier := range st.Tiers {
			gauge(ch, descCircuitDemand, d[i], name, tier, res)
		}
	}
	for i, tier := range st.Tiers {
		shed := 0.0
		if st.Shed[i] {
			shed = 1
		}
		gauge(ch, descCircuitShed, shed, name, tier)
		if i < len(st.Signals) {
			gauge(ch, descCircuitSignal, st.Signals[i], name, tier)
		}
	}
}
