package caddyfairqueue

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-fair-queue/caddy-fair-queue/costmodel"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// observeCost feeds a request its primary upstreams served to its queue's
// cost model (package costmodel): busy time ≈ a + b·prompt + c·completion,
// dispatch to last byte. With cost_unit learned the queue prices requests
// by it, in completion-token units (applyCostModel).
func (h *Handler) observeCost(a *admission, d fairqueue.DispatchInfo) {
	if !a.usageKnown || d.Fallback {
		return
	}
	h.shared.cost.Observe(int64(a.usedPrompt), int64(a.usedCompletion), time.Since(d.Dispatched))
}

// applyCostModel gives the queue the fitted price, on the tick, when the
// queue prices by it.
func (s *sharedQueue) applyCostModel(h *Handler) {
	learned := h.qcfg.CostUnit == fairqueue.CostLearned
	if !learned && !h.quotaAuto {
		return
	}
	f := s.cost.Fit()
	if !f.Ready || f.PerCompletionToken <= 0 {
		return
	}
	if learned {
		s.q.SetCostModel(f.Overhead/f.PerCompletionToken, f.PerPromptToken/f.PerCompletionToken)
	}
	if h.quotaAuto {
		s.q.SetQuotaWeight(f.TokenToQPSWeight())
	}
}

var descCostModel = prometheus.NewDesc(fqName("cost_model_seconds"),
	"The learned cost model's coefficients: busy time per request (overhead), per prompt token and per completion token; absent until the fit is ready.",
	[]string{"queue", "term"}, nil)

var descCostModelR2 = prometheus.NewDesc(fqName("cost_model_r2"),
	"R² of the learned cost model's fit.", []string{"queue"}, nil)

// collectCostModel reports a queue's fit at scrape time.
func collectCostModel(ch chan<- prometheus.Metric, name string, f costmodel.Fit) {
	if !f.Ready {
		return
	}
	for term, v := range map[string]float64{"overhead": f.Overhead, "prompt_token": f.PerPromptToken,
		"completion_token": f.PerCompletionToken} {
		gauge(ch, descCostModel, v, name, term)
	}
	gauge(ch, descCostModelR2, f.R2, name)
}

// costModelReport is the admin API's view of a fit.
type costModelReport struct {
	Ready  bool   `json:"ready"`
	Status string `json:"status"`
	// Samples is how many served requests the fit has seen.
	Samples int `json:"samples"`
	// Busy time per request, per prompt token, per completion token.
	OverheadSeconds        float64 `json:"overhead_seconds"`
	PromptTokenSeconds     float64 `json:"prompt_token_seconds"`
	CompletionTokenSeconds float64 `json:"completion_token_seconds"`
	R2                     float64 `json:"r2"`
	// TokenToQPSWeight is the token_to_qps_weight the fit implies: one
	// token's busy time in units of a request's (0 until ready).
	TokenToQPSWeight float64 `json:"token_to_qps_weight"`
}

func newCostModelReport(f costmodel.Fit) costModelReport {
	return costModelReport{Ready: f.Ready, Status: f.Status.String(), Samples: f.Samples,
		OverheadSeconds: f.Overhead, PromptTokenSeconds: f.PerPromptToken,
		CompletionTokenSeconds: f.PerCompletionToken, R2: f.R2, TokenToQPSWeight: f.TokenToQPSWeight()}
}
