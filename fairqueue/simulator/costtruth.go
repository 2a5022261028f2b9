package simulator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// CostTruth is a ground-truth service-time model: a request holds its
// upstream slot for Overhead + PerPrompt x prompt + PerOutput x output,
// times a noise factor drawn uniformly from [1-Noise, 1+Noise]. The factor
// has mean 1, so the noise-free time is also the expected one, which is
// what a regression on observed busy times (package costmodel) estimates.
type CostTruth struct {
	Overhead  time.Duration
	PerPrompt time.Duration
	PerOutput time.Duration
	// Noise is the half-width of the multiplicative noise, in [0, 1).
	Noise float64
}

// Validate rejects negative times and noise outside [0, 1) (a factor of
// 0 or below would make a request take no time).
func (c CostTruth) Validate() error {
	if c.Overhead < 0 || c.PerPrompt < 0 || c.PerOutput < 0 {
		return fmt.Errorf("cost truth: negative time in %+v", c)
	}
	if !(c.Noise >= 0 && c.Noise < 1) {
		return fmt.Errorf("cost truth: noise %v outside [0, 1)", c.Noise)
	}
	return nil
}

// Mean is the noise-free service time of a request.
func (c CostTruth) Mean(prompt, output int64) time.Duration {
	return c.Overhead + time.Duration(prompt)*c.PerPrompt + time.Duration(output)*c.PerOutput
}

// Sample is one observed service time of a request: Mean times a noise
// factor drawn from r (no draw when Noise is 0, so a noise-free truth
// leaves the stream untouched).
func (c CostTruth) Sample(prompt, output int64, r *rand.Rand) time.Duration {
	mean := c.Mean(prompt, output)
	if c.Noise == 0 {
		return mean
	}
	f := 1 + c.Noise*(2*r.Float64()-1)
	return time.Duration(math.Round(float64(mean) * f))
}

// CostMix is a workload for fitting and using a learned cost model: a
// prompt-heavy tenant (2k-16k-token prompts, 64-token answers), an
// output-heavy one (short prompts, 500-1000-token answers) and a chat
// tenant (heavy-tailed prompts, 25-600-token answers), 16 requests/s for
// 10 minutes on 4x8 slots. Prompt and output sizes vary widely and
// independently within each tenant, so every coefficient of the cost model
// is identifiable; under `tokens` costs the prompt-heavy tenant is charged
// far more than the upstream time it takes, relative to the others.
func CostMix() *Scenario {
	end := 10 * time.Minute
	return &Scenario{
		Name:        "costmix",
		Description: "prompt-heavy, output-heavy and chat tenants of equal weight: the cost model's workload; 4x8 slots",
		Upstreams:   4, Slots: 8,
		Classes: defaultClasses,
		Tenants: []TenantSpec{
			{Name: "prefill", Weight: 1, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 4, End: end},
				Prompt:   uniform(2000, 16000), MaxTokens: constant(64)},
			{Name: "decode", Weight: 1, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 4, End: end},
				Prompt:   uniform(50, 500), MaxTokens: constant(1000)},
			{Name: "chat", Weight: 1, Class: "interactive",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 8, End: end},
				Prompt:   pareto(200, 8000, 1.5), MaxTokens: uniform(50, 600)},
		},
	}
}
