package caddyfairqueue

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// QuotaConfig is a tenant's quota (package quota): a request rate, a token
// rate, and the joint meter that weighs tokens against requests, each with
// an elastic burst window. quota_defaults sets only the shape fields.
type QuotaConfig struct {
	// QPS is the tenant's request rate, requests per second. 0: no request
	// limit.
	QPS float64 `json:"qps,omitempty"`
	// TokensPerMin is the tenant's token rate: estimated tokens (prompt +
	// output cap) charged at dispatch, corrected to the usage reported when
	// the response ends. 0: no token limit.
	TokensPerMin float64 `json:"tokens_per_min,omitempty"`
	// TokenToQPSWeight is how many request-equivalents one token weighs in
	// the joint meter. Default 0.0008 (1250 tokens weigh one request).
	TokenToQPSWeight *float64 `json:"token_to_qps_weight,omitempty"`
	// TokenToQPSWeightAuto takes the weight from the queue's learned cost
	// model instead (TokenToQPSWeight or 0.0008 until the fit is ready).
	TokenToQPSWeightAuto bool `json:"token_to_qps_weight_auto,omitempty"`
	// JointCap scales qps into the joint meter's rate of request-
	// equivalents per second; 0 turns the joint meter off. Default 1.0
	// when qps is set.
	JointCap *float64 `json:"joint_cap,omitempty"`
	// BurstWindow is how long a tenant may run burst_allow above its
	// rates before it is held to them and pays the excess back. Default
	// 10s.
	BurstWindow caddy.Duration `json:"burst_window,omitempty"`
	// BurstAllow is the fraction above the rates a burst may run. Default
	// 0.2; 0 with burst_window 0 means no burst at all.
	BurstAllow *float64 `json:"burst_allow,omitempty"`
}

// The quota shape where neither quota_defaults nor the tenant says
// otherwise.
const (
	defaultTokenToQPSWeight = 0.0008
	defaultJointCap         = 1.0
	defaultBurstWindow      = 10 * time.Second
	defaultBurstAllow       = 0.2
)

// checkDefaults refuses rates in quota_defaults: a default rate would
// silently put every tenant, declared or not, under a quota.
func (c *QuotaConfig) checkDefaults() error {
	if c != nil && (c.QPS != 0 || c.TokensPerMin != 0) {
		return fmt.Errorf("quota_defaults: qps and tokens_per_min belong in a tenant's quota, not in the defaults (which set token_to_qps_weight, joint_cap, burst_window and burst_allow)")
	}
	return nil
}

// quotaAuto reports whether a tenant's quota takes its joint weight from
// the learned cost model; the tenant's own weight wins over an auto
// default.
func quotaAuto(t, defaults *QuotaConfig) bool {
	return t != nil && t.TokenToQPSWeight == nil &&
		(t.TokenToQPSWeightAuto || defaults != nil && defaults.TokenToQPSWeightAuto)
}

// compileQuota merges a tenant's quota over the defaults and compiles it;
// nil when the tenant has none.
func compileQuota(who string, t, defaults *QuotaConfig) (*quota.Limits, error) {
	if t == nil {
		return nil, nil
	}
	c := quota.Config{QPS: t.QPS, TokensPerMin: t.TokensPerMin,
		TokenToQPSWeight: defaultTokenToQPSWeight, JointCap: defaultJointCap,
		BurstWindow: defaultBurstWindow, BurstAllow: defaultBurstAllow}
	for _, src := range []*QuotaConfig{defaults, t} {
		if src == nil {
			continue
		}
		if src.TokenToQPSWeight != nil {
			c.TokenToQPSWeight = *src.TokenToQPSWeight
		}
		if src.JointCap != nil {
			c.JointCap = *src.JointCap
		}
		if src.BurstWindow != 0 {
			c.BurstWindow = time.Duration(src.BurstWindow)
		}
		if src.BurstAllow != nil {
			c.BurstAllow = *src.BurstAllow
			if c.BurstAllow == 0 {
				c.BurstWindow = 0 // "burst_allow 0": no burst, whatever the window
			}
		}
	}
	if c.QPS == 0 {
		// The joint meter's rate is qps x joint_cap: without qps, a token
		// quota alone.
		c.JointCap = 0
	}
	l, err := c.Compile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	return l, nil
}

// setRateLimitHeaders writes OpenAI's x-ratelimit-* headers from a
// tenant's quota status. Requests are reported from the stricter of the
// request and joint meters, tokens from the token meter; a dimension the
// quota does not meter gets no headers.
func setRateLimitHeaders(h http.Header, st quota.Status) {
	req := st.Requests
	if j := st.Joint; j.Enabled {
		if !req.Enabled {
			req = j
		} else {
			req.Remaining = min(req.Remaining, j.Remaining)
			req.Reset = max(req.Reset, j.Reset)
		}
	}
	meters := [2]quota.MeterStatus{req, st.Tokens}
	n := 0
	for _, m := range meters {
		if m.Enabled {
			n += 3
		}
	}
	if n == 0 {
		return
	}
	// Canonical keys, the values in one allocation.
	vals := make([]string, 0, n)
	for k, m := range meters {
		if !m.Enabled {
			continue
		}
		vals = append(vals, strconv.FormatInt(m.Limit, 10), strconv.FormatInt(m.Remaining, 10), resetString(m.Reset))
		for j, key := range rateLimitKeys[k] {
			i := len(vals) - 3 + j
			h[key] = vals[i : i+1 : i+1]
		}
	}
}

// rateLimitKeys are the headers setRateLimitHeaders writes: limit,
// remaining and reset of requests, then of tokens.
var rateLimitKeys = [2][3]string{
	{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}

// rateLimitHeaders are the headers setRateLimitHeaders writes.
var rateLimitHeaders = append(rateLimitKeys[0][:], rateLimitKeys[1][:]...)

// resetString formats a reset time as OpenAI does ("1s", "6m0s", "17ms"),
// rounded up to the millisecond.
func resetString(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}

// quotaStanding fills in the tenant's quota standing of the gateway's own
// answer, for its x-ratelimit-* headers, unless it carries one.
func (h *Handler) quotaStanding(a *admission, e *apiError) {
	if e.quota != nil || a == nil || a.tc.Quota == nil || h.shared == nil {
		return
	}
	if st, ok := h.shared.q.QuotaStatus(a.tenant); ok {
		e.quota = &st
	}
}
