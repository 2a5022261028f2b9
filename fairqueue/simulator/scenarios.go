package simulator

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// defaultClasses are the seed's classes with their default wait budgets
// (realtime 5 s, interactive 15 s, batch 300 s), highest priority first.
var defaultClasses = []Class{
	{Name: "realtime", Budget: 5 * time.Second},
	{Name: "interactive", Budget: 15 * time.Second},
	{Name: "batch", Budget: 300 * time.Second},
}

func constant(n int64) Dist     { return Dist{Kind: DistConst, A: n} }
func uniform(lo, hi int64) Dist { return Dist{Kind: DistUniform, A: lo, B: hi} }
func choice(v ...int64) Dist    { return Dist{Kind: DistChoice, Values: v} }
func pareto(scale, limit int64, alpha float64) Dist {
	return Dist{Kind: DistPareto, A: scale, B: limit, Alpha: alpha}
}

// Seed000 is seed document 000: a department floods the gateway with 5000
// batch requests while marketing (realtime) and the support bot
// (interactive) keep sending sparse requests.
func Seed000() *Scenario {
	return &Scenario{
		Name:        "seed000",
		Description: "5000-request batch flood in 5 s vs a realtime and an interactive tenant; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Classes: defaultClasses,
		Tenants: []TenantSpec{
			{Name: "data_batch", Weight: 15, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalBurst, N: 5000, End: 5 * time.Second},
				Prompt:   uniform(2000, 6000), MaxTokens: constant(512)},
			{Name: "marketing", Weight: 30, Class: "realtime",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 1, End: 300 * time.Second},
				Prompt:   uniform(100, 400), MaxTokens: constant(128)},
			{Name: "cs_bot", Weight: 30, Class: "interactive",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 0.5, End: 300 * time.Second},
				Prompt:   uniform(500, 2000), MaxTokens: constant(256)},
		},
	}
}

// Seed002 is seed document 002: tenant A submits 1000 long requests at
// once; tenant B sends one short request per second for as long as A is
// backlogged (Arrivals.Alongside).
func Seed002() *Scenario {
	return &Scenario{
		Name:        "seed002",
		Description: "1000 x 2000-token burst (A) vs 1 req/s x 200 tokens (B) while A has work; 1x8 slots",
		Upstreams:   1, Slots: 8,
		Classes: defaultClasses,
		Tenants: []TenantSpec{
			{Name: "A", Weight: 1, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalBurst, N: 1000},
				Prompt:   constant(1500), MaxTokens: constant(500)},
			{Name: "B", Weight: 1, Class: "realtime",
				Arrivals: Arrivals{Kind: ArrivalPeriodic, Interval: time.Second, Start: time.Second, Alongside: "A"},
				Prompt:   constant(150), MaxTokens: constant(50)},
		},
	}
}

// Weights keeps three tenants of weights 30, 30 and 15 permanently
// backlogged for an hour. Their size mixes differ on purpose (alpha mixed,
// beta short, gamma long), so fairness by request count and fairness by
// tokens give visibly different shares.
func Weights() *Scenario {
	return &Scenario{
		Name:        "weights",
		Description: "weights 30/30/15, all backlogged (50 queued each) for 1 h, different size mixes; 2x16 slots",
		Upstreams:   2, Slots: 16,
		Classes:  defaultClasses,
		Duration: time.Hour,
		Tenants: []TenantSpec{
			{Name: "alpha", Weight: 30, Class: "realtime",
				Arrivals: Arrivals{Kind: ArrivalBacklogged, Queue: 50},
				Prompt:   uniform(100, 4000), MaxTokens: choice(64, 256, 1024)},
			{Name: "beta", Weight: 30, Class: "interactive",
				Arrivals: Arrivals{Kind: ArrivalBacklogged, Queue: 50},
				Prompt:   uniform(100, 1000), MaxTokens: choice(64, 256)},
			{Name: "gamma", Weight: 15, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalBacklogged, Queue: 50},
				Prompt:   uniform(1000, 4000), MaxTokens: choice(256, 1024)},
		},
	}
}

// Many is 1000 tenants with Poisson arrivals whose rates are spread
// log-uniformly over three orders of magnitude, heavy-tailed prompts
// (Pareto, shape 1.2, capped at 32k) and about 100k requests in 10 min.
// The offered load is about 105% of capacity, so a backlog builds up in
// which the heavy tenants (above their 1/1000 share) are held back while
// light ones still start at once.
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
		ts[i] = TenantSpec{
			Name:      fmt.Sprintf("t%04d", i),
			Weight:    1,
			Class:     defaultClasses[i%3].Name,
			Group:     rateGroup(rate),
			Arrivals:  Arrivals{Kind: ArrivalPoisson, Rate: rate, End: duration},
			Prompt:    pareto(200, 32000, 1.2),
			MaxTokens: choice(64, 256, 1024),
		}
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

// Outage is seed000 with one of the two upstreams down from 60 s to 120 s.
func Outage() *Scenario {
	sc := Seed000()
	sc.Name = "outage"
	sc.Description = "seed000 with one upstream down from 60 s to 120 s"
	sc.Health = []HealthChange{{At: 60 * time.Second, Healthy: 1}, {At: 120 * time.Second, Healthy: 2}}
	return sc
}

var registry = map[string]func() *Scenario{
	"seed000": Seed000,
	"seed002": Seed002,
	"weights": Weights,
	"many":    Many,
	"outage":  Outage,
}

// Names lists the scenario names, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns a fresh copy of the named scenario.
func Lookup(name string) (*Scenario, bool) {
	f, ok := registry[name]
	if !ok {
		return nil, false
	}
	return f(), true
}
