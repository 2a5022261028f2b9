package caddyfairqueue

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// A full quota config: quota_defaults, a tenant with a tier and a quota
// block, default_tenant with one, in the Caddyfile and in step with JSON.
func TestCaddyfileQuota(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		quota_defaults {
			token_to_qps_weight 0.0008
			joint_cap 1.0
			burst_window 10s  burst_allow 0.2
		}
		tenant app1 weight 10 class interactive tier high {
			quota qps 200 tokens_per_min 200000
		}
		default_tenant weight 1 class batch tier low {
			quota qps 20 tokens_per_min 20000 burst_allow 0
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	d := h.QuotaDefaults
	if d == nil || *d.TokenToQPSWeight != 0.0008 || *d.JointCap != 1 || d.BurstWindow != dur(10*time.Second) || *d.BurstAllow != 0.2 {
		t.Fatalf("quota_defaults: %+v", d)
	}
	app := h.Tenants["app1"]
	if app.Tier != "high" || app.Quota == nil || app.Quota.QPS != 200 || app.Quota.TokensPerMin != 200000 {
		t.Fatalf("app1: %+v quota %+v", app, app.Quota)
	}
	if h.DefaultTenant.Tier != "low" || h.DefaultTenant.Quota.QPS != 20 || *h.DefaultTenant.Quota.BurstAllow != 0 {
		t.Fatalf("default_tenant: %+v", h.DefaultTenant)
	}
	h.setDefaults()
	cfg, err := h.queueConfig()
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.Tenants["app1"].Quota
	if l == nil || !l.Enabled(quota.DimQPS) || !l.Enabled(quota.DimTokens) || !l.Enabled(quota.DimJoint) || l.Tolerance() != 2*time.Second {
		t.Fatalf("app1 limits: %+v", l)
	}
	if dl := cfg.Default.Quota; dl == nil || dl.Tolerance() != 0 {
		t.Fatalf("default_tenant limits: %+v (burst_allow 0 means no burst)", dl)
	}
}

// A token quota alone has no joint meter (its rate is qps x joint_cap), and
// a quota out of range is refused naming the tenant and the field.
func TestQuotaCompile(t *testing.T) {
	l, err := compileQuota("tenant a: quota", &QuotaConfig{TokensPerMin: 1000}, nil)
	if err != nil || l.Enabled(quota.DimJoint) || l.Enabled(quota.DimQPS) || !l.Enabled(quota.DimTokens) {
		t.Fatalf("tokens only: %v %+v", err, l)
	}
	_, err = compileQuota(`tenant "a": quota`, &QuotaConfig{QPS: 10, BurstAllow: ptr(500.0)}, nil)
	if err == nil || !strings.Contains(err.Error(), `tenant "a": quota`) || !strings.Contains(err.Error(), "burst_allow") {
		t.Fatalf("burst_allow 500: %v", err)
	}
	if err := (&QuotaConfig{QPS: 1}).checkDefaults(); err == nil {
		t.Fatal("a rate in quota_defaults was accepted")
	}
}

func TestCaddyfileQuotaErrors(t *testing.T) {
	for _, tc := range []struct{ input, want string }{
		{"tenant a {\nquota\n}", "quota sets no rate"},
		{"tenant a {\nquota qps\n}", "missing value after qps"},
		{"tenant a {\nquota qps -1\n}", `qps "-1" must be a number >= 0`},
		{"tenant a {\nquota qps 1 qps 2\n}", "qps given twice"},
		{"tenant a {\nquota qps 1\nquota qps 2\n}", "quota given twice"},
		{"tenant a {\nquota rps 1\n}", `unknown setting "rps"`},
		{"tenant a {\nlimits 1\n}", `unknown line "limits"`},
		{"tenant a {\nquota qps 1 burst_window soon\n}", "burst_window"},
		{"quota_defaults {\nqps 5\n}", "qps belongs in a tenant's quota"},
		{"quota_defaults {\njoint_cap 1\njoint_cap 2\n}", "joint_cap given twice"},
		{"quota_defaults x", "unexpected argument"},
		{"quota_defaults { joint_cap 1 }", "closing brace must be on a line of its own"},
		{"default_tenant reject {\nquota qps 1\n}", "unexpected block"},
	} {
		_, err := parseBlock("fair_queue {\nreverse_proxy a:1\n" + tc.input + "\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.input, err, tc.want)
		}
	}
}

// The headers follow OpenAI's: per minute limits, remaining, and reset as
// a Go duration rounded up to the millisecond; requests from the stricter
// of the request and joint meters; an upstream's own headers are replaced.
func TestRateLimitHeaders(t *testing.T) {
	st := quota.Status{
		Requests: quota.MeterStatus{Enabled: true, Limit: 600, Remaining: 9, Reset: 1500 * time.Microsecond},
		Joint:    quota.MeterStatus{Enabled: true, Limit: 600, Remaining: 4, Reset: 3 * time.Second},
		Tokens:   quota.MeterStatus{Enabled: true, Limit: 60000, Remaining: 123, Reset: 6 * time.Minute},
	}
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Requests", "10000") // the upstream's
	setRateLimitHeaders(h, st)
	want := map[string]string{
		"X-Ratelimit-Limit-Requests": "600", "X-Ratelimit-Remaining-Requests": "4", "X-Ratelimit-Reset-Requests": "3s",
		"X-Ratelimit-Limit-Tokens": "60000", "X-Ratelimit-Remaining-Tokens": "123", "X-Ratelimit-Reset-Tokens": "6m0s",
	}
	for k, v := range want {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s: %q, want [%q]", k, got, v)
		}
	}
	if got := resetString(1500 * time.Microsecond); got != "2ms" {
		t.Errorf("reset 1.5ms: %q, want 2ms (rounded up)", got)
	}
	h = http.Header{}
	setRateLimitHeaders(h, quota.Status{Tokens: st.Tokens})
	if h.Get("X-Ratelimit-Limit-Requests") != "" || h.Get("X-Ratelimit-Limit-Tokens") != "60000" {
		t.Errorf("tokens-only quota: %v", h)
	}
}

func TestCaddyfileCircuitBreak(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		tenant app1 tier high
		tenant bulk tier low
		circuit_break {
			trigger 1.3
			recover 1.0
			hold 10s
			window 5s
			saturation 80%
			order low mid high
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	cb := h.CircuitBreak
	if cb == nil || cb.Trigger != 1.3 || cb.Recover != 1 || cb.Hold != dur(10*time.Second) || cb.Window != dur(5*time.Second) ||
		cb.Saturation != 0.8 || strings.Join(cb.Order, " ") != "low mid high" {
		t.Fatalf("circuit_break: %+v", cb)
	}
	h.setDefaults()
	cfg, err := h.queueConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Circuit == nil || cfg.Tenants["bulk"].Tier != "low" {
		t.Fatalf("engine config: %+v %+v", cfg.Circuit, cfg.Tenants["bulk"])
	}
	// A tier the order does not name is refused when the config is checked.
	h.Tenants["bulk"].Tier = "bronze"
	cfg, _ = h.queueConfig()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `tier "bronze" is not in circuit_break's order`) {
		t.Fatalf("unknown tier: %v", err)
	}
	for _, tc := range []struct{ input, want string }{
		{"circuit_break {\ntrigger 1.3\n}", "missing 'order"},
		{"circuit_break {\norder low\n}", "at least two tiers"},
		{"circuit_break {\norder a b\ntrigger x\n}", `trigger "x" must be a positive number`},
		{"circuit_break {\norder a b\nhold 1s\nhold 2s\n}", "hold given twice"},
		{"circuit_break {\norder a b\nspeed 1\n}", `unknown setting "speed" (want trigger, recover, hold, window, saturation or order)`},
		{"circuit_break {\norder a b\nsaturation 1.5\n}", `saturation "1.5" must be a share of the window in (0, 1]`},
		{"circuit_break {\norder a b\nsaturation 0\n}", `saturation "0" must be a share`},
	} {
		_, err := parseBlock("fair_queue {\nreverse_proxy a:1\n" + tc.input + "\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.input, err, tc.want)
		}
	}
}

func TestCaddyfileQuotaAutoWeight(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		quota_defaults {
			token_to_qps_weight auto
		}
		tenant a {
			quota qps 10
		}
		tenant b {
			quota qps 10 token_to_qps_weight 0.001
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	h.setDefaults()
	cfg, err := h.queueConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Tenants["a"].QuotaAutoWeight || cfg.Tenants["b"].QuotaAutoWeight || !h.quotaAuto {
		t.Fatalf("auto: a %v, b %v (its own weight wins), handler %v", cfg.Tenants["a"].QuotaAutoWeight, cfg.Tenants["b"].QuotaAutoWeight, h.quotaAuto)
	}
	if w := cfg.Tenants["a"].Quota.Config().TokenToQPSWeight; w != defaultTokenToQPSWeight {
		t.Fatalf("a's weight before the fit %v, want the default", w)
	}
}
