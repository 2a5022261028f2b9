package caddyfairqueue

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// UpstreamQuotaConfig is the provider account behind the inner
// reverse_proxy: its requests and tokens per minute. Dispatch is gated by
// it as by slots, so that no 60 s window gets more than the limits. A
// provider 429 never reaches a client: the request is requeued at the
// head of its tenant's queue, uncharged.
type UpstreamQuotaConfig struct {
	// TPM is the account's tokens per minute; 0: no token limit.
	TPM float64 `json:"tpm,omitempty"`
	// RPM is the account's requests per minute; 0: no request limit.
	RPM float64 `json:"rpm,omitempty"`
	// Burst is how far ahead of its rates the account may be drawn after
	// an idle period (its rates are spread over 61s plus the burst).
	// Default 2s.
	Burst caddy.Duration `json:"burst,omitempty"`
	// ReserveBurst is how much of its reservation a reserved tenant may
	// draw at once while shared traffic holds the account at its limit.
	// Default 6s.
	ReserveBurst caddy.Duration `json:"reserve_burst,omitempty"`
}

func (c *UpstreamQuotaConfig) engine() *fairqueue.UpstreamQuota {
	if c == nil {
		return nil
	}
	return &fairqueue.UpstreamQuota{RPM: c.RPM, TPM: c.TPM, Burst: time.Duration(c.Burst), ReserveBurst: time.Duration(c.ReserveBurst)}
}

// parseShare reads a share written as a fraction (0.2) or a percentage
// (20%).
func parseShare(v string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	if strings.HasSuffix(v, "%") {
		f /= 100
	}
	return f, err
}

// parseReserve reads a reservation: "20%" or a fraction "0.2".
func parseReserve(v string) (float64, error) {
	f, err := parseShare(v)
	if err != nil || !(f > 0 && f < 1) {
		return 0, fmt.Errorf("reserve %q must be a share of the upstream quota between 0 and 1 (e.g. 20%% or 0.2)", v)
	}
	return f, nil
}

var (
	providerRefusals = counterVec("provider_refusals_total",
		"Provider 429s kept from clients: the request went back to its tenant's queue, uncharged.",
		"queue", "tenant")
	descUpstreamRemaining = prometheus.NewDesc(fqName("upstream_quota_remaining"),
		"What the provider account has left to send at once, by meter (requests, tokens) and bucket (pool, or reserve:<tenant>).", []string{"queue", "bucket", "meter"}, nil)
	descUpstreamExhausted = prometheus.NewDesc(fqName("upstream_exhausted_seconds"),
		"How long the provider still declares the account out of quota (its 429 or x-ratelimit-remaining 0); 0 when it does not.", []string{"queue"}, nil)
	descUpstreamWindow = prometheus.NewDesc(fqName("upstream_window_used_ratio"),
		"What this gateway sent to the provider account in the last 60 s, as the provider counts it (prompt + output cap; requests), over the account's limit per minute, by meter (tokens, requests): kept at or below 1 whatever window the provider keeps.", []string{"queue", "meter"}, nil)
	descUpstreamProvider = prometheus.NewDesc(fqName("upstream_provider_remaining"),
		"What the provider last reported left of the account (x-ratelimit-remaining-*), less what was sent since and plus the refill, by meter; absent while no report is in force. Nothing is sent beyond it.", []string{"queue", "meter"}, nil)
)

// collectUpstream reports a queue's provider account at scrape time.
func collectUpstream(ch chan<- prometheus.Metric, name string, st fairqueue.UpstreamStatus) {
	if !st.Configured {
		return
	}
	gauge(ch, descUpstreamExhausted, st.ExhaustedFor.Seconds(), name)
	if st.TPM > 0 {
		gauge(ch, descUpstreamWindow, float64(st.WindowTokens)/st.TPM, name, "tokens")
	}
	if st.RPM > 0 {
		gauge(ch, descUpstreamWindow, float64(st.WindowRequests)/st.RPM, name, "requests")
	}
	if !math.IsNaN(st.ProviderTokens) {
		gauge(ch, descUpstreamProvider, st.ProviderTokens, name, "tokens")
	}
	if !math.IsNaN(st.ProviderRequests) {
		gauge(ch, descUpstreamProvider, st.ProviderRequests, name, "requests")
	}
	bucket := func(b string, s quota.Status) {
		if s.Requests.Enabled {
			gauge(ch, descUpstreamRemaining, float64(s.Requests.Remaining), name, b, "requests")
		}
		if s.Tokens.Enabled {
			gauge(ch, descUpstreamRemaining, float64(s.Tokens.Remaining), name, b, "tokens")
		}
	}
	bucket("pool", st.Pool)
	for tenant, s := range st.Reserved {
		bucket("reserve:"+tenant, s)
	}
}
