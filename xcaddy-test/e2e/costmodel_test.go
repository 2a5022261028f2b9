package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

const costTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		cost_unit learned
		max_inflight 8
		tenant t {
			quota qps 1000 token_to_qps_weight auto
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// TestLearnedCostModel: with cost_unit learned, the gateway fits busy
// time against prompt and completion tokens from the requests it serves,
// through the binary against a fake whose cost is known (10 ms to the
// first token, 4 ms a token after it, prompts free), and reports the fit
// in the admin API and the metrics. It runs alone (no t.Parallel): the fit
// is of wall time, dispatch to last byte, which the suite's own floods
// beside it would blur.
func TestLearnedCostModel(t *testing.T) {
	fakes := startFakes(t, 1, "cm", harness.FakeOptions{Slots: 8, TTFT: 10 * time.Millisecond, PerToken: 4 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, costTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 8, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	// 160 requests, prompts of 1 to 400 words and 5 to 80 output tokens,
	// varied independently; 8 at a time.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := 0; i < 160; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			prompt := strings.Repeat("word ", 1+(i*37)%400)
			r := send(context.Background(), cl, base, chatReq{Tenant: "t", TestID: fmt.Sprintf("c-%d", i),
				Prompt: prompt, MaxTokens: 5 + (i*53)%76, IgnoreEOS: true})
			if r.Err != nil || r.Status != http.StatusOK {
				t.Errorf("%v", r)
			}
		})
	}
	wg.Wait()
	resp, err := http.Get(c.AdminURL() + "/fair_queue/report")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var report []struct {
		CostModel struct {
			Ready                  bool    `json:"ready"`
			Status                 string  `json:"status"`
			Samples                int     `json:"samples"`
			OverheadSeconds        float64 `json:"overhead_seconds"`
			PromptTokenSeconds     float64 `json:"prompt_token_seconds"`
			CompletionTokenSeconds float64 `json:"completion_token_seconds"`
			R2                     float64 `json:"r2"`
			TokenToQPSWeight       float64 `json:"token_to_qps_weight"`
		} `json:"cost_model"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&report); err != nil || len(report) != 1 {
		t.Fatalf("report: %v %+v", err, report)
	}
	m := report[0].CostModel
	t.Logf("fit: %+v", m)
	if !m.Ready || m.Samples != 160 {
		t.Fatalf("cost model not ready after 160 served requests: %+v", m)
	}
	// The fake's 4 ms per output token, within 25% (the gateway measures
	// dispatch to last byte, through loopback, on a shared machine); its
	// prompts cost nothing, so the prompt coefficient is a small fraction
	// of the completion one.
	if m.CompletionTokenSeconds < 0.003 || m.CompletionTokenSeconds > 0.005 {
		t.Errorf("completion token %.4f s, want about 0.004", m.CompletionTokenSeconds)
	}
	if m.PromptTokenSeconds > m.CompletionTokenSeconds/10 {
		t.Errorf("prompt token %.6f s, want far below the completion token's %.4f (the fake does not charge prompts)", m.PromptTokenSeconds, m.CompletionTokenSeconds)
	}
	if m.R2 < 0.9 || m.TokenToQPSWeight <= 0 {
		t.Errorf("R² %.3f, token_to_qps_weight %v; want a good fit and a weight", m.R2, m.TokenToQPSWeight)
	}
	s := scrape(t, c)
	if v := metric(s, "caddy_fair_queue_cost_model_seconds", "term", "completion_token"); v != m.CompletionTokenSeconds {
		t.Errorf("metric cost_model_seconds completion_token = %v, report %v", v, m.CompletionTokenSeconds)
	}
	// token_to_qps_weight auto: within a tick the tenant's joint meter
	// weighs tokens as the fit says (within the 1% a change must exceed).
	waitMetric(t, c, "the learned token weight", func(s harness.Series) bool {
		w := metric(s, "caddy_fair_queue_quota_token_weight", "tenant", "t")
		return w > 0 && w != 0.0008 && w >= m.TokenToQPSWeight*0.98 && w <= m.TokenToQPSWeight*1.02
	})
}
