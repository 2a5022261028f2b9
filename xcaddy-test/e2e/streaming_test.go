package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestStreamingAndBackfill: streamed responses pass through as they are
// generated, and the actual usage — reported in the stream, counted from
// the streamed text, or read from a JSON body — is what the gateway counts.
func TestStreamingAndBackfill(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 2, "st", harness.FakeOptions{Slots: 2, TTFT: 10 * time.Millisecond, PerToken: 20 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 2
		tenant su weight 1 class interactive
		tenant sc weight 1 class interactive
		tenant js weight 1 class interactive
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	waitMetricEq(t, c, 4, "caddy_fair_queue_capacity")
	fakeByName := map[string]*harness.Fake{}
	for _, f := range fakes {
		fakeByName[f.Name()] = f
	}
	actual := func(tenant string) float64 {
		return metric(scrape(t, c), "caddy_fair_queue_actual_tokens_total", "tenant", tenant)
	}
	ctx := context.Background()

	t.Run("stream with include_usage", func(t *testing.T) {
		const n = 150 // 150 x 20 ms: the stream runs for about 3 s
		before := actual("su")
		req := chatReq{Tenant: "su", TestID: "stream-usage", Prompt: "one two three four five six seven",
			MaxTokens: n, IgnoreEOS: true, Stream: true, IncludeUsage: true}
		resp, sse, _ := openStream(t, ctx, defaultClient, base, req)
		defer resp.Body.Close()
		checkFairQueueHeaders(t, resp.Header, n)
		fake := fakeByName[resp.Header.Get("X-Fake-Upstream")]
		if fake == nil {
			t.Fatalf("X-Fake-Upstream %q names no fake", resp.Header.Get("X-Fake-Upstream"))
		}

		first, err := sse.next()
		if err != nil {
			t.Fatalf("first event: %v", err)
		}
		if !strings.Contains(first, "tok ") {
			t.Errorf("first event carries no token: %s", first)
		}
		// The first chunk is here; the fake must still be generating.
		if st := fake.Stats(); st.Running != 1 || st.Completed != 0 {
			t.Errorf("after the first chunk the fake should still be generating: %+v", st)
		}
		recs := records(t, fake)
		if r := recs["stream-usage"]; r.Outcome != "in_flight" {
			t.Errorf("after the first chunk the fake's record should be in_flight: %+v", r)
		}

		events := []string{first}
		for {
			ev, err := sse.next()
			if err != nil {
				t.Fatalf("stream ended without [DONE] after %d events: %v", len(events), err)
			}
			events = append(events, ev)
			if ev == "[DONE]" {
				break
			}
		}
		// n token chunks, the finish chunk, the usage chunk, [DONE].
		if len(events) != n+3 {
			t.Errorf("%d events, want %d", len(events), n+3)
		}
		var last struct {
			Usage *chunkUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Usage == nil {
			t.Fatalf("the event before [DONE] carries no usage: %s (%v)", events[len(events)-2], err)
		}
		rec := records(t, fake)["stream-usage"]
		if last.Usage.CompletionTokens != n || last.Usage.PromptTokens != rec.PromptTokens {
			t.Errorf("usage %+v; the fake recorded prompt %d, output %d", *last.Usage, rec.PromptTokens, rec.OutputTokens)
		}
		want := before + float64(last.Usage.PromptTokens+last.Usage.CompletionTokens)
		waitMetric(t, c, fmt.Sprintf("actual_tokens_total{tenant=su} == %v", want), func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_actual_tokens_total", "tenant", "su") == want
		})
	})

	t.Run("stream without usage", func(t *testing.T) {
		// Without ignore_eos the fake stops after its default 16 tokens,
		// well short of max_tokens: the counted text must not be the cap.
		const maxTokens, n = 100, 16
		before := actual("sc")
		req := chatReq{Tenant: "sc", TestID: "stream-count", MaxTokens: maxTokens, Stream: true}
		resp, sse, _ := openStream(t, ctx, defaultClient, base, req)
		defer resp.Body.Close()
		cost := checkFairQueueHeaders(t, resp.Header, maxTokens)
		var events []string
		for {
			ev, err := sse.next()
			if err != nil {
				t.Fatalf("stream ended without [DONE] after %d events: %v", len(events), err)
			}
			events = append(events, ev)
			if ev == "[DONE]" {
				break
			}
		}
		for _, ev := range events {
			if strings.Contains(ev, `"usage"`) {
				t.Errorf("the stream was not asked for usage but carries it: %s", ev)
			}
		}
		if len(events) != n+2 {
			t.Errorf("%d events, want %d", len(events), n+2)
		}
		// Prompt: the gateway's estimate (the header's cost less the
		// output cap). Completion: counted from the streamed text, n
		// times "tok ", which a BPE tokenizer makes n to n+2 tokens.
		estPrompt := cost - maxTokens
		lo, hi := float64(estPrompt+n), float64(estPrompt+n+n/4+2)
		var got float64
		waitMetric(t, c, fmt.Sprintf("actual_tokens_total{tenant=sc} in [%v, %v] (+%v)", lo, hi, before), func(s harness.Series) bool {
			got = metric(s, "caddy_fair_queue_actual_tokens_total", "tenant", "sc") - before
			return got >= lo && got <= hi
		})
		t.Logf("counted: %v actual tokens (estimated prompt %d + %d streamed tokens of text)", got, estPrompt, n)
	})

	t.Run("non-streamed", func(t *testing.T) {
		const maxTokens = 50
		before := actual("js")
		r := send(ctx, defaultClient, base, chatReq{Tenant: "js", TestID: "json", Prompt: "a b c d e f g h i j", MaxTokens: maxTokens})
		expectServed(t, r)
		if r.Err != nil {
			return
		}
		checkFairQueueHeaders(t, r.Header, maxTokens)
		var body struct {
			Usage *chunkUsage `json:"usage"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || body.Usage == nil {
			t.Fatalf("no usage in %s (%v)", r.Body, err)
		}
		if body.Usage.PromptTokens != 10 || body.Usage.CompletionTokens != 16 {
			t.Errorf("usage %+v, want prompt 10 (the fake counts words), completion 16", *body.Usage)
		}
		want := before + float64(body.Usage.PromptTokens+body.Usage.CompletionTokens)
		waitMetric(t, c, fmt.Sprintf("actual_tokens_total{tenant=js} == %v", want), func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_actual_tokens_total", "tenant", "js") == want
		})
	})

	s := scrape(t, c)
	for _, tenant := range []string{"su", "sc", "js"} {
		if n := metric(s, "caddy_fair_queue_requests_total", "tenant", tenant, "outcome", "served"); n != 1 {
			t.Errorf("requests_total{tenant=%s,outcome=served} = %v, want 1", tenant, n)
		}
	}
}

// checkFairQueueHeaders checks X-Fair-Queue-Wait-Ms and X-Fair-Queue-Cost
// (estimated prompt tokens + the output cap) and returns the cost.
func checkFairQueueHeaders(t *testing.T, h interface{ Get(string) string }, maxTokens int) int {
	t.Helper()
	if w, err := strconv.Atoi(h.Get("X-Fair-Queue-Wait-Ms")); err != nil || w < 0 {
		t.Errorf("X-Fair-Queue-Wait-Ms %q", h.Get("X-Fair-Queue-Wait-Ms"))
	}
	cost, err := strconv.Atoi(h.Get("X-Fair-Queue-Cost"))
	if err != nil || cost <= maxTokens {
		t.Errorf("X-Fair-Queue-Cost %q, want the prompt's tokens + max_tokens %d", h.Get("X-Fair-Queue-Cost"), maxTokens)
	}
	return cost
}
