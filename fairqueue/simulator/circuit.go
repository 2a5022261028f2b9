package simulator

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// Circuit is issue 10's tiered circuit breaking: three tiers of callers
// (low 40%, mid 30%, high 30% of demand, two tenants each) send 1.5x what
// the upstreams serve for three minutes, then 0.8x for three. The circuit
// (trigger 1.3, recover 1.0, hold 10 s, window 10 s, order low mid high)
// should shed low alone (what is left, 0.9x, fits), never mid nor high,
// and readmit low once demand with it is back under capacity, without
// flapping.
//
// Sizes: prompt 200, max_tokens 40 (output 20..40, mean 30): a request
// holds a slot 30 + 10 + 15 x 30 = 490 ms on average, so 2 x 8 slots serve
// about 32.7 requests/s.
func Circuit() *Scenario {
	const capacity = 2 * 8 / 0.490 // requests/s
	tenant := func(name, tier string, share float64) TenantSpec {
		// Two tenants per tier split the tier's share.
		return TenantSpec{Name: name, Weight: 1, Class: "interactive", Tier: tier,
			Arrivals: Arrivals{Kind: ArrivalPhases, Phases: []Phase{
				{Start: 0, End: CircuitOverloadEnd, Rate: 1.5 * capacity * share / 2},
				{Start: CircuitOverloadEnd, End: CircuitEnd, Rate: 0.8 * capacity * share / 2},
			}},
			Prompt: constant(200), MaxTokens: constant(40)}
	}
	return &Scenario{
		Name:        "circuit",
		Description: "tiered circuit breaking: 1.5x demand for 3 min (low 40%, mid 30%, high 30%), then 0.8x for 3 min",
		Upstreams:   2,
		Slots:       8,
		Classes:     []Class{{Name: "interactive", Budget: 15 * time.Second}},
		Tenants: []TenantSpec{
			tenant("low_a", "low", 0.4), tenant("low_b", "low", 0.4),
			tenant("mid_a", "mid", 0.3), tenant("mid_b", "mid", 0.3),
			tenant("high_a", "high", 0.3), tenant("high_b", "high", 0.3),
		},
		Duration: CircuitEnd,
		Circuit: &degrade.CircuitConfig{Trigger: 1.3, Recover: 1.0, Hold: 10 * time.Second,
			Window: 10 * time.Second, Order: []string{"low", "mid", "high"}},
		Policies: []string{"wfq-tokens"},
	}
}

// The circuit scenario's phases.
const (
	CircuitOverloadEnd = 3 * time.Minute
	CircuitEnd         = 6 * time.Minute
)
