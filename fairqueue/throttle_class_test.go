package fairqueue

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
)

// A request that lowers its class stays under its tenant's class's
// throttle: with "throttle interactive 1/s" engaged, an interactive
// tenant's second request within the second is refused whether it says
// class batch or not, by Precheck and by Enqueue, and the refusal names
// the tenant's class; a batch tenant is not throttled at all. A refusal
// by one throttle takes nothing from the other.
func TestLoweredClassStaysThrottled(t *testing.T) {
	cfg := testConfig(1, map[string]float64{"chat": 1, "bulk": 1})
	cfg.Tenants["chat"] = TenantConfig{Weight: 1, Class: "interactive"}
	cfg.MaxQueue = 20
	cfg.DegradeHold = time.Millisecond
	cfg.Degrade = []degrade.Step{{Name: "L1", Trigger: 0.1, Recover: 0.05,
		Action: degrade.Action{Kind: degrade.ActionThrottle, Class: "interactive", Rate: degrade.Rate{PerSecond: 1}}}}
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "bulk", Cost: 1}) // runs
	h.enqueue(Request{Tenant: "bulk", Cost: 1})
	h.enqueue(Request{Tenant: "bulk", Cost: 1})
	h.enqueue(Request{Tenant: "bulk", Cost: 1}) // water 3/20 > 0.1
	h.clk.Advance(time.Second)
	h.q.Tick()
	if h.q.DegradeLevel() != 1 {
		t.Fatalf("degrade level %d, want the throttle engaged", h.q.DegradeLevel())
	}
	h.enqueue(Request{Tenant: "chat", Class: "batch", Cost: 1}) // the bucket's one token
	throttled := func(what string, err error) {
		t.Helper()
		var rej *Rejection
		if !errors.As(err, &rej) || rej.Reason != ReasonClassThrottled ||
			!strings.Contains(rej.Detail, "class interactive (the tenant's own class) is throttled") {
			t.Errorf("%s: %v, want class_throttled naming the tenant's class", what, err)
		}
	}
	if rej := h.q.Precheck("chat", "batch", 1); rej == nil {
		t.Error("Precheck: a request lowered to batch escapes its tenant's throttle")
	} else {
		throttled("Precheck", rej)
	}
	_, err := h.tryEnqueue(Request{Tenant: "chat", Class: "batch", Cost: 1})
	throttled("Enqueue lowered to batch", err)
	_, err = h.tryEnqueue(Request{Tenant: "chat", Cost: 1})
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Reason != ReasonClassThrottled {
		t.Errorf("Enqueue in the tenant's class: %v, want class_throttled", err)
	}
	for range 5 {
		h.enqueue(Request{Tenant: "bulk", Class: "batch", Cost: 1})
	}
	h.clk.Advance(time.Second)
	h.enqueue(Request{Tenant: "chat", Class: "batch", Cost: 1}) // a token again
	h.drain(1)
}

// A throttle on the class a request lowers itself to applies too, and a
// refusal there leaves the tenant's class's bucket untouched.
func TestLoweredClassThrottledByBoth(t *testing.T) {
	cfg := testConfig(1, map[string]float64{"chat": 1})
	cfg.Tenants["chat"] = TenantConfig{Weight: 1, Class: "interactive"}
	cfg.MaxQueue = 20
	cfg.DegradeHold = time.Millisecond
	cfg.Degrade = []degrade.Step{
		{Name: "L1", Trigger: 0.1, Recover: 0.05, Action: degrade.Action{Kind: degrade.ActionThrottle, Class: "batch", Rate: degrade.Rate{PerSecond: 1}}},
		{Name: "L2", Trigger: 0.12, Recover: 0.06, Action: degrade.Action{Kind: degrade.ActionThrottle, Class: "interactive", Rate: degrade.Rate{PerSecond: 1}}},
	}
	h := newHarness(t, cfg, 1, 1)
	for range 4 {
		h.enqueue(Request{Tenant: "x", Class: "interactive", Cost: 1})
	}
	h.clk.Advance(time.Second)
	h.q.Tick()
	if h.q.DegradeLevel() != 2 {
		t.Fatalf("degrade level %d, want both throttles engaged", h.q.DegradeLevel())
	}
	h.enqueue(Request{Tenant: "y", Class: "batch", Cost: 1}) // batch's one token
	_, err := h.tryEnqueue(Request{Tenant: "chat", Class: "batch", Cost: 1})
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Reason != ReasonClassThrottled || !strings.Contains(rej.Detail, "class batch is throttled") {
		t.Fatalf("lowered to a throttled class: %v, want class_throttled by batch", err)
	}
	// interactive's token is still there.
	h.enqueue(Request{Tenant: "chat", Cost: 1})
	h.drain(1)
}
