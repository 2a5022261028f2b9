package simulator

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// Circuit is tiered circuit breaking: three tiers of callers (low 40%,
// mid 30%, high 30% of demand) send 1.5x what the upstreams serve for
// three minutes, then 0.8x. The circuit should shed low alone (what is
// left, 0.9x, fits) and readmit it later, without flapping.
//
// A request holds a slot 30 + 10 + 15 x 30 = 490 ms on average.
func Circuit() *Scenario {
	const capacity = 2 * 8 / 0.490 // requests/s
	caller := func(name, tier string, share float64) TenantSpec {
		// Two tenants per tier split the tier's share.
		return chatCaller(name, tier, phased(
			Phase{Start: 0, End: CircuitOverloadEnd, Rate: 1.5 * capacity * share / 2},
			Phase{Start: CircuitOverloadEnd, End: CircuitEnd, Rate: 0.8 * capacity * share / 2}))
	}
	return circuitScenario("circuit",
		"tiered circuit breaking: 1.5x demand for 3 min (low 40%, mid 30%, high 30%), then 0.8x for 3 min",
		CircuitEnd, []TenantSpec{
			caller("low_a", "low", 0.4), caller("low_b", "low", 0.4),
			caller("mid_a", "mid", 0.3), caller("mid_b", "mid", 0.3),
			caller("high_a", "high", 0.3), caller("high_b", "high", 0.3),
		}, "low", "mid", "high")
}

// circuitScenario is a circuit-breaking scenario: interactive tiered
// callers on 2x8 slots until end, the circuit shedding in order.
func circuitScenario(name, description string, end time.Duration, tenants []TenantSpec, order ...string) *Scenario {
	return &Scenario{
		Name:        name,
		Description: description,
		Upstreams:   2,
		Slots:       8,
		Classes:     []Class{{Name: "interactive", Budget: 15 * time.Second}},
		Tenants:     tenants,
		Duration:    end,
		Circuit: &degrade.CircuitConfig{Trigger: 1.3, Recover: 1.0, Hold: 10 * time.Second,
			Window: 10 * time.Second, Order: order},
		Policies: []string{"wfq-tokens"},
	}
}

// chatCaller is an interactive caller of tier whose requests default to
// chat sizes.
func chatCaller(name, tier string, a Arrivals) TenantSpec {
	t := tenant(name, 1, "interactive", a, constant(200), constant(40))
	t.Tier = tier
	return t
}

// The circuit scenario's phases.
const (
	CircuitOverloadEnd = 3 * time.Minute
	CircuitEnd         = 6 * time.Minute
)

// CircuitMix is the circuit breaker under a shifting cost mix, one caller
// per tier:
//
//   - 0-30 s: both send chat (490 ms of slot time) at 1.1x the slots.
//   - 30-150 s: low switches to documents (675 ms of slot time but 50
//     times the tokens) and the load falls to 0.5x, which reads as 7x
//     capacity in tokens.
//   - 150-330 s: a real overload at 1.5x: low is shed.
//   - 330-450 s: 0.8x: low is readmitted.
func CircuitMix() *Scenario {
	const slots = 16.0
	chat := func(load float64) float64 { return load * slots / 0.490 } // requests/s for load x the slots
	docs := func(load float64) float64 { return load * slots / 0.675 }
	docPrompt, docMax := uniform(11000, 13000), uniform(2, 4)
	return circuitScenario("circuit-mix",
		"circuit breaking while low's requests turn from chat into long documents with short answers (0.5x of the slots, 7x in tokens), then a real 1.5x overload, then 0.8x",
		CircuitMixEnd, []TenantSpec{
			chatCaller("low", "low", phased(
				Phase{Start: 0, End: CircuitMixShift, Rate: chat(0.6)},
				Phase{Start: CircuitMixShift, End: CircuitMixOverload, Rate: docs(0.2), Prompt: docPrompt, MaxTokens: docMax},
				Phase{Start: CircuitMixOverload, End: CircuitMixCalm, Rate: docs(0.6), Prompt: docPrompt, MaxTokens: docMax},
				Phase{Start: CircuitMixCalm, End: CircuitMixEnd, Rate: docs(0.3), Prompt: docPrompt, MaxTokens: docMax})),
			chatCaller("high", "high", phased(
				Phase{Start: 0, End: CircuitMixShift, Rate: chat(0.5)},
				Phase{Start: CircuitMixShift, End: CircuitMixOverload, Rate: chat(0.3)},
				Phase{Start: CircuitMixOverload, End: CircuitMixCalm, Rate: chat(0.9)},
				Phase{Start: CircuitMixCalm, End: CircuitMixEnd, Rate: chat(0.5)})),
		}, "low", "high")
}

// CircuitMix's phases.
const (
	CircuitMixShift    = 30 * time.Second
	CircuitMixOverload = 150 * time.Second
	CircuitMixCalm     = 330 * time.Second
	CircuitMixEnd      = 450 * time.Second
)
