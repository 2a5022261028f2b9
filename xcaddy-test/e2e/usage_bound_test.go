package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// lyingUpstream is a model server that reports usage of 2147483647
// completion tokens on every answer: OpenAI's JSON, OpenAI's stream
// (usage in the last chunk) or, on /v1/messages, Anthropic's JSON. It runs
// in the test process: an adversarial upstream, not a model.
func lyingUpstream(t *testing.T) string {
	const completion = 2147483647
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Fake-Upstream", "liar")
		switch {
		case r.URL.Path == "/v1/messages":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi"}],`+
				`"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":%d}}`, completion)
		case strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n")
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+
				"\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", completion, completion+12)
			fmt.Fprint(w, "data: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],`+
				`"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`, completion, completion+12)
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestLyingUsageBounded: through the binary, an upstream reporting
// completion_tokens 2147483647 for a JSON answer, a stream and an
// Anthropic answer is charged at most max_request_tokens (4096) each.
// Afterwards the tenant's token quota (10000/s) is in debt for at most
// 3 x 4096 tokens' worth, 1.23 s (not 2.5 days), the provider account
// (10000/s, 6 s burst) has tokens left (not none for days), every clamp
// is counted, and another tenant is served within a 2 s budget.
func TestLyingUsageBounded(t *testing.T) {
	t.Parallel()
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_request_tokens 4096
		upstream_quota tpm 600000
		tenant liar weight 1 class interactive {
			quota tokens_per_min 600000
		}
		tenant bystander weight 1 class interactive
		reverse_proxy {{.Upstream}}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstream": lyingUpstream(t)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	reqs := []chatReq{
		{Tenant: "liar", TestID: "json", MaxTokens: 16},
		{Tenant: "liar", TestID: "sse", MaxTokens: 16, Stream: true, IncludeUsage: true},
		{Tenant: "liar", TestID: "anthropic", Path: "/v1/messages",
			Body: []byte(`{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`)},
	}
	for i, rq := range reqs {
		r := send(context.Background(), defaultClient, base, rq)
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("%s: %v", rq.TestID, r)
		}
		// The answer is complete before the handler has charged it: wait
		// for the charge.
		waitMetricEq(t, c, float64(i+1), "caddy_fair_queue_usage_clamped_total", "tenant", "liar")
	}
	s := scrape(t, c)
	if a := metric(s, "caddy_fair_queue_actual_tokens_total", "tenant", "liar"); a != 3*4096 {
		t.Errorf("actual_tokens_total %v, want 3 x 4096 (the bound each)", a)
	}
	if d := metric(s, "caddy_fair_queue_quota_debt_seconds", "tenant", "liar", "meter", "tokens"); d > 1.23 {
		t.Errorf("the tenant's token quota is %v s in debt, want at most 1.23 s", d)
	}
	if left := metric(s, "caddy_fair_queue_upstream_quota_remaining", "bucket", "pool", "meter", "tokens"); left <= 0 {
		t.Errorf("the provider account has %v tokens left after three lies: it is exhausted", left)
	}
	r := send(context.Background(), defaultClient, base, chatReq{Tenant: "bystander", TestID: "bystander", MaxTokens: 16,
		Header: map[string]string{"X-Wait-Budget": "2s"}})
	if r.Err != nil || r.Status != http.StatusOK {
		t.Errorf("another tenant after the lies: %v, want 200", r)
	}
}
