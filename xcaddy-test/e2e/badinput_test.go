package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestBadInput: every refusal of the HTTP contract (DESIGN section 8) has
// its status, its OpenAI-shaped error body, Retry-After where the client
// should come back, and never reaches an upstream.
func TestBadInput(t *testing.T) {
	t.Parallel()
	const slots = 2
	fakes := startFakes(t, 2, "bi", harness.FakeOptions{Slots: slots, TTFT: 10 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_body 1KB
		max_inflight {{.Slots}}
		tenant filler weight 1 class batch
		tenant small  weight 1 class batch max_queue 2
		tenant ok     weight 1 class batch
		default_tenant reject
		reverse_proxy {{.Upstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	capacity := 2 * slots
	waitMetricEq(t, c, float64(capacity), "caddy_fair_queue_capacity")
	ctx := context.Background()
	var refused []string // test ids that must never reach an upstream

	t.Run("malformed JSON", func(t *testing.T) {
		r := send(ctx, defaultClient, base, chatReq{Tenant: "ok", TestID: "malformed", Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}`)})
		e := expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
		t.Logf("400: %s", e.Message)
		refused = append(refused, "malformed")
	})

	t.Run("body too large", func(t *testing.T) {
		// Valid JSON, 2000 bytes: only its size is wrong (max_body 1KB).
		r := send(ctx, defaultClient, base, chatReq{Tenant: "ok", TestID: "too-large", Prompt: strings.Repeat("word ", 400)})
		e := expectError(t, r, 413, "request_too_large", "invalid_request_error", false)
		t.Logf("413: %s", e.Message)
		refused = append(refused, "too-large")
	})

	t.Run("unknown tenant", func(t *testing.T) {
		r := send(ctx, defaultClient, base, chatReq{Tenant: "mallory", TestID: "unknown-tenant", MaxTokens: 3})
		e := expectError(t, r, 403, "unknown_tenant", "permission_error", false)
		if !strings.Contains(e.Message, "mallory") {
			t.Errorf("the message should name the tenant: %q", e.Message)
		}
		r = send(ctx, defaultClient, base, chatReq{TestID: "no-tenant", MaxTokens: 3})
		e = expectError(t, r, 403, "unknown_tenant", "permission_error", false)
		t.Logf("403: %s", e.Message)
		refused = append(refused, "unknown-tenant", "no-tenant")
	})

	t.Run("tenant queue full", func(t *testing.T) {
		for _, f := range fakes {
			f.Pause()
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				for _, f := range fakes {
					f.Resume()
				}
			}
		}
		t.Cleanup(resume)
		held := fillSlots(t, base, "filler", "filler", capacity, fakes...)
		for i := range 2 {
			held = append(held, async(ctx, defaultClient, base, chatReq{Tenant: "small", TestID: fmt.Sprint("small-", i), MaxTokens: 3, IgnoreEOS: true}))
		}
		waitMetricEq(t, c, 2, "caddy_fair_queue_queue_depth", "tenant", "small")

		r := send(ctx, defaultClient, base, chatReq{Tenant: "small", TestID: "small-full", MaxTokens: 3, IgnoreEOS: true})
		e := expectError(t, r, 429, "tenant_queue_full", "rate_limit_error", true)
		t.Logf("429 (Retry-After %s): %s", r.Header.Get("Retry-After"), e.Message)
		refused = append(refused, "small-full")
		// Another tenant is not affected by small's cap.
		other := async(ctx, defaultClient, base, chatReq{Tenant: "ok", TestID: "ok-while-full", MaxTokens: 3, IgnoreEOS: true})
		held = append(held, other)
		waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "ok")

		resume()
		for i, ch := range held {
			expectServed(t, await(t, ch, fmt.Sprint("held request ", i)))
		}
	})

	t.Run("no healthy upstream", func(t *testing.T) {
		for _, f := range fakes {
			f.SetHealth(false)
		}
		waitMetric(t, c, "no healthy upstream, capacity 0", func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_healthy_upstreams") == 0 && metric(s, "caddy_fair_queue_capacity") == 0
		})
		r := send(ctx, defaultClient, base, chatReq{Tenant: "ok", TestID: "no-upstream", MaxTokens: 3})
		e := expectError(t, r, 503, "server_busy", "overloaded_error", true)
		t.Logf("503 (Retry-After %s): %s", r.Header.Get("Retry-After"), e.Message)
		refused = append(refused, "no-upstream")

		for _, f := range fakes {
			f.SetHealth(true)
		}
		waitMetricEq(t, c, float64(capacity), "caddy_fair_queue_capacity")
		expectServed(t, send(ctx, defaultClient, base, chatReq{Tenant: "ok", TestID: "recovered", MaxTokens: 3}))
	})

	recs := records(t, fakes...)
	for _, id := range refused {
		if r, ok := recs[id]; ok {
			t.Errorf("refused request %s reached an upstream: %+v", id, r)
		}
	}
	if len(refused) != 6 {
		t.Errorf("%d refusals checked, want 6: %v", len(refused), refused)
	}
	s := scrape(t, c)
	for _, want := range []struct {
		tenant, outcome string
	}{
		{"ok", "invalid_request"}, {"ok", "request_too_large"}, {"_unknown", "unknown_tenant"},
		{"small", "tenant_queue_full"}, {"ok", "server_busy"},
	} {
		n := metric(s, "caddy_fair_queue_requests_total", "tenant", want.tenant, "outcome", want.outcome)
		wantN := 1.0
		if want.outcome == "unknown_tenant" {
			wantN = 2
		}
		if n != wantN {
			t.Errorf("requests_total{tenant=%s,outcome=%s} = %v, want %v", want.tenant, want.outcome, n, wantN)
		}
	}
}
