package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestUpstreamDownAndUp: an upstream failing its active health check
// takes its slots out of the queue's capacity, requests go to the healthy
// one, and capacity comes back with it.
func TestUpstreamDownAndUp(t *testing.T) {
	t.Parallel()
	const slots = 3
	fakes := startFakes(t, 2, "hc", harness.FakeOptions{Slots: slots, TTFT: 10 * time.Millisecond, PerToken: time.Millisecond})
	a, b := fakes[0], fakes[1]
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant acme weight 1 class batch
		reverse_proxy {{.Upstreams}} {
			lb_policy round_robin
			# Caddy's round_robin can pick the down upstream on each of its
			# tries when selections race (they share one counter) and then
			# answers "no upstreams available": let it try again.
			lb_retries 2
			health_uri /health
			health_interval 200ms
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	ctx := context.Background()

	waitCapacity := func(healthy int) {
		t.Helper()
		waitMetric(t, c, fmt.Sprintf("%d healthy upstreams, capacity %d", healthy, healthy*slots), func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_healthy_upstreams") == float64(healthy) &&
				metric(s, "caddy_fair_queue_capacity") == float64(healthy*slots)
		})
	}
	// servedBy sends n requests, concurrently (more than the capacity, so
	// some queue), checks each is served, and counts them per upstream.
	servedBy := func(phase string, n int) map[string]int {
		t.Helper()
		reqs := make([]chatReq, n)
		for i := range reqs {
			reqs[i] = chatReq{Tenant: "acme", TestID: fmt.Sprintf("%s-%d", phase, i), MaxTokens: 20, IgnoreEOS: true}
		}
		counts := map[string]int{}
		for _, r := range sendAll(ctx, defaultClient, base, reqs) {
			expectServed(t, r)
			counts[r.Header.Get("X-Fake-Upstream")]++
		}
		t.Logf("%s: served by %v", phase, counts)
		return counts
	}

	waitCapacity(2)
	if got := servedBy("both-up", 4*slots); got[a.Name()] == 0 || got[b.Name()] == 0 {
		t.Errorf("with both upstreams healthy, round_robin must use both: %v", got)
	}

	a.SetHealth(false)
	waitCapacity(1)
	if got := servedBy("a-down", 4*slots); got[a.Name()] != 0 || got[b.Name()] != 4*slots {
		t.Errorf("with %s down, every request must go to %s: %v", a.Name(), b.Name(), got)
	}
	recs := records(t, a)
	for i := range 4 * slots {
		if r, ok := recs[fmt.Sprintf("a-down-%d", i)]; ok {
			t.Errorf("unhealthy %s received a-down-%d: %+v", a.Name(), i, r)
		}
	}

	a.SetHealth(true)
	waitCapacity(2)
	if got := servedBy("both-up-again", 4*slots); got[a.Name()] == 0 || got[b.Name()] == 0 {
		t.Errorf("with both upstreams healthy again, round_robin must use both: %v", got)
	}
	s := scrape(t, c)
	if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "acme", "outcome", "served"); n != 12*slots {
		t.Errorf("requests_total{outcome=served} = %v, want %d", n, 12*slots)
	}
}
