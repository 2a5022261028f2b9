package costmodel

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkObserve is the per-request cost on the completion path.
func BenchmarkObserve(b *testing.B) {
	m := New(Config{})
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 1024
	var p, q [n]int64
	var y [n]time.Duration
	for i := range n {
		p[i], q[i] = 100+rng.Int64N(7901), 10+rng.Int64N(391)
		y[i] = groundTruth.busy(rng, p[i], q[i])
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m.Observe(p[i%n], q[i%n], y[i%n])
		i++
	}
}

// BenchmarkFit is a read of the fit: the unconstrained solve, or all
// eight NNLS subsets when a coefficient must be clamped.
func BenchmarkFit(b *testing.B) {
	for _, tc := range []struct {
		name string
		a    float64
	}{{"unconstrained", 0.5}, {"clamped", -0.03}} {
		b.Run(tc.name, func(b *testing.B) {
			m := New(Config{})
			rng := rand.New(rand.NewPCG(1, 1))
			feed(m, rng, truth{a: tc.a, b: 100e-6, c: 4e-3}, 2000)
			if f := m.Fit(); !f.Ready || (tc.a < 0) != (f.Clamped != 0) {
				b.Fatalf("unexpected fit: %+v", f)
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = m.Fit()
			}
		})
	}
}
