package caddyfairqueue

import "strings"

// placeholderPrefix names the handler's placeholders:
// {http.fair_queue.tenant}, .wait_ms, .cost and .outcome, plus, with
// handle_errors, .error_code, .error_message and .retry_after (set by
// answer, as Caddy's own handlers set theirs).
const placeholderPrefix = "http.fair_queue."

// placeholder is the request's provider of the placeholders
// (Replacer.Map), registered once the tenant is known: it reads the
// admission only when one is asked for, rather than a Replacer.Set per
// value on every request. A value shows once known: the tenant at once
// (so header_up can pass it on), wait_ms and cost from dispatch or
// refusal, outcome from the answer.
func (a *admission) placeholder(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	switch name {
	case "tenant":
		return a.tenant, true
	case "wait_ms":
		if a.phWaitKnown {
			return a.phWait.Milliseconds(), true
		}
	case "cost":
		if a.phWaitKnown {
			return a.cost.Total(), true
		}
	case "outcome":
		if a.phOutcome != "" {
			return outcomeValue(a.phOutcome), true
		}
	}
	return nil, false
}
