package fairqueue

import (
	"slices"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// AppendBacklogged names the flow owners WFQ owes a share: declared
// tenants with a request dispatch may take, and the undeclared tenants'
// group as one. A tenant with nothing queued, one held by its quota and
// one at its in-flight cap are not among them; each joins once its wait
// is for a slot again.
func TestAppendBackloggedNamesTheOwnersDispatchMayServe(t *testing.T) {
	cfg := testConfig(1, map[string]float64{"a": 1, "b": 1, "c": 1, "idle": 1})
	q := cfg.Tenants["b"]
	q.Quota = quota.MustCompile(quota.Config{QPS: 1})
	cfg.Tenants["b"] = q
	c := cfg.Tenants["c"]
	c.MaxInflight = 1
	cfg.Tenants["c"] = c
	h := newHarness(t, cfg, 1, 1)
	backlog := func() ([]string, bool) {
		names, undeclared := h.q.AppendBacklogged(nil)
		slices.Sort(names)
		return names, undeclared
	}
	if names, u := backlog(); len(names) != 0 || u {
		t.Fatalf("empty queue: %v %v", names, u)
	}

	h.enqueue(Request{Tenant: "c", Cost: 10}) // dispatched: fills the one slot and c's cap
	h.enqueue(Request{Tenant: "b", Cost: 10}) // queued; its quota allows one now
	h.enqueue(Request{Tenant: "b", Cost: 10}) // behind it: waits a second for the quota
	h.enqueue(Request{Tenant: "a", Cost: 10})
	h.enqueue(Request{Tenant: "c", Cost: 10}) // at its cap
	h.enqueue(Request{Tenant: "stranger", Cost: 10})
	if names, u := backlog(); !slices.Equal(names, []string{"a", "b"}) || !u {
		t.Fatalf("backlogged %v, undeclared %v; want a and b (c is at its cap), and the group", names, u)
	}
	// With the clock standing still, everything but b's second request
	// goes in turn; that one waits for b's quota, which does not count
	// once a free slot has found b held.
	for h.q.Stats(false).Queued > 1 {
		h.completeOldest()
	}
	h.completeOldest()
	if names, u := backlog(); len(names) != 0 || u || dispatchedCount(h, "b") != 1 {
		t.Fatalf("only b's quota-held request queued: backlogged %v %v, want none", names, u)
	}
}
