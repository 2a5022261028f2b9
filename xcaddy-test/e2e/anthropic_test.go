package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// The official Anthropic TypeScript client against the gateway, the way
// Claude users drive it: Anthropic's Messages API on /v1/messages, the
// gateway in front of a model server that speaks it (the fake's
// anthropic.go).

const anthropicTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 2
		tenant claude weight 1 class interactive
		tenant streamer weight 1 class interactive {
			quota tokens_per_min 6000000
		}
		tenant metered weight 1 class interactive wait_budget 500ms {
			quota tokens_per_min 60000 burst_allow 0
		}
		default_tenant reject
		reverse_proxy {{.Upstreams}}
	}
}
`

// anthropicStep is a step of client.mjs's plan.
type anthropicStep struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Kind      string `json:"kind"`
	MaxTokens int    `json:"max_tokens"`
	Retries   int    `json:"retries"`
	IgnoreEOS *bool  `json:"ignore_eos,omitempty"`
}

// anthropicMessage is the part of a message the test reads.
type anthropicMessage struct {
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type  string            `json:"type"`
		Text  string            `json:"text"`
		ID    string            `json:"id"`
		Name  string            `json:"name"`
		Input map[string]string `json:"input"`
	} `json:"content"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// anthropicResult is what client.mjs reports for one step.
type anthropicResult struct {
	ID      string            `json:"id"`
	OK      bool              `json:"ok"`
	Ms      int               `json:"ms"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Message anthropicMessage  `json:"message"`
	First   anthropicMessage  `json:"first"`
	Events  map[string]int    `json:"events"`
	Text    string            `json:"text"`
	// The error's, when not OK: its class, and what the SDK read of the
	// body (type, details.error_code, message).
	Class            string `json:"class"`
	PermissionDenied bool   `json:"permission_denied"`
	RateLimited      bool   `json:"rate_limited"`
	Type             string `json:"type"`
	ErrorCode        string `json:"error_code"`
	APIMessage       string `json:"api_message"`
	ErrMessage       string `json:"error_message"`
}

// runAnthropicClient runs the official Anthropic client (installed by
// scripts/test.sh with npm ci in xcaddy-test/anthropic-client) on a plan.
func runAnthropicClient(t *testing.T, base string, plan []anthropicStep) []anthropicResult {
	t.Helper()
	p, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	out := harness.NodeClient(t, "../anthropic-client", "@anthropic-ai/sdk", "FQ_BASE="+base, "FQ_PLAN="+string(p))
	var res []anthropicResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("client output: %v: %s", err, out)
	}
	if len(res) != len(plan) {
		t.Fatalf("client reported %d steps, want %d: %s", len(res), len(plan), out)
	}
	return res
}

// TestAnthropicClient drives the official Anthropic client through the
// gateway: a message, a streamed message whose usage (input tokens in
// message_start, output tokens in message_delta) is what the gateway
// accounts, exactly, a tool call and its result, an unknown tenant refused
// with 403 that the SDK raises as PermissionDeniedError, and a 429
// quota_exceeded the SDK retries by itself after retry-after-ms, served.
func TestAnthropicClient(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 1, "claude", harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 100 * time.Microsecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, anthropicTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 2, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	no := false
	plan := []anthropicStep{
		{ID: "message", Tenant: "claude", Kind: "message", MaxTokens: 12},
		// Without ignore_eos the fake stops at its 16 tokens, far below the
		// 200 the estimate counted: the back-fill has work to do.
		{ID: "stream", Tenant: "streamer", Kind: "stream", MaxTokens: 200, IgnoreEOS: &no},
		{ID: "tools", Tenant: "claude", Kind: "tools", MaxTokens: 5},
		{ID: "stranger", Tenant: "stranger", Kind: "message", MaxTokens: 5, Retries: 2},
		// quotaTokens at 60000 a minute: each request is a second of quota.
		{ID: "quota-a", Tenant: "metered", Kind: "message", MaxTokens: quotaTokens},
		{ID: "quota-b", Tenant: "metered", Kind: "message", MaxTokens: quotaTokens, Retries: 2},
		{ID: "quota-c", Tenant: "metered", Kind: "message", MaxTokens: quotaTokens},
	}
	res := runAnthropicClient(t, base, plan)
	recs := records(t, fakes...)
	byID := map[string]anthropicResult{}
	for _, r := range res {
		byID[r.ID] = r
		if !r.OK {
			continue
		}
		// Every served answer's usage is the fake's own count.
		answers := map[string]anthropicMessage{r.ID: r.Message}
		if r.ID == "tools" {
			answers = map[string]anthropicMessage{"tools": r.First, "tools-result": r.Message}
		}
		for id, msg := range answers {
			rec, ok := recs[id]
			if !ok || msg.Usage.InputTokens != rec.PromptTokens || msg.Usage.OutputTokens != rec.OutputTokens {
				t.Errorf("%s: usage %+v, the fake counted %d in / %d out", id, msg.Usage, rec.PromptTokens, rec.OutputTokens)
			}
		}
		if r.Headers["x-fair-queue-cost"] == "" || r.Headers["x-fair-queue-wait-ms"] == "" {
			t.Errorf("%s: headers %v; want X-Fair-Queue-Cost and X-Fair-Queue-Wait-Ms", r.ID, r.Headers)
		}
	}

	m := byID["message"]
	if !m.OK || m.Status != http.StatusOK || m.Message.StopReason != "max_tokens" || len(m.Message.Content) != 1 ||
		m.Message.Content[0].Type != "text" || m.Message.Content[0].Text != strings.Repeat("tok ", 12) {
		t.Errorf("message: %+v; want 12 tokens of text, stop max_tokens", m)
	}

	s := byID["stream"]
	wantEvents := map[string]int{"message_start": 1, "content_block_start": 1, "content_block_delta": 16,
		"content_block_stop": 1, "message_delta": 1, "message_stop": 1}
	for name, n := range wantEvents {
		if s.Events[name] != n {
			t.Errorf("stream: %d %s events, want %d (all: %v)", s.Events[name], name, n, s.Events)
		}
	}
	if !s.OK || s.Message.StopReason != "end_turn" || s.Text != strings.Repeat("tok ", 16) || s.Message.Usage.OutputTokens != 16 {
		t.Errorf("stream: %+v; want 16 tokens streamed, end_turn, usage of 16 output tokens", s)
	}
	// The gateway's accounting is the usage the stream reported: prompt
	// tokens from message_start, output tokens from message_delta, not the
	// estimate (prompt estimate + the 200-token cap) it charged at dispatch.
	rec := recs["stream"]
	used := float64(rec.PromptTokens + rec.OutputTokens)
	scr := scrape(t, c)
	if got := metric(scr, "caddy_fair_queue_actual_tokens_total", "tenant", "streamer"); got != used {
		t.Errorf("actual_tokens_total{streamer} = %v, want the stream's usage %v (%d in + %d out)", got, used, rec.PromptTokens, rec.OutputTokens)
	}
	if got := metric(scr, "caddy_fair_queue_quota_charged_total", "tenant", "streamer", "meter", "tokens"); got != used {
		t.Errorf("quota_charged_total{streamer, tokens} = %v, want the stream's usage %v: the dispatch's charge reconciled", got, used)
	}
	if est, _ := strconv.Atoi(s.Headers["x-fair-queue-cost"]); est < 200 || float64(est) == used {
		t.Errorf("stream: X-Fair-Queue-Cost %q; want the estimate, at least the 200-token cap", s.Headers["x-fair-queue-cost"])
	}

	tl := byID["tools"]
	if !tl.OK || tl.First.StopReason != "tool_use" || len(tl.First.Content) != 1 || tl.First.Content[0].Type != "tool_use" ||
		tl.First.Content[0].Name != "get_weather" || tl.First.Content[0].Input["query"] != strings.Repeat("tok ", 5) {
		t.Errorf("tools: first answer %+v; want a call of get_weather", tl.First)
	}
	if !tl.OK || len(tl.Message.Content) != 1 || tl.Message.Content[0].Type != "text" {
		t.Errorf("tools: answer to the tool's result %+v; want text", tl.Message)
	}
	if r, ok := recs["tools-result"]; !ok || !strings.Contains(r.Body, `"tool_result"`) || !strings.Contains(r.Body, tl.First.Content[0].ID) {
		t.Errorf("tools: the fake saw %+v; want the tool_result for the call's id", r)
	}

	// 403 for a tenant the gateway does not know: the SDK's
	// PermissionDeniedError, with the gateway's code and message, not
	// retried.
	st := byID["stranger"]
	if st.OK || st.Status != http.StatusForbidden || !st.PermissionDenied || st.Type != "permission_error" ||
		st.ErrorCode != "unknown_tenant" || !strings.Contains(st.APIMessage, `"stranger"`) || !strings.Contains(st.ErrMessage, st.APIMessage) {
		t.Errorf("stranger: %+v; want PermissionDeniedError 403, type permission_error, error_code unknown_tenant, the gateway's message", st)
	}
	if _, ok := recs["stranger"]; ok {
		t.Errorf("stranger reached the upstream")
	}

	t.Logf("observed: the SDK's message for the 403: %q", st.ErrMessage)
	a, b, cc := byID["quota-a"], byID["quota-b"], byID["quota-c"]
	t.Logf("observed: quota-b served after %d ms (the 429 said retry-after-ms %s for quota-c)", b.Ms, cc.Headers["retry-after-ms"])
	if !a.OK || a.Headers["x-ratelimit-limit-tokens"] != "60000" {
		t.Errorf("quota-a: %+v; want served with x-ratelimit-limit-tokens 60000", a)
	}
	// b arrives with about a second of debt, past its 500 ms budget:
	// refused, then retried by the SDK after retry-after-ms, served.
	if !b.OK || b.Ms < 500 {
		t.Errorf("quota-b: %+v; want served after the SDK waited out a quota_exceeded (>= 500 ms)", b)
	}
	if cc.OK || cc.Status != http.StatusTooManyRequests || !cc.RateLimited || cc.Type != "rate_limit_error" ||
		cc.ErrorCode != "quota_exceeded" || cc.Headers["retry-after-ms"] == "" || cc.Headers["x-ratelimit-limit-tokens"] != "60000" {
		t.Errorf("quota-c (no retries): %+v; want RateLimitError 429, error_code quota_exceeded, retry-after-ms and x-ratelimit headers", cc)
	}
	if n := metric(scr, "caddy_fair_queue_quota_limited_total", "tenant", "metered", "reason", "tokens", "action", "refused"); n != 2 {
		t.Errorf("quota_limited_total refused = %v, want 2 (b's first try, c)", n)
	}
	if n := metric(scr, "caddy_fair_queue_requests_total", "tenant", "metered", "outcome", "served"); n != 2 {
		t.Errorf("metered served = %v, want 2 (a, b's retry)", n)
	}
	if n := metric(scr, "caddy_fair_queue_requests_total", "tenant", "_unknown", "outcome", "unknown_tenant"); n != 1 {
		t.Errorf("unknown_tenant answers = %v, want 1 (the SDK does not retry a 403)", n)
	}
}
