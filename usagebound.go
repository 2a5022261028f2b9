package caddyfairqueue

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The usage an upstream reports is the actual cost charged everywhere: the
// tenant's virtual time, its quota, the provider account, the cost model.
// An upstream is not trusted with that beyond what the request could have
// used: a response reporting completion_tokens 2147483647 would put its
// tenant in debt for weeks and empty the provider account for days.
// Waits from response headers are capped (maxProviderWait); usage from the
// body is capped here.

// boundUsage returns the usage to charge for a served request that
// reported prompt and completion tokens (or had its streamed text
// counted): as reported, unless the total exceeds the request's bound,
// the larger of twice its estimate and the tokens one request may have
// (max_request_tokens, the tenant's own if set, or a smaller
// max_inflight_tokens or max_queue_tokens: requestTokenLimit). Then the total is the
// bound (prompt first), the tenant's metric counts it and a warning is
// logged, at most one a minute (clampLogger). The estimate's output part
// is the request's own max_tokens or default_max_tokens, so an answer
// longer than default_max_tokens to a request that set none is charged
// in full up to max_request_tokens.
func (h *Handler) boundUsage(a *admission, prompt, completion int) (int, int) {
	total, est := int64(prompt)+int64(completion), int64(a.cost.Total())
	if total <= 2*est {
		return prompt, completion
	}
	limit, _ := h.requestTokenLimit(a.tenant, a.label != unknownTenantLabel)
	bound := max(2*est, limit)
	if total <= bound {
		return prompt, completion
	}
	p := min(int64(prompt), bound)
	usageClamped.WithLabelValues(h.Name, a.label).Inc()
	if ce := h.usageLog.Check(zap.WarnLevel, "upstream reported more tokens than the request could use; usage clamped"); ce != nil {
		ce.Write(zap.String("tenant", a.tenant), zap.Int("reported_prompt_tokens", prompt),
			zap.Int("reported_completion_tokens", completion), zap.Int("estimated_tokens", a.cost.Total()),
			zap.Int64("charged_tokens", bound),
			zap.String("note", "logged at most once a minute; caddy_fair_queue_usage_clamped_total counts every one"))
	}
	return int(p), int(bound - p)
}

// clampLogger is the logger of clamped usage: one line a minute, the rest
// dropped (zap's sampler), so an upstream lying on every response cannot
// flood the log.
func clampLogger(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Minute, 1, 0)
	}))
}

var usageClamped = counterVec("usage_clamped_total",
	"Served requests whose reported usage exceeded what the request could use (the larger of twice its estimate and max_request_tokens) and was charged at that bound instead.",
	"queue", "tenant")
