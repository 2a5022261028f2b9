package fairqueue

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// overload is the degrade ladder as the queue applies it: the ladder's
// state plus what its engaged steps mean for each class right now.
type overload struct {
	ladder *degrade.Ladder
	steps  []degrade.Step
	// bucket holds one token bucket per throttle step, kept across reloads
	// while the step's name and rate stay the same.
	bucket []*degrade.Throttle

	// Derived from the engaged steps; a higher step overrides a lower one
	// acting on the same class.
	paused   map[string]bool
	light    map[string]degrade.Action
	throttle map[string]*degrade.Throttle
}

// newOverload validates cfg's ladder and carries the state of old over.
func newOverload(cfg *Config, old *overload) (*overload, error) {
	o := &overload{}
	if len(cfg.Degrade) == 0 {
		return o, nil
	}
	names := make([]string, len(cfg.Classes))
	for i, c := range cfg.Classes {
		names[i] = c.Name
	}
	l, err := degrade.NewLadder(cfg.Degrade, cfg.DegradeHold, names)
	if err != nil {
		return nil, err
	}
	o.ladder, o.steps = l, l.Steps()
	o.bucket = make([]*degrade.Throttle, len(o.steps))
	for i, s := range o.steps {
		if s.Action.Kind != degrade.ActionThrottle {
			continue
		}
		if old != nil {
			for j, os := range old.steps {
				if os.Name == s.Name && os.Action.Kind == degrade.ActionThrottle && os.Action.Rate == s.Action.Rate {
					o.bucket[i] = old.bucket[j]
				}
			}
		}
		if o.bucket[i] == nil {
			o.bucket[i] = degrade.NewThrottle(s.Action.Rate)
		}
	}
	if old != nil && old.ladder != nil {
		l.Carry(old.ladder)
	}
	o.derive()
	return o, nil
}

// derive recomputes the per-class actions from the engaged steps.
func (o *overload) derive() {
	o.paused, o.light, o.throttle = nil, nil, nil
	if o.ladder == nil {
		return
	}
	o.paused, o.throttle = map[string]bool{}, map[string]*degrade.Throttle{}
	for i, s := range o.steps[:o.ladder.Level()] {
		a := s.Action
		switch a.Kind {
		case degrade.ActionPause:
			o.paused[a.Class] = true
		case degrade.ActionLightMode:
			if o.light == nil { // nil while no class is trimmed (lightOn)
				o.light = map[string]degrade.Action{}
			}
			o.light[a.Class] = a
		case degrade.ActionThrottle:
			o.throttle[a.Class] = o.bucket[i]
		}
	}
}

// observeWaterLocked feeds the water level to the ladder and applies any change.
func (q *Queue) observeWaterLocked(now time.Time) {
	o := q.ov
	if o.ladder == nil {
		return
	}
	water := q.waterLocked()
	trs := o.ladder.Observe(now, water)
	if len(trs) == 0 {
		return
	}
	o.derive()
	q.lightOn.Store(o.light != nil)
	q.applyPausesLocked()
	if q.degradeObserver != nil {
		q.transitions = append(q.transitions, trs...)
	}
}

// applyPausesLocked makes exactly the classes the ladder pauses yield.
func (q *Queue) applyPausesLocked() {
	for _, cq := range q.classes {
		if p := q.ov.paused[cq.name]; p != cq.paused {
			cq.paused = p
			q.aheadPausedLocked(cq)
		}
	}
	q.dispatchLocked(q.clock.Now())
}

// throttleLocked admits a request of class cls from a tenant of class own
// against the throttles of both (a request that lowers its class stays
// under its tenant's class's throttle). Both are peeked before either is
// charged; with consume false nothing is charged (PrecheckRequest).
func (q *Queue) throttleLocked(now time.Time, cls, own string, cost int64, consume bool) *Rejection {
	thr, ownThr := q.ov.throttle[cls], (*degrade.Throttle)(nil)
	if own != cls {
		ownThr = q.ov.throttle[own]
	}
	if thr == nil && ownThr == nil {
		return nil
	}
	tokens := int(min(max(cost, 1), 1<<31-1))
	if thr != nil {
		if ok, wait := thr.Peek(now, tokens); !ok {
			return throttleRejection(cls, "", thr, wait)
		}
	}
	if ownThr != nil {
		if ok, wait := ownThr.Peek(now, tokens); !ok {
			return throttleRejection(own, " (the tenant's own class)", ownThr, wait)
		}
	}
	if consume {
		for _, t := range [...]*degrade.Throttle{thr, ownThr} {
			if t != nil {
				t.Admit(now, tokens)
			}
		}
	}
	return nil
}

func throttleRejection(cls, whose string, thr *degrade.Throttle, wait time.Duration) *Rejection {
	return &Rejection{Reason: ReasonClassThrottled, RetryAfter: min(wait, budget.MaxRetryAfter),
		Detail: "class " + cls + whose + " is throttled to " + thr.Rate().String() + " while the gateway is overloaded"}
}

// LightMode reports whether requests of class cls are to be trimmed now, and
// to which limits (degrade action light_mode).
func (q *Queue) LightMode(cls string) (degrade.Action, bool) {
	if !q.lightOn.Load() {
		return degrade.Action{}, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	a, ok := q.ov.light[cls]
	return a, ok
}

// DegradeLevel returns how many steps of the ladder are engaged.
func (q *Queue) DegradeLevel() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ov.ladder == nil {
		return 0
	}
	return q.ov.ladder.Level()
}

// SetDegradeObserver installs fn to be told of every ladder transition,
// outside the queue's lock, in order.
func (q *Queue) SetDegradeObserver(fn func(degrade.Transition)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.degradeObserver = fn
}
