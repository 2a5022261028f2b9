package simulator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/costmodel"
)

// TestDefaultCostTruthIsTheSlotModel: the ground truth with its defaults
// is exactly the service time every simulator run uses, request by
// request, over the workloads of several scenarios.
func TestDefaultCostTruthIsTheSlotModel(t *testing.T) {
	truth := DefaultCostTruth()
	if err := truth.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*Scenario{Seed000(), Seed002(), Seed004(), Peak()} {
		w, err := Generate(sc, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range w.Requests {
			if got := truth.Mean(r.Prompt, r.Output); got != r.Service() {
				t.Fatalf("%s request %d: truth %v, slot model %v", sc.Name, r.ID, got, r.Service())
			}
			if got := truth.Sample(r.Prompt, r.Output, nil); got != r.Service() {
				t.Fatalf("%s request %d: noise-free sample %v, slot model %v", sc.Name, r.ID, got, r.Service())
			}
		}
	}
}

func TestCostTruthValidate(t *testing.T) {
	for _, c := range []CostTruth{
		{Overhead: -1}, {PerPrompt: -1}, {PerOutput: -1},
		{Noise: -0.1}, {Noise: 1}, {Noise: math.NaN()},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestCostTruthNoise: samples stay within the noise band and average to
// the mean.
func TestCostTruthNoise(t *testing.T) {
	c := CostTruth{Overhead: 500 * time.Millisecond, PerPrompt: 100 * time.Microsecond, PerOutput: 4 * time.Millisecond, Noise: 0.05}
	r := rand.New(rand.NewPCG(1, 2))
	mean := c.Mean(2000, 300)
	var sum float64
	const n = 20000
	for range n {
		s := c.Sample(2000, 300, r)
		if s < time.Duration(0.95*float64(mean))-1 || s > time.Duration(1.05*float64(mean))+1 {
			t.Fatalf("sample %v outside ±5%% of %v", s, mean)
		}
		sum += float64(s)
	}
	// The standard error of the mean is 0.05/sqrt(3)/sqrt(n) = 0.02%.
	if got := sum / n / float64(mean); math.Abs(got-1) > 0.002 {
		t.Errorf("samples average %.4f x the mean", got)
	}
}

// relCoefErrs are |fitted/true - 1| for overhead, prompt-token and
// output-token time.
func relCoefErrs(f costmodel.Fit, c CostTruth) [3]float64 {
	return [3]float64{
		math.Abs(f.Overhead/c.Overhead.Seconds() - 1),
		math.Abs(f.PerPromptToken/c.PerPrompt.Seconds() - 1),
		math.Abs(f.PerCompletionToken/c.PerOutput.Seconds() - 1),
	}
}

var coefNames = [3]string{"overhead", "per prompt token", "per output token"}

// TestCostModelFitsSlotModel: package costmodel fitted to the simulator's
// own slot model on seed004's requests in arrival order (80/s tiny
// requests among normal, long-context and 15k-token callers, so sizes are
// correlated across callers and heavy-tailed) recovers every coefficient
// to 1e-6 after 1000 requests: no noise, so only the numerics are tested.
func TestCostModelFitsSlotModel(t *testing.T) {
	w, err := Generate(Seed004(), 1)
	if err != nil {
		t.Fatal(err)
	}
	m := costmodel.New(costmodel.Config{})
	for _, r := range w.Requests[:1000] {
		m.Observe(r.Prompt, r.Output, r.Service())
	}
	f := m.Fit()
	if !f.Ready {
		t.Fatalf("fit not ready: %+v", f)
	}
	for i, e := range relCoefErrs(f, DefaultCostTruth()) {
		if e > 1e-6 {
			t.Errorf("%s off by %g (%+v)", coefNames[i], e, f)
		}
	}
	if math.Abs(f.R2-1) > 1e-9 {
		t.Errorf("R² %v, want 1", f.R2)
	}
}

// TestCostModelOnCostMix: on CostMix's requests in arrival order, with
// busy times from 0.5 s + 0.1 ms/prompt token + 4 ms/output token and ±5%
// noise, for each of 10 seeds: every coefficient within 5% after 1000
// requests, and within 5% of the new model 2000 requests after the
// output-token time doubles.
//
// On seed004's mix the prompt-token time is not identified that well: a
// prompt there adds 1.5 s at most to 10-20 s of output whose noise swamps
// it, and prompt and output sizes move together across callers, so over
// seeds 1-8 its error reaches 8% after 1000 requests and 16% after the
// change (overhead and output-token time stay within 5%).
func TestCostModelOnCostMix(t *testing.T) {
	var worst, worstAfter [3]float64
	for seed := uint64(1); seed <= 10; seed++ {
		w, err := Generate(CostMix(), seed)
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Requests) < 3000 {
			t.Fatalf("seed %d: %d requests, want 3000", seed, len(w.Requests))
		}
		rng := rand.New(rand.NewPCG(seed, 4))
		c := CostTruth{Overhead: 500 * time.Millisecond, PerPrompt: 100 * time.Microsecond, PerOutput: 4 * time.Millisecond, Noise: 0.05}
		m := costmodel.New(costmodel.Config{})
		observe := func(rs []Request) {
			for _, r := range rs {
				m.Observe(r.Prompt, r.Output, c.Sample(r.Prompt, r.Output, rng))
			}
		}
		observe(w.Requests[:1000])
		f := m.Fit()
		if !f.Ready {
			t.Fatalf("seed %d: fit after 1000 not ready: %+v", seed, f)
		}
		for i, e := range relCoefErrs(f, c) {
			worst[i] = math.Max(worst[i], e)
			if e > 0.05 {
				t.Errorf("seed %d: after 1000 requests %s off by %.1f%%", seed, coefNames[i], 100*e)
			}
		}
		c.PerOutput *= 2
		observe(w.Requests[1000:3000])
		f = m.Fit()
		if !f.Ready {
			t.Fatalf("seed %d: fit after the change not ready: %+v", seed, f)
		}
		for i, e := range relCoefErrs(f, c) {
			worstAfter[i] = math.Max(worstAfter[i], e)
			if e > 0.05 {
				t.Errorf("seed %d: 2000 requests after the change %s off by %.1f%%", seed, coefNames[i], 100*e)
			}
		}
	}
	t.Logf("worst relative errors over 10 seeds: after 1000 %.4f; after the change %.4f", worst, worstAfter)
}

// DefaultCostTruth is the simulator's fixed slot model (Request.Service):
// 30 ms + 0.05 ms per prompt token + 15 ms per output token, noise-free.
func DefaultCostTruth() CostTruth {
	return CostTruth{Overhead: 30 * time.Millisecond, PerPrompt: 50 * time.Microsecond, PerOutput: 15 * time.Millisecond}
}

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
