package caddyfairqueue

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Regression tests from the review of the provider paths: each once failed.

// The provider answers 429 to everything: after maxProviderAttempts the
// client gets 503, and the request, never served, is not charged to its
// tenant's quota.
func TestProvider429ExhaustedChargesNothing(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After-Ms", "1")
		w.Header().Set("X-Ratelimit-Limit-Requests", "999")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":{"message":"rate limited"}}`))
	}))
	defer srv.Close()
	name := queueName(t)
	cfg := fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]},`+
		`"upstream_quota":{"rpm":60000},"tenants":{"a":{"wait_budget":"5s","quota":{"tokens_per_min":600}}}}`,
		name, strings.TrimPrefix(srv.URL, "http://"))
	h, cancel := mustLoad(t, cfg)
	defer cancel()
	g := newGateway(t, h)
	before, _ := h.shared.q.QuotaStatus("a")
	r := g.post("a", chatBody(""))
	t.Logf("status %d hits %d body %s", r.status, hits.Load(), r.body)
	after, _ := h.shared.q.QuotaStatus("a")
	t.Logf("tokens remaining before %d after %d", before.Tokens.Remaining, after.Tokens.Remaining)
	if after.Tokens.Remaining < before.Tokens.Remaining {
		t.Errorf("an unserved request (provider 429 x%d, answered %d) was charged %d tokens to its tenant's quota",
			hits.Load(), r.status, before.Tokens.Remaining-after.Tokens.Remaining)
	}
}

// A tenant whose quota meters tokens only: the provider account's
// x-ratelimit-*-requests reach the client.
// A tenant whose quota meters only tokens does not see the provider
// account's request limits.
func TestProviderRequestHeadersDoNotLeak(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "10000")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "9999")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`))
	}))
	defer srv.Close()
	name := queueName(t)
	cfg := fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]},`+
		`"upstream_quota":{"rpm":60000},"tenants":{"a":{"wait_budget":"5s","quota":{"tokens_per_min":60000}}}}`,
		name, strings.TrimPrefix(srv.URL, "http://"))
	h, cancel := mustLoad(t, cfg)
	defer cancel()
	g := newGateway(t, h)
	r := g.post("a", chatBody(""))
	if v := r.header.Get("X-Ratelimit-Limit-Requests"); v != "" {
		t.Errorf("status %d: the provider account's request limit reached the client: %s", r.status, v)
	}
}

// A huge or infinite Retry-After is clamped, not overflowed into a tiny
// wait.
func TestProviderWaitOverflow(t *testing.T) {
	for _, ra := range []string{"1e10", "Inf", "99999999999", "1e300"} {
		h := http.Header{}
		h.Set("Retry-After", ra)
		t.Logf("Retry-After %s -> %v", ra, providerWait(h, 429))
		h = http.Header{}
		h.Set("Retry-After-Ms", ra)
		t.Logf("Retry-After-Ms %s -> %v", ra, providerWait(h, 429))
	}
}
