package fairqueue

import (
	"maps"
	"math"
)

// SetCostModel sets how CostLearned prices a request: overhead + prompt x
// promptWeight + completion, in completion-token units (costmodel.Fit). It
// applies to requests enqueued from now on and to back-fills; non-finite or
// negative values are ignored.
func (q *Queue) SetCostModel(overhead, promptWeight float64) {
	if !(overhead >= 0) || !(promptWeight >= 0) || math.IsInf(overhead, 0) || math.IsInf(promptWeight, 0) {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.costOverhead, q.costPromptWeight = overhead, promptWeight
}

// learnedCostLocked prices a request under CostLearned, at least 1.
func (q *Queue) learnedCostLocked(prompt, completion int64) int64 {
	c := q.costOverhead + float64(prompt)*q.costPromptWeight + float64(completion)
	if c >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return max(int64(math.Round(c)), 1)
}

// SetQuotaWeight sets the token_to_qps_weight of every quota that takes it
// from the learned cost model (TenantConfig.QuotaAutoWeight); stored meters
// are kept, and a weight within 1% of the one in force changes nothing.
func (q *Queue) SetQuotaWeight(w float64) {
	if !(w > 0) || math.IsInf(w, 0) {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// The map is shared with whoever built the Config (the handler reads
	// it without the queue's lock): a changed one is a new map.
	var tenants map[string]TenantConfig
	for name, tc := range q.cfg.Tenants {
		if reweigh(&tc, w) {
			if tenants == nil {
				tenants = maps.Clone(q.cfg.Tenants)
			}
			tenants[name] = tc
		}
	}
	if tenants != nil {
		q.cfg.Tenants = tenants
		// The remembered tenants point at these: no scan of them.
		for name, tc := range q.declared {
			tc.Quota = tenants[name].Quota
		}
	}
	if reweigh(&q.cfg.Default, w) {
		q.undeclared.Quota = q.cfg.Default.Quota
	}
}

// reweigh sets the weight of tc's quota to w if it takes it from the cost
// model and w moved it by more than 1%; it reports whether it did.
func reweigh(tc *TenantConfig, w float64) bool {
	if !tc.QuotaAutoWeight || tc.Quota == nil {
		return false
	}
	c := tc.Quota.Config()
	if math.Abs(c.TokenToQPSWeight-w) <= 0.01*c.TokenToQPSWeight {
		return false
	}
	c.TokenToQPSWeight = min(w, 1e6)
	l, err := c.Compile()
	if err != nil {
		return false
	}
	tc.Quota = l
	return true
}
