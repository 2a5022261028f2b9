package quota

import (
	"testing"
	"time"
)

// A request queued behind k others of its tenant may start when the k
// requests ahead, each charged as soon as it may be, have been: Peek with the
// backlog predicts exactly the time the request is then allowed, on every
// meter.
func TestPeekBehindBacklogIsWhenItIsAllowed(t *testing.T) {
	for _, mc := range meterCases() {
		t.Run(mc.name, func(t *testing.T) {
			clk := newVclock()
			m := NewMemory(clk.Now)
			// A tenant already in debt past its window: every request waits.
			for mustPeek(t, m, "a", mc.lim).Allowed {
				mustCharge(t, m, "a", mc.lim, mc.tokens)
			}
			const k = 7
			pred, err := m.Peek(bg, "a", mc.lim, Backlog{Requests: k, Tokens: k * mc.tokens})
			if err != nil {
				t.Fatal(err)
			}
			if pred.Allowed || pred.Reason != mc.dim {
				t.Fatalf("behind %d requests: allowed %v reason %q, want refused on %q", k, pred.Allowed, pred.Reason, mc.dim)
			}
			for i := 0; i < k; i++ {
				d := mustPeek(t, m, "a", mc.lim)
				clk.Set(d.At)
				if c := mustCharge(t, m, "a", mc.lim, mc.tokens); !c.Allowed {
					t.Fatalf("request %d refused at its own earliest time", i)
				}
			}
			d := mustPeek(t, m, "a", mc.lim)
			// Each charge is rounded to the nanosecond on its own and the
			// backlog's once: they differ by at most k/2 ns.
			if diff := d.At.Sub(pred.At); diff < -k || diff > k {
				t.Fatalf("predicted %v, allowed at %v (%v apart)", pred.At, d.At, diff)
			}
			clk.Set(d.At)
			if !mustPeek(t, m, "a", mc.lim).Allowed {
				t.Fatal("not allowed at its earliest time")
			}
		})
	}
}

// With no backlog Peek is the plain decision, and a backlog the window
// absorbs leaves the request allowed now.
func TestPeekBacklogWithinWindow(t *testing.T) {
	clk := newVclock()
	m := NewMemory(clk.Now)
	l := MustCompile(Config{QPS: 10, BurstWindow: 10 * time.Second, BurstAllow: 0.2}) // tau 2 s: 20 requests
	if d, _ := m.Peek(bg, "a", l, Backlog{Requests: 20}); !d.Allowed {
		t.Fatalf("behind 20 requests with a 20-request window: refused, at +%v", d.RetryAfter)
	}
	d, _ := m.Peek(bg, "a", l, Backlog{Requests: 21})
	if d.Allowed || d.RetryAfter != 100*time.Millisecond || d.Reason != DimQPS {
		t.Fatalf("behind 21 requests: %+v, want refused for exactly 100ms on qps", d)
	}
}
