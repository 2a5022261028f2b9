package fairqueue

import "math"

// SetCostModel sets how CostLearned prices a request: overhead + prompt x
// promptWeight + completion, in completion-token units (a fitted model's
// a/c and b/c: costmodel.Fit). It applies to requests enqueued from now
// on and to the back-fill of those completing; requests already queued
// keep the price they were charged. Non-finite or negative values are
// ignored.
func (q *Queue) SetCostModel(overhead, promptWeight float64) {
	if !(overhead >= 0) || !(promptWeight >= 0) || math.IsInf(overhead, 0) || math.IsInf(promptWeight, 0) {
		return
	}
	q.mu.Lock()
	q.costOverhead, q.costPromptWeight = overhead, promptWeight
	q.mu.Unlock()
}

// learnedCostLocked prices a request under CostLearned, at least 1.
func (q *Queue) learnedCostLocked(prompt, completion int64) int64 {
	c := q.costOverhead + float64(prompt)*q.costPromptWeight + float64(completion)
	if c >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return max(int64(math.Round(c)), 1)
}
