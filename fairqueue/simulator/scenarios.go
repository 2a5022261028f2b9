package simulator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// defaultClasses are the seed's classes with their default wait budgets
// (realtime 5 s, interactive 15 s, batch 300 s), highest priority first.
var defaultClasses = classes(5*time.Second, 15*time.Second, 300*time.Second)

// classes are the seed's three classes with these wait budgets.
func classes(realtime, interactive, batch time.Duration) []Class {
	return []Class{{Name: "realtime", Budget: realtime}, {Name: "interactive", Budget: interactive}, {Name: "batch", Budget: batch}}
}

func constant(n int64) Dist     { return Dist{Kind: DistConst, A: n} }
func uniform(lo, hi int64) Dist { return Dist{Kind: DistUniform, A: lo, B: hi} }
func choice(v ...int64) Dist    { return Dist{Kind: DistChoice, Values: v} }
func pareto(scale, limit int64, alpha float64) Dist {
	return Dist{Kind: DistPareto, A: scale, B: limit, Alpha: alpha}
}

// tenant is a TenantSpec with the fields every scenario sets.
func tenant(name string, weight float64, class string, a Arrivals, prompt, maxTokens Dist) TenantSpec {
	return TenantSpec{Name: name, Weight: weight, Class: class, Arrivals: a, Prompt: prompt, MaxTokens: maxTokens}
}

func poisson(rate float64, end time.Duration) Arrivals {
	return Arrivals{Kind: ArrivalPoisson, Rate: rate, End: end}
}
func burst(n int, start, end time.Duration) Arrivals {
	return Arrivals{Kind: ArrivalBurst, N: n, Start: start, End: end}
}
func phased(ph ...Phase) Arrivals   { return Arrivals{Kind: ArrivalPhases, Phases: ph} }
func backlogged(queue int) Arrivals { return Arrivals{Kind: ArrivalBacklogged, Queue: queue} }

// budgetPolicyNames are the default policies of wait-budget scenarios.
var budgetPolicyNames = []string{FIFOBudgets, WFQBudgets, WFQNoBoost, WFQNoFastFail}

// withPrior is the default admission with a throughput prior in estimated
// tokens/s per upstream: a scenario's nominal rate times a factor below 1,
// since the estimator's own measurement is a low quantile.
func withPrior(prior float64) *fairqueue.BudgetConfig {
	a := fairqueue.DefaultBudgetConfig()
	a.Throughput.Prior = prior
	return &a
}

// Seed000 is seed document 000: a department floods the gateway with 5000
// batch requests while marketing (realtime) and the support bot
// (interactive) send sparse requests. Prior: 0.85 of the flood's nominal
// rate (12,023).
func Seed000() *Scenario {
	return &Scenario{
		Name:        "seed000",
		Description: "5000-request batch flood in 5 s vs a realtime and an interactive tenant; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Admission: withPrior(10200),
		Classes:   defaultClasses,
		Tenants: []TenantSpec{
			tenant("data_batch", 15, "batch", burst(5000, 0, 5*time.Second), uniform(2000, 6000), constant(512)),
			tenant("marketing", 30, "realtime", poisson(1, 300*time.Second), uniform(100, 400), constant(128)),
			tenant("cs_bot", 30, "interactive", poisson(0.5, 300*time.Second), uniform(500, 2000), constant(256)),
		},
	}
}

// Seed002 is seed document 002: A submits 1000 long requests at once; B
// sends one short request per second while A is backlogged.
func Seed002() *Scenario {
	return &Scenario{
		Name:        "seed002",
		Description: "1000 x 2000-token burst (A) vs 1 req/s x 200 tokens (B) while A has work; 1x8 slots",
		Upstreams:   1, Slots: 8,
		Classes: defaultClasses,
		Tenants: []TenantSpec{
			tenant("A", 1, "batch", burst(1000, 0, 0), constant(1500), constant(500)),
			tenant("B", 1, "realtime", Arrivals{Kind: ArrivalPeriodic, Interval: time.Second, Start: time.Second, Alongside: "A"},
				constant(150), constant(50)),
		},
	}
}

// Weights keeps three tenants of weights 30, 30 and 15 backlogged for an
// hour. Their size mixes differ so that fairness by requests and by tokens
// give visibly different shares.
func Weights() *Scenario {
	return &Scenario{
		Name:        "weights",
		Description: "weights 30/30/15, all backlogged (50 queued each) for 1 h, different size mixes; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Classes:  defaultClasses,
		Duration: time.Hour,
		Tenants: []TenantSpec{
			tenant("alpha", 30, "realtime", backlogged(50), uniform(100, 4000), choice(64, 256, 1024)),
			tenant("beta", 30, "interactive", backlogged(50), uniform(100, 1000), choice(64, 256)),
			tenant("gamma", 15, "batch", backlogged(50), uniform(1000, 4000), choice(256, 1024)),
		},
	}
}

// Many is 1000 tenants with Poisson rates spread log-uniformly over three
// decades and heavy-tailed prompts, at about 105% of capacity: heavy
// tenants are held back while light ones still start at once.
func Many() *Scenario {
	const (
		tenants  = 1000
		duration = 600 * time.Second
		total    = 100000.0
	)
	// rate_i = r0 * 1000^(i/(n-1)); r0 makes the expected total `total`.
	var sum float64
	for i := 0; i < tenants; i++ {
		sum += math.Pow(1000, float64(i)/(tenants-1))
	}
	r0 := total / duration.Seconds() / sum
	ts := make([]TenantSpec, tenants)
	for i := range ts {
		rate := r0 * math.Pow(1000, float64(i)/(tenants-1))
		ts[i] = tenant(fmt.Sprintf("t%04d", i), 1, defaultClasses[i%3].Name, poisson(rate, duration),
			pareto(200, 32000, 1.2), choice(64, 256, 1024))
		ts[i].Group = rateGroup(rate)
	}
	return &Scenario{
		Name:        "many",
		Description: "1000 tenants, Poisson rates over 3 decades, Pareto prompts, ~100k requests in 10 min at ~105% load; 51x16 slots",
		Upstreams:   51, Slots: 16,
		Classes:   defaultClasses,
		Tenants:   ts,
		GroupRows: true,
	}
}

func rateGroup(rate float64) string {
	switch {
	case rate < 0.01:
		return "rate<0.01/s"
	case rate < 0.1:
		return "rate<0.1/s"
	case rate < 1:
		return "rate<1/s"
	}
	return "rate>=1/s"
}

// Outage is seed000 with one upstream down from 60 s to 120 s.
func Outage() *Scenario { return withOutage(Seed000(), "outage", 60, 120) }

// withOutage renames sc and takes one upstream down from second from to
// second to.
func withOutage(sc *Scenario, name string, from, to int) *Scenario {
	sc.Description = fmt.Sprintf("%s with one upstream down from %d s to %d s", sc.Name, from, to)
	sc.Name = name
	sc.Health = []HealthChange{{At: time.Duration(from) * time.Second, Healthy: sc.Upstreams - 1},
		{At: time.Duration(to) * time.Second, Healthy: sc.Upstreams}}
	return sc
}

// ColdStart is seed000 with no throughput prior: the flood arrives before
// the first completion, and the engine must learn the rate and refuse
// what cannot make the budget rather than let it expire.
func ColdStart() *Scenario {
	sc := Seed000()
	sc.Name = "cold-start"
	sc.Description = "seed000 with no throughput prior: the rate is learned from the flood itself"
	a := fairqueue.DefaultBudgetConfig()
	sc.Admission = &a
	return sc
}

// ColdFlood is the end-to-end early-refusal test: no throughput prior,
// and a batch tenant with a 10 s budget that sends about three times what
// fits in it in its first second.
func ColdFlood() *Scenario {
	a := fairqueue.DefaultBudgetConfig()
	return &Scenario{
		Name:        "cold-flood",
		Description: "570 x ~0.5 s batch requests (10 s budget) in 1 s on a cold gateway, no prior; 2x4 slots",
		Upstreams:   2, Slots: 4,
		Admission: &a,
		Classes:   classes(5*time.Second, 15*time.Second, 10*time.Second),
		Tenants:   []TenantSpec{tenant("bulk", 1, "batch", burst(570, 0, time.Second), constant(100), constant(40))},
	}
}

// Seed000Stress is the seed's stress test: a 30 min flood of long
// requests at about 1.3x capacity, whose requests must be refused once its
// queue holds 300 s of work, and three small realtime tenants with
// heavy-tailed prompts: tag order puts their few long ones behind more
// than their 5 s budget of the flood's work, which only a boost can save.
// Prior: about 0.85 of the flood's nominal rate (9,500).
func Seed000Stress() *Scenario {
	small := func(name string) TenantSpec {
		return tenant(name, 1, "realtime", poisson(0.2, 30*time.Minute), pareto(200, 12000, 1.3), constant(128))
	}
	return &Scenario{
		Name:        "seed000-stress",
		Description: "30 min flood of long batch requests at ~1.3x capacity vs 3 sparse small (weight 1/15) realtime tenants; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Classes:   defaultClasses,
		Admission: withPrior(8100),
		Policies:  budgetPolicyNames,
		Tenants: []TenantSpec{
			tenant("data_batch", 15, "batch", poisson(3.5, 30*time.Minute), uniform(4000, 8000), constant(1024)),
			small("rt_a"), small("rt_b"), small("rt_c"),
		},
	}
}

// StressOutage is seed000-stress with one upstream down from 900 s to
// 960 s: the ETAs double, so the flood is refused until it returns.
func StressOutage() *Scenario { return withOutage(Seed000Stress(), "stress-outage", 900, 960) }

// PeakLadder is the seed's degrade ladder: pause batch, light mode for
// interactive, throttle realtime.
func PeakLadder() []degrade.Step {
	return []degrade.Step{
		{Name: "L1", Trigger: 0.70, Recover: 0.60, Action: degrade.Action{Kind: degrade.ActionPause, Class: "batch"}},
		{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: degrade.Action{Kind: degrade.ActionLightMode, Class: "interactive", MaxInputTokens: 2048}},
		{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: degrade.Action{Kind: degrade.ActionThrottle, Class: "realtime", Rate: degrade.Rate{PerSecond: 20}}},
	}
}

// Peak drives the degrade ladder through three 60 s waves of batch load,
// faster than the slots drain, over a steady background: water about
// 0.75, 0.90 and 0.97.
func Peak() *Scenario {
	wave := func(start time.Duration, rate float64) Phase {
		return Phase{Start: start, End: start + 60*time.Second, Rate: rate, Even: true}
	}
	return &Scenario{
		Name:        "peak",
		Description: "three 60 s waves of batch load to water ~0.75, 0.90, 0.97 (max_queue 1000) over a realtime/interactive background; L1-L3 ladder; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Classes:     defaultClasses,
		Admission:   withPrior(11000),
		MaxQueue:    1000,
		Degrade:     PeakLadder(),
		DegradeHold: 5 * time.Second,
		Policies:    []string{WFQBudgets},
		Tenants: []TenantSpec{
			tenant("data_batch", 15, "batch", phased(wave(20*time.Second, 16.8), wave(280*time.Second, 19.3), wave(560*time.Second, 20.7)),
				uniform(2000, 6000), constant(512)),
			tenant("marketing", 30, "realtime", poisson(2, 900*time.Second), uniform(100, 400), constant(128)),
			tenant("cs_bot", 30, "interactive", poisson(1, 900*time.Second), uniform(1000, 6000), constant(256)),
		},
	}
}

// CostMix is the learned cost model's workload: prompt-heavy,
// output-heavy and chat tenants whose sizes vary independently, so every
// coefficient is identifiable; under `tokens` costs the prompt-heavy
// tenant is charged far more than the upstream time it takes.
func CostMix() *Scenario {
	end := 10 * time.Minute
	return &Scenario{
		Name:        "costmix",
		Description: "prompt-heavy, output-heavy and chat tenants of equal weight: the cost model's workload; 4x8 slots",
		Upstreams:   4, Slots: 8,
		Classes: defaultClasses,
		Tenants: []TenantSpec{
			tenant("prefill", 1, "batch", poisson(4, end), uniform(2000, 16000), constant(64)),
			tenant("decode", 1, "batch", poisson(4, end), uniform(50, 500), constant(1000)),
			tenant("chat", 1, "interactive", poisson(8, end), pareto(200, 8000, 1.5), uniform(50, 600)),
		},
	}
}

var registry = map[string]func() *Scenario{
	"seed000":          Seed000,
	"seed002":          Seed002,
	"weights":          Weights,
	"many":             Many,
	"outage":           Outage,
	"cold-start":       ColdStart,
	"cold-flood":       ColdFlood,
	"seed000-stress":   Seed000Stress,
	"stress-outage":    StressOutage,
	"peak":             Peak,
	"seed004":          Seed004,
	"circuit":          Circuit,
	"circuit-mix":      CircuitMix,
	"costmix":          CostMix,
	"seed003":          Seed003,
	"provider-peak":    ProviderPeak,
	"seed003-fallback": func() *Scenario { return Seed003Outage(true) },
	"seed003-outage":   func() *Scenario { return Seed003Outage(false) },
}

// Names lists the scenario names, sorted.
func Names() []string { return slices.Sorted(maps.Keys(registry)) }

// Lookup returns a fresh copy of the named scenario.
func Lookup(name string) (*Scenario, bool) {
	f, ok := registry[name]
	if !ok {
		return nil, false
	}
	return f(), true
}
