package caddyfairqueue

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// boundUsage returns the usage to charge for a served request: as
// reported (or counted), unless the total exceeds the larger of twice its
// estimate and requestTokenLimit. Then the total is that bound (prompt
// first), counted and logged at most once a minute. The usage is charged
// everywhere (virtual time, quota, provider account, cost model), so an
// upstream reporting completion_tokens 2147483647 must not put its tenant
// in debt for weeks.
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
