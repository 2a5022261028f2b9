package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// lyingUpstream answers every request with usage of prompt and completion
// tokens: OpenAI's JSON, OpenAI's stream (usage in the last chunk), or,
// on /v1/messages, Anthropic's JSON.
func lyingUpstream(tb testing.TB, prompt, completion int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.URL.Path == "/v1/messages":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi"}],`+
				`"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":%d}}`, prompt, completion)
		case strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n")
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+
				"\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", prompt, completion, prompt+completion)
			fmt.Fprint(w, "data: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],`+
				`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, prompt, completion, prompt+completion)
		}
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// usageCase is one shape of response the bound applies to.
type usageCase struct {
	name, path string
	body       []byte
}

var usageCases = []usageCase{
	{"json", "/v1/chat/completions", chatBody("")},
	{"sse", "/v1/chat/completions", chatBody(`"stream":true,"stream_options":{"include_usage":true}`)},
	{"anthropic", "/v1/messages", []byte(`{"model":"m","max_tokens":32,"messages":[{"role":"user","content":"Say hello."}]}`)},
}

// An upstream reporting completion_tokens 2147483647 is charged at the
// request's bound, max(2 x its estimate, max_request_tokens) = 4096
// tokens, for a JSON answer, a stream and an Anthropic answer: the
// tenant's quota and the provider account are each in debt for about 4 s
// of their 1000 tokens/s (not 24 days), every clamp is counted, and
// another tenant is served at once afterwards.
func TestReportedUsageClamped(t *testing.T) {
	for _, c := range usageCases {
		t.Run(c.name, func(t *testing.T) {
			up := lyingUpstream(t, 20, 2147483647)
			queue := queueName(t)
			h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","max_request_tokens":4096,`+
				`"upstream_quota":{"tpm":60000},"default_tenant":{"quota":{"tokens_per_min":60000}},`+
				`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}}`, queue, strings.TrimPrefix(up.URL, "http://")))
			g := newGateway(t, h)
			post := func(tenant string) result {
				r := g.newRequest(t.Context(), tenant, c.body, "X-Wait-Budget", "2s")
				r.URL.Path = c.path
				return g.do(r)
			}
			res := post("liar")
			wantOK(t, res)
			g.entry(res) // the handler has charged it
			if n := counterValue(usageClamped, queue, unknownTenantLabel); n != 1 {
				t.Errorf("usage_clamped_total = %v, want 1", n)
			}
			// 4096 tokens at 1000 tokens/s: 4.1 s of debt, less the
			// burst the meter forgives, plus the time the test takes.
			const most = 5 * time.Second
			st, _ := h.shared.q.QuotaStatus("liar")
			if st.Tokens.Reset > most {
				t.Errorf("the tenant's token quota is in debt for %v, want at most %v", st.Tokens.Reset, most)
			}
			if pool := h.shared.q.Upstream().Pool; pool.Tokens.Reset > most {
				t.Errorf("the provider account is exhausted for %v, want at most %v", pool.Tokens.Reset, most)
			}
			wantOK(t, post("bystander"))
		})
	}
}

// A flood of lying answers is counted one by one and logged once a
// minute.
func TestClampedUsageLoggedOnceAMinute(t *testing.T) {
	up := lyingUpstream(t, 20, 1_000_000)
	queue := queueName(t)
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","max_request_tokens":4096,`+
		`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}}`, queue, strings.TrimPrefix(up.URL, "http://")))
	core, logs := observer.New(zap.WarnLevel)
	h.usageLog = clampLogger(zap.New(core))
	g := newGateway(t, h)
	for range 30 {
		res := g.post("liar", chatBody(""))
		wantOK(t, res)
		g.entry(res)
	}
	if n := counterValue(usageClamped, queue, unknownTenantLabel); n != 30 {
		t.Errorf("usage_clamped_total = %v, want 30", n)
	}
	if n := logs.Len(); n != 1 {
		t.Errorf("%d lines logged for 30 clamps in a minute, want 1", n)
	}
	e := logs.All()[0].ContextMap()
	if e["tenant"] != "liar" || e["reported_completion_tokens"] != int64(1_000_000) || e["charged_tokens"] != int64(4096) {
		t.Errorf("the line says %v", e)
	}
}

// Honest usage is charged as reported, beyond twice the estimate too,
// up to max_request_tokens.
func TestHonestUsageNotClamped(t *testing.T) {
	up := lyingUpstream(t, 20, 3000) // a request without max_tokens may run long
	queue := queueName(t)
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","max_request_tokens":4096,`+
		`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}}`, queue, strings.TrimPrefix(up.URL, "http://")))
	g := newGateway(t, h)
	res := g.post("honest", []byte(`{"model":"m","messages":[{"role":"user","content":"Tell me a long story."}]}`))
	wantOK(t, res)
	g.entry(res)
	if n := counterValue(usageClamped, queue, unknownTenantLabel); n != 0 {
		t.Errorf("usage_clamped_total = %v for usage within max_request_tokens, want 0", n)
	}
	if got := counterValue(actualTokens, queue, unknownTenantLabel); got != 3020 {
		t.Errorf("actual_tokens_total = %v, want the 3020 reported", got)
	}
}
