package caddyfairqueue

import (
	"cmp"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

// degradeEvent is the Caddy event emitted on every ladder transition, so
// operators can hook alerts to it (events { on fair_queue_degrade ... }).
const degradeEvent = "fair_queue_degrade"

// provisionDegrade turns the JSON ladder into the scheduler's steps
// (fairqueue.Config.Validate checks them).
func (h *Handler) provisionDegrade() error {
	if h.Degrade == nil || len(h.Degrade.Steps) == 0 {
		return nil
	}
	steps := make([]degrade.Step, 0, len(h.Degrade.Steps))
	for i, s := range h.Degrade.Steps {
		if s == nil {
			return fmt.Errorf("degrade: step %d is empty", i+1)
		}
		a := degrade.Action{Class: s.Class, MaxInputTokens: s.MaxInputTokens, MaxTokens: s.MaxTokens}
		err := a.Kind.UnmarshalText([]byte(s.Action))
		if err == nil && a.Kind == degrade.ActionThrottle {
			a.Rate, err = degrade.ParseRate(s.Rate)
		}
		if err != nil {
			return fmt.Errorf("degrade step %s: %v", s.Name, err)
		}
		steps = append(steps, degrade.Step{Name: s.Name, Trigger: s.Trigger, Recover: s.Recover, Action: a})
	}
	h.qcfg.Degrade = steps
	h.qcfg.DegradeHold = cmp.Or(time.Duration(h.Degrade.Hold), degrade.DefaultHold)
	return nil
}

// applyDegrade trims the body of a request whose class is in light mode
// and re-estimates its cost; a body it cannot trim is served as it is.
// A request that lowered its class (X-Fair-Queue-Class) is trimmed to the
// tighter limits of its class and its tenant's, so lowering the class
// cannot escape the tenant's degrade actions.
func (h *Handler) applyDegrade(a *admission) {
	act, ok := h.shared.q.LightMode(a.class)
	if own := a.tc.Class; own != a.class {
		if o, ownOK := h.shared.q.LightMode(own); ownOK {
			act, ok = tighterLight(act, o, ok), true
		}
	}
	if !ok {
		return
	}
	out, changed, err := llmapi.LightMode(a.req.Kind, a.body, act.MaxInputTokens, act.MaxTokens, h.counter)
	if err != nil || !changed {
		return
	}
	req, err := llmapi.Parse(a.path, out)
	if err != nil {
		return
	}
	a.body, a.req, a.light = out, req, true
	a.cost = llmapi.Estimate(req, h.counter, h.DefaultMaxTokens)
}

// tighterLight is the light mode that trims to the smaller of two limits
// (0: none), a's only when aOK.
func tighterLight(a, b degrade.Action, aOK bool) degrade.Action {
	if !aOK {
		return b
	}
	tighter := func(x, y int) int {
		if x == 0 || y != 0 && y < x {
			return y
		}
		return x
	}
	a.MaxInputTokens = tighter(a.MaxInputTokens, b.MaxInputTokens)
	a.MaxTokens = tighter(a.MaxTokens, b.MaxTokens)
	return a
}

// onTransition logs, counts and emits one ladder transition.
func (h *Handler) onTransition(tr degrade.Transition) {
	dir := "down"
	if tr.Up {
		dir = "up"
	}
	degradeTransitions.WithLabelValues(h.Name, tr.Step, dir).Inc()
	h.history().Degrade(tr.At, tr.Step, tr.Up, tr.From, tr.To, tr.Water)
	h.logger.Info("degrade ladder transition",
		zap.String("queue", h.Name), zap.String("step", tr.Step), zap.String("direction", dir),
		zap.Int("from_level", tr.From), zap.Int("level", tr.To), zap.Float64("water", tr.Water))
	if h.events != nil {
		h.events.Emit(h.ctx, degradeEvent, map[string]any{
			"queue": h.Name, "step": tr.Step, "direction": dir,
			"from_level": tr.From, "level": tr.To, "water": tr.Water,
		})
	}
}

// loadEvents gets the events app, so transitions can be emitted.
func (h *Handler) loadEvents() error {
	app, err := h.ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %v", err)
	}
	h.events, _ = app.(*caddyevents.App)
	return nil
}

var (
	degradeTransitions = counterVec("degrade_transitions_total",
		"Degrade ladder transitions, by step and direction.",
		"queue", "step", "direction")
	descDegradeLevel = prometheus.NewDesc(fqName("degrade_level"),
		"Engaged degrade steps (0 = normal).", []string{"queue"}, nil)
)
