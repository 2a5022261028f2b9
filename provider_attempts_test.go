package caddyfairqueue

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Regression tests of the provider paths: each once failed.

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

// A huge or infinite wait in a provider's headers is clamped to ten
// minutes (maxProviderWait), not overflowed into a tiny or negative wait
// that would send the next request straight into the provider's 429: as
// seconds or milliseconds past what a Duration holds, as an HTTP date
// years ahead, and as a reset time of a dimension at 0.
func TestProviderWaitOverflow(t *testing.T) {
	const clamp = 10 * time.Minute
	far := time.Now().AddDate(5, 0, 0).UTC().Format(http.TimeFormat)
	for _, hdr := range []map[string]string{
		{"Retry-After": "1e10"},
		{"Retry-After": "Inf"},
		{"Retry-After": "99999999999"},
		{"Retry-After": "1e300"},
		{"Retry-After": far},
		{"Retry-After-Ms": "1e10"},
		{"Retry-After-Ms": "Inf"},
		{"Retry-After-Ms": "99999999999999"},
		{"Retry-After-Ms": "1e300"},
		{"X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "1e300"},
		{"X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "2562047h"},
	} {
		h := http.Header{}
		for k, v := range hdr {
			h.Set(k, v)
		}
		if got := providerWait(h, http.StatusTooManyRequests); got != clamp {
			t.Errorf("429 with %v: wait %v, want the clamp, %v", hdr, got, clamp)
		}
	}
}
