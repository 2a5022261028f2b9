package costmodel

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// truth is a ground-truth service-time model: busy = a + b·prompt +
// c·completion seconds, times a noise factor uniform in [1-noise, 1+noise]
// (mean 1, so least squares is unbiased).
type truth struct {
	a, b, c float64
	noise   float64
}

func (g truth) busy(rng *rand.Rand, p, q int64) time.Duration {
	y := g.a + g.b*float64(p) + g.c*float64(q)
	y *= 1 + g.noise*(2*rng.Float64()-1)
	return time.Duration(y * float64(time.Second))
}

// feed observes n requests with prompts uniform in [100, 8000] and
// completions in [10, 400], drawn independently.
func feed(m *Model, rng *rand.Rand, g truth, n int) {
	for range n {
		p := 100 + rng.Int64N(7901)
		q := 10 + rng.Int64N(391)
		m.Observe(p, q, g.busy(rng, p, q))
	}
}

// relErrs are |fitted/true - 1| for a, b and c.
func relErrs(f Fit, g truth) [3]float64 {
	return [3]float64{
		math.Abs(f.Overhead/g.a - 1),
		math.Abs(f.PerPromptToken/g.b - 1),
		math.Abs(f.PerCompletionToken/g.c - 1),
	}
}

var coefNames = [3]string{"overhead", "per prompt token", "per completion token"}

// groundTruth: a 0.5 s overhead, 0.1 ms per prompt token and 4 ms per
// completion token; a mean request (4050, 205) is 0.5 + 0.4 + 0.8 s, so
// each coefficient carries a visible share of busy time.
var groundTruth = truth{a: 0.5, b: 100e-6, c: 4e-3, noise: 0.05}

// TestRecoversAndTracksGroundTruth: with ±5% multiplicative noise, every
// coefficient is within 5% of the truth after 1000 requests, and within 5%
// of a new truth (per-completion-token time doubled) 2000 requests after
// the change, for each of 20 seeds.
func TestRecoversAndTracksGroundTruth(t *testing.T) {
	const tol = 0.05
	var worst, worstAfter [3]float64
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 13))
		m := New(Config{})
		g := groundTruth
		feed(m, rng, g, 1000)
		f := m.Fit()
		if !f.Ready || f.Status != StatusReady || f.Samples != 1000 {
			t.Fatalf("seed %d: fit after 1000 not ready: %+v", seed, f)
		}
		if f.R2 < 0.9 || f.R2 > 1 {
			t.Errorf("seed %d: R² %v, want in [0.9, 1]", seed, f.R2)
		}
		for i, e := range relErrs(f, g) {
			worst[i] = math.Max(worst[i], e)
			if e > tol {
				t.Errorf("seed %d: %s off by %.1f%% after 1000 requests (fit %+v)", seed, coefNames[i], 100*e, f)
			}
		}

		g.c *= 2
		feed(m, rng, g, 2000)
		f = m.Fit()
		if !f.Ready {
			t.Fatalf("seed %d: fit after the change not ready: %+v", seed, f)
		}
		for i, e := range relErrs(f, g) {
			worstAfter[i] = math.Max(worstAfter[i], e)
			if e > tol {
				t.Errorf("seed %d: %s off by %.1f%% 2000 requests after c doubled (fit %+v)", seed, coefNames[i], 100*e, f)
			}
		}
	}
	t.Logf("worst relative errors over 20 seeds: after 1000 %.4f, after the change %.4f", worst, worstAfter)
}

// TestForgettingIsWhatTracks: the same change with a memory far longer
// than the run leaves the fit well off the new truth, so the tracking above
// is the forgetting's doing.
func TestForgettingIsWhatTracks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 13))
	m := New(Config{Memory: 1 << 30})
	g := groundTruth
	feed(m, rng, g, 1000)
	g.c *= 2
	feed(m, rng, g, 2000)
	if e := relErrs(m.Fit(), g)[2]; e < 0.1 {
		t.Errorf("without forgetting c is off by only %.1f%% after the change; the test would not show tracking", 100*e)
	}
}

// TestExactData: noise-free data, including sizes a million tokens large
// that vary by 10% (where raw sums of squares would cancel), is fitted to
// 1e-6 relative error (busy times are whole nanoseconds) with R² 1.
func TestExactData(t *testing.T) {
	cases := []struct {
		name       string
		pLo, pSpan int64
		qLo, qSpan int64
	}{
		{"typical", 100, 7900, 10, 390},
		{"large and narrow", 1_000_000, 100_000, 200_000, 20_000},
	}
	g := truth{a: 0.25, b: 30e-6, c: 7e-3}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(2, 3))
			m := New(Config{})
			for range 3000 {
				p := tc.pLo + rng.Int64N(tc.pSpan+1)
				q := tc.qLo + rng.Int64N(tc.qSpan+1)
				m.Observe(p, q, g.busy(rng, p, q))
			}
			f := m.Fit()
			if !f.Ready || f.Clamped != 0 {
				t.Fatalf("not ready or clamped: %+v", f)
			}
			for i, e := range relErrs(f, g) {
				if e > 1e-6 {
					t.Errorf("%s off by %g", coefNames[i], e)
				}
			}
			if math.Abs(f.R2-1) > 1e-9 {
				t.Errorf("R² %v, want 1", f.R2)
			}
		})
	}
}

// TestDegenerateInputs: data that cannot identify every coefficient gives
// Ready false, a status naming the cause, zero coefficients, and finite
// derived values (Cost falls back to prompt + completion).
func TestDegenerateInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	size := func() int64 { return 10 + rng.Int64N(2000) }
	cases := []struct {
		name string
		obs  func() (int64, int64, time.Duration)
		want Status
	}{
		{"constant prompt", func() (int64, int64, time.Duration) {
			q := size()
			return 512, q, time.Duration(q) * time.Millisecond
		}, StatusFlatPrompt},
		{"constant completion", func() (int64, int64, time.Duration) {
			p := size()
			return p, 256, time.Duration(p) * time.Millisecond
		}, StatusFlatCompletion},
		{"completion tied to prompt", func() (int64, int64, time.Duration) {
			p := 10 * size()
			return p, p / 10, time.Duration(p) * time.Millisecond
		}, StatusCollinear},
		{"zero busy", func() (int64, int64, time.Duration) {
			return size(), size(), 0
		}, StatusNoCompletionTime},
		{"constant busy", func() (int64, int64, time.Duration) {
			return size(), size(), time.Second
		}, StatusNoCompletionTime},
		{"busy falls with output", func() (int64, int64, time.Duration) {
			q := size()
			return size(), q, time.Duration(3000-q) * time.Millisecond
		}, StatusNoCompletionTime},
		{"zero tokens", func() (int64, int64, time.Duration) {
			return 0, 0, time.Duration(rng.Int64N(int64(time.Second)))
		}, StatusFlatPrompt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{})
			for range 2000 {
				m.Observe(tc.obs())
			}
			f := m.Fit()
			if f.Ready || f.Status != tc.want {
				t.Fatalf("status %v ready %v, want %v not ready: %+v", f.Status, f.Ready, tc.want, f)
			}
			if f.Overhead != 0 || f.PerPromptToken != 0 || f.PerCompletionToken != 0 || f.R2 != 0 {
				t.Errorf("not-ready fit carries coefficients: %+v", f)
			}
			if got, busy := f.Cost(300, 200), f.BusyCost(300, 200); got != 500 || busy != 500 {
				t.Errorf("Cost(300, 200) = %v, BusyCost %v, want the tokens fallback 500", got, busy)
			}
			if got := f.TokenToQPSWeight(); got != 0 {
				t.Errorf("TokenToQPSWeight = %v, want 0", got)
			}
			if got := f.Predict(300, 200); got != 0 {
				t.Errorf("Predict = %v, want 0", got)
			}
			assertFinite(t, f)
		})
	}
}

// TestWarmingUp: below MinSamples the fit waits, then becomes Ready at
// exactly MinSamples.
func TestWarmingUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	m := New(Config{MinSamples: 50})
	if f := m.Fit(); f.Ready || f.Status != StatusWarmingUp || f.Samples != 0 || f.Effective != 0 {
		t.Fatalf("empty model: %+v", f)
	}
	feed(m, rng, groundTruth, 49)
	if f := m.Fit(); f.Ready || f.Status != StatusWarmingUp || f.Samples != 49 {
		t.Fatalf("after 49: %+v", f)
	}
	feed(m, rng, groundTruth, 1)
	if f := m.Fit(); !f.Ready || f.Status != StatusReady || f.Samples != 50 {
		t.Fatalf("after 50: %+v", f)
	}
}

// TestRejectsOutOfRange: negative, over-large and over-long observations
// are counted and leave the statistics untouched; the bounds themselves
// are accepted.
func TestRejectsOutOfRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	m := New(Config{})
	feed(m, rng, groundTruth, 1000)
	before := m.Fit()
	bad := []struct {
		p, q int64
		busy time.Duration
	}{
		{-1, 10, time.Second},
		{10, -1, time.Second},
		{10, 10, -time.Nanosecond},
		{math.MaxInt64, 10, time.Second},
		{10, math.MaxInt64, time.Second},
		{DefaultMaxTokens + 1, 10, time.Second},
		{10, 10, DefaultMaxBusy + 1},
		{10, 10, math.MaxInt64},
		{math.MinInt64, math.MinInt64, math.MinInt64},
	}
	for _, o := range bad {
		m.Observe(o.p, o.q, o.busy)
	}
	after := m.Fit()
	if after.Rejected != len(bad) {
		t.Errorf("Rejected = %d, want %d", after.Rejected, len(bad))
	}
	after.Rejected = before.Rejected
	if after != before {
		t.Errorf("rejected observations changed the fit:\n%+v\n%+v", before, after)
	}
	m.Observe(DefaultMaxTokens, DefaultMaxTokens, DefaultMaxBusy)
	f := m.Fit()
	if f.Samples != 1001 || f.Rejected != len(bad) {
		t.Errorf("observation at the bounds not accepted: %+v", f)
	}
	assertFinite(t, f)
}

// TestNonNegative: data whose least-squares intercept is negative gets a
// zero overhead, reported in Clamped, and the best non-negative per-token
// times; the request-unit weights are then undefined (0) while Cost is not.
func TestNonNegative(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	m := New(Config{})
	for range 2000 {
		p := 100 + rng.Int64N(4000)
		q := 50 + rng.Int64N(500)
		// busy = -0.1 s + 20 µs·p + 10 ms·q: an unconstrained fit would
		// report a = -0.1 s exactly.
		sec := -0.1 + 20e-6*float64(p) + 10e-3*float64(q)
		m.Observe(p, q, time.Duration(sec*float64(time.Second)))
	}
	f := m.Fit()
	if !f.Ready || f.Clamped != CoefOverhead || f.Overhead != 0 {
		t.Fatalf("want a ready fit with the overhead clamped to 0: %+v", f)
	}
	if !(f.PerPromptToken >= 0 && f.PerCompletionToken > 0) {
		t.Errorf("per-token times must be non-negative: %+v", f)
	}
	if f.R2 >= 1 || f.R2 < 0.9 {
		t.Errorf("R² %v: the clamped fit cannot be exact, but should explain most", f.R2)
	}
	if w := f.TokenToQPSWeight(); w != 0 {
		t.Errorf("TokenToQPSWeight = %v with a zero overhead, want 0", w)
	}
	if f.PromptWeight() != 0 || f.CompletionWeight() != 0 {
		t.Errorf("per-request weights with a zero overhead: %v %v", f.PromptWeight(), f.CompletionWeight())
	}
	if c := f.Cost(1000, 100); !(c > 100) || math.IsInf(c, 0) {
		t.Errorf("Cost(1000, 100) = %v", c)
	}
	// The clamped solution is the NNLS optimum: nudging any free
	// coefficient either way, or the clamped one up, raises the residual.
	s := m.st
	beta := [3]float64{f.Overhead, f.PerPromptToken, f.PerCompletionToken}
	base := s.rss(beta)
	for i := range 3 {
		for _, sign := range []float64{-1, 1} {
			if i == 0 && sign < 0 {
				continue
			}
			b := beta
			b[i] += sign * 1e-3 * math.Max(math.Abs(b[i]), 1e-6)
			if s.rss(b) < base {
				t.Errorf("moving %s by %g lowers the residual: not the NNLS optimum", coefNames[i], b[i]-beta[i])
			}
		}
	}
}

// TestDerivedWeights pins the formulas on a fit given by hand.
func TestDerivedWeights(t *testing.T) {
	f := Fit{Overhead: 0.2, PerPromptToken: 1e-4, PerCompletionToken: 0.02,
		MeanPrompt: 1000, MeanCompletion: 200, Ready: true}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-12*math.Abs(want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// One token of the mix: (0.1 + 4)/1200 s; in units of a = 0.2 s.
	near("TokenToQPSWeight", f.TokenToQPSWeight(), 4.1/1200/0.2)
	// A mean request is charged 1 + 1200·w = (0.2 + 0.1 + 4)/0.2.
	near("mean request in request-equivalents", 1+1200*f.TokenToQPSWeight(), 4.3/0.2)
	near("PromptWeight", f.PromptWeight(), 1e-4/0.2)
	near("CompletionWeight", f.CompletionWeight(), 0.02/0.2)
	near("PromptCostRatio", f.PromptCostRatio(), 1e-4/0.02)
	near("Cost", f.Cost(1000, 200), 1000*1e-4/0.02+200)
	// (0.2 + 0.1)/0.02 + 200: the fitted 4.3 s in 20 ms output tokens.
	near("BusyCost", f.BusyCost(1000, 200), 4.3/0.02)
	if got, want := f.Predict(1000, 200), 4300*time.Millisecond; got != want {
		t.Errorf("Predict = %v, want %v", got, want)
	}
	if got := f.Predict(math.MaxInt64, math.MaxInt64); got != time.Duration(math.MaxInt64) {
		t.Errorf("Predict of absurd sizes = %v, want saturation", got)
	}
}

// TestJSON: statuses and clamped sets are strings for the admin API.
func TestJSON(t *testing.T) {
	b, err := json.Marshal(Fit{Status: StatusFlatPrompt, Clamped: CoefOverhead | CoefPrompt})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"status":"flat_prompt"`, `"clamped":"overhead,prompt_token"`, `"overhead_seconds":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	for s := StatusReady; s <= StatusNoCompletionTime; s++ {
		if strings.HasPrefix(s.String(), "status(") {
			t.Errorf("status %d has no name", s)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
	bad := Config{Memory: 1, MinSamples: -1, MinSpread: math.NaN(), MaxCondition: 0.5, MaxTokens: -1, MaxBusy: -1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"memory 1", "min_samples -1", "min_spread NaN", "max_condition 0.5", "max_tokens -1", "max_busy -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("New accepted an invalid config")
		}
	}()
	New(bad)
}

// TestConcurrentUse runs Observe and Fit from several goroutines (for the
// race detector) and checks no observation is lost.
func TestConcurrentUse(t *testing.T) {
	m := New(Config{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 500 {
				feed(m, rng, groundTruth, 1)
				if i%50 == 0 {
					assertFinite(t, m.Fit())
				}
			}
		})
	}
	wg.Wait()
	if f := m.Fit(); f.Samples != 2000 || !f.Ready {
		t.Errorf("after 4x500 concurrent observations: %+v", f)
	}
}

// TestObserveAllocatesNothing: the hot path's promise, counted, not timed.
func TestObserveAllocatesNothing(t *testing.T) {
	m := New(Config{})
	var i int64
	if n := testing.AllocsPerRun(1000, func() {
		i++
		m.Observe(100+i%900, 10+i%90, time.Duration(i)*time.Millisecond)
	}); n != 0 {
		t.Errorf("Observe allocates %v times per call", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = m.Fit() }); n != 0 {
		t.Errorf("Fit allocates %v times per call", n)
	}
}

// FuzzObserve: any sequence of observations, under any valid config,
// leaves every reported number finite.
func FuzzObserve(f *testing.F) {
	f.Add([]byte{}, uint16(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}, uint16(2))
	f.Add([]byte(strings.Repeat("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c", 40)), uint16(3))
	f.Add([]byte(strings.Repeat("\x00\x00\x00\x01\xff\xff\xff\x00\x00\x00\x10\x00", 200)), uint16(50))
	f.Fuzz(func(t *testing.T, data []byte, memory uint16) {
		m := New(Config{Memory: 2 + int(memory), MinSamples: 3})
		// Each 12 bytes are one observation: 4 bytes each, scaled over
		// the whole accepted range and a bit beyond it.
		for len(data) >= 12 {
			u := func(b []byte) int64 {
				return int64(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
			}
			p, q, y := u(data[0:4]), u(data[4:8]), u(data[8:12])
			m.Observe(p<<1>>3, q<<1>>3, time.Duration(y)*time.Microsecond)
			data = data[12:]
			assertFinite(t, m.Fit())
		}
	})
}

// TestAdversarialSequences drives the fit through extremes the fuzz
// corpus may not reach: alternating bounds, a single outlier among
// constants, and decay of an old spread to nothing.
func TestAdversarialSequences(t *testing.T) {
	seqs := map[string]func(i int) (int64, int64, time.Duration){
		"alternating bounds": func(i int) (int64, int64, time.Duration) {
			if i%2 == 0 {
				return 0, 0, 0
			}
			return DefaultMaxTokens, DefaultMaxTokens, DefaultMaxBusy
		},
		"one outlier": func(i int) (int64, int64, time.Duration) {
			if i == 500 {
				return DefaultMaxTokens, 1, DefaultMaxBusy
			}
			return 1000, 100, time.Second
		},
		"spread decays away": func(i int) (int64, int64, time.Duration) {
			if i < 200 {
				return int64(100 + i), int64(10 + i%37), time.Duration(i) * time.Millisecond
			}
			return 700, 70, 700 * time.Millisecond
		},
		"tiny busy": func(i int) (int64, int64, time.Duration) {
			return int64(1 + i%1000), int64(1 + i%777), time.Duration(i % 3)
		},
	}
	for name, seq := range seqs {
		t.Run(name, func(t *testing.T) {
			m := New(Config{MinSamples: 2})
			for i := range 20000 {
				m.Observe(seq(i))
				if i%97 == 0 {
					assertFinite(t, m.Fit())
				}
			}
			assertFinite(t, m.Fit())
		})
	}
}

func assertFinite(t *testing.T, f Fit) {
	t.Helper()
	vals := map[string]float64{
		"overhead": f.Overhead, "prompt": f.PerPromptToken, "completion": f.PerCompletionToken,
		"r2": f.R2, "mean prompt": f.MeanPrompt, "mean completion": f.MeanCompletion,
		"effective": f.Effective, "weight": f.TokenToQPSWeight(), "prompt weight": f.PromptWeight(),
		"completion weight": f.CompletionWeight(), "ratio": f.PromptCostRatio(),
		"cost": f.Cost(DefaultMaxTokens, DefaultMaxTokens), "busy cost": f.BusyCost(DefaultMaxTokens, DefaultMaxTokens),
	}
	for name, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("%s is %v: %+v", name, v, f)
		}
	}
	if f.Overhead < 0 || f.PerPromptToken < 0 || f.PerCompletionToken < 0 {
		t.Fatalf("negative coefficient: %+v", f)
	}
	if f.Ready != (f.Status == StatusReady) {
		t.Fatalf("Ready %v with status %v", f.Ready, f.Status)
	}
	if f.Predict(1, 1) < 0 {
		t.Fatalf("negative prediction: %+v", f)
	}
}

// Predict is the fitted busy time of a request, or 0 unless Ready.
func (f Fit) Predict(prompt, completion int64) time.Duration {
	if !f.Ready {
		return 0
	}
	sec := f.Overhead + f.PerPromptToken*float64(prompt) + f.PerCompletionToken*float64(completion)
	if !(sec < float64(math.MaxInt64)/float64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Max(sec, 0) * float64(time.Second))
}

// BusyCost is a request's whole fitted busy time in output-token units,
// (a + b·prompt)/c + completion: Cost plus the overhead. Charged as the
// WFQ cost, tenants share upstream time including the per-request
// overhead, so a tenant of many tiny requests pays for each; Cost leaves
// the overhead out, as the token costs do. Unless Ready it is prompt +
// completion.
func (f Fit) BusyCost(prompt, completion int64) float64 {
	if !f.Ready {
		return f.Cost(prompt, completion)
	}
	return f.Overhead/f.PerCompletionToken + f.Cost(prompt, completion)
}

// PromptWeight and CompletionWeight are b/a and c/a: one prompt token and
// one completion token in request-equivalents. 0 unless Ready with a
// positive overhead.
func (f Fit) PromptWeight() float64 { return f.perRequest(f.PerPromptToken) }

// CompletionWeight is c/a; see PromptWeight.
func (f Fit) CompletionWeight() float64 { return f.perRequest(f.PerCompletionToken) }

func (f Fit) perRequest(x float64) float64 {
	if !f.Ready || !(f.Overhead > 0) {
		return 0
	}
	if w := x / f.Overhead; !math.IsInf(w, 0) {
		return w
	}
	return 0
}
