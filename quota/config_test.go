package quota_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

func TestValidateAcceptsSeedConfig(t *testing.T) {
	if err := quotatest.SeedCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []quota.Config{
		{QPS: 1},
		{TokensPerMin: 1000},
		{QPS: 5, TokenToQPSWeight: 0.001, JointCap: 2},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestValidateNamesEachProblem(t *testing.T) {
	for _, tc := range []struct {
		cfg  quota.Config
		want []string
	}{
		{quota.Config{}, []string{"neither qps nor tokens_per_min"}},
		{quota.Config{QPS: -1}, []string{"qps is -1", ">= 0"}},
		{quota.Config{QPS: math.NaN()}, []string{"qps is NaN"}},
		{quota.Config{QPS: 1, TokensPerMin: math.Inf(1)}, []string{"tokens_per_min is +Inf"}},
		{quota.Config{QPS: 2e9}, []string{"qps is 2e+09", "at most"}},
		{quota.Config{TokensPerMin: 100, JointCap: 1, TokenToQPSWeight: 0.001}, []string{"joint_cap is 1 but qps is 0"}},
		{quota.Config{QPS: 10, JointCap: 1}, []string{"token_to_qps_weight is 0"}},
		{quota.Config{QPS: 10, BurstAllow: 0.2}, []string{"burst_allow 0.2 and burst_window 0s must both be set"}},
		{quota.Config{QPS: 10, BurstWindow: time.Second}, []string{"must both be set"}},
		{quota.Config{QPS: 10, BurstWindow: -time.Second, BurstAllow: 0.1}, []string{"burst_window is -1s"}},
		{quota.Config{QPS: 10, BurstAllow: -0.1, BurstWindow: time.Second}, []string{"burst_allow is -0.1"}},
		// Several problems are all reported.
		{quota.Config{QPS: -1, JointCap: -2, BurstAllow: math.NaN()}, []string{"qps is -1", "joint_cap is -2", "burst_allow is NaN"}},
	} {
		err := tc.cfg.Validate()
		if err == nil {
			t.Errorf("%+v: no error, want %q", tc.cfg, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not contain %q", tc.cfg, err, w)
			}
		}
		if _, cerr := tc.cfg.Compile(); cerr == nil {
			t.Errorf("%+v: Compile accepted an invalid config", tc.cfg)
		}
	}
}

func TestIncrements(t *testing.T) {
	l := quota.MustCompile(quotatest.SeedCfg)
	for _, tc := range []struct {
		d      quota.Dimension
		tokens int64
		want   time.Duration
	}{
		{quota.DimQPS, 20000, 5 * time.Millisecond},                  // 1/200 s
		{quota.DimTokens, 20000, 6 * time.Second},                    // 20000 / (200000/60) s
		{quota.DimJoint, 20000, 85 * time.Millisecond},               // (1 + 16) / 200 s
		{quota.DimJoint, 0, 5 * time.Millisecond},                    // a request with no tokens is 1
		{quota.DimTokens, -5, 0},                                     // negative tokens count as none
		{quota.Dimension("nope"), 1, 0},                              // unknown dimension
		{quota.DimJoint, 1250, 10 * time.Millisecond},                // 1250 tokens weigh one request
		{quota.DimTokens, 1, 300 * time.Microsecond},                 // 60 s / 200000
		{quota.DimQPS, 0, time.Second / 200},                         // size does not matter for qps
		{quota.DimTokens, 1 << 62, time.Duration(quota.MaxInc)},      // capped, no overflow
		{quota.DimJoint, math.MaxInt64, time.Duration(quota.MaxInc)}, // capped, no overflow
		{quota.DimQPS, math.MaxInt64, 5 * time.Millisecond},          // qps ignores size
		{quota.DimTokens, 3333, 999900 * time.Microsecond},           // rounding once
		{quota.DimJoint, 625, 7500 * time.Microsecond},               // 1.5 request-equivalents
		{quota.DimTokens, 200000, 60 * time.Second},                  // a minute's worth
		{quota.DimJoint, 250000, 1005 * time.Millisecond},            // 201 request-equivalents
		{quota.DimTokens, 0, 0},                                      // nothing to charge
		{quota.DimJoint, -1, 5 * time.Millisecond},                   // negative tokens count as none
		{quota.DimQPS, -1, 5 * time.Millisecond},                     // still one request
		{quota.DimTokens, 7, 2100 * time.Microsecond},                // 7 x 300 us
		{quota.DimJoint, 1, 5*time.Millisecond + 4*time.Microsecond}, // 0.0008 x 5 ms per token
	} {
		if got := l.Increment(tc.d, tc.tokens); got != tc.want {
			t.Errorf("Increment(%s, %d) = %v, want %v", tc.d, tc.tokens, got, tc.want)
		}
	}
	if got := l.Tolerance(); got != 2*time.Second {
		t.Errorf("Tolerance = %v, want 2s", got)
	}
	if !l.Enabled(quota.DimQPS) || !l.Enabled(quota.DimTokens) || !l.Enabled(quota.DimJoint) || l.Enabled("x") {
		t.Error("Enabled: want qps, tokens, joint on and unknown off")
	}
	off := quota.MustCompile(quota.Config{QPS: 3})
	if off.Enabled(quota.DimTokens) || off.Enabled(quota.DimJoint) || off.Increment(quota.DimTokens, 10) != 0 {
		t.Error("meters without a rate must be off and cost nothing")
	}
	if off.Config() != (quota.Config{QPS: 3}) {
		t.Error("Config does not return the compiled config")
	}
}

func TestLimitsScale(t *testing.T) {
	l := quota.MustCompile(quotatest.SeedCfg)
	if l.Scale(1) != l || l.Scale(0) != l || l.Scale(2) != l || l.Scale(math.NaN()) != l {
		t.Error("Scale outside (0, 1) must return the limits themselves")
	}
	s := l.Scale(1.0 / 3)
	if s == l {
		t.Fatal("Scale(1/3) returned the unscaled limits")
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*b }
	if got, want := s.Config().QPS, quotatest.SeedCfg.QPS/3; !near(got, want) {
		t.Errorf("scaled qps %v, want %v", got, want)
	}
	if got, want := s.Config().TokensPerMin, quotatest.SeedCfg.TokensPerMin/3; !near(got, want) {
		t.Errorf("scaled tokens_per_min %v, want %v", got, want)
	}
	if s.Tolerance() != l.Tolerance() {
		t.Errorf("scaled tolerance %v, want the same time %v (the burst volume scales with the rate)", s.Tolerance(), l.Tolerance())
	}
	for _, d := range []quota.Dimension{quota.DimQPS, quota.DimTokens, quota.DimJoint} {
		full, part := l.Increment(d, 1000), s.Increment(d, 1000)
		if diff := part - 3*full; diff < -3 || diff > 3 {
			t.Errorf("%s: scaled increment %v, want 3 x %v within rounding", d, part, full)
		}
	}
	if l.Scale(1.0/3) != s {
		t.Error("Scale(1/3) twice: not cached")
	}
	if n := testing.AllocsPerRun(100, func() { _ = l.Scale(1.0 / 3) }); n != 0 {
		t.Errorf("cached Scale allocates %v times per call", n)
	}
	// A rate at Validate's floor still scales (an instance's share of a
	// tiny quota is a smaller, valid rate).
	tiny := quota.MustCompile(quota.Config{QPS: quota.MinRate})
	if got := tiny.Scale(0.5).Config().QPS; got != quota.MinRate/2 {
		t.Errorf("tiny qps scaled to %v, want %v", got, quota.MinRate/2)
	}
}
