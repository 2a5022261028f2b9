package e2e

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestUpstreamFaults: model servers that hang, stall, lie about usage or
// die. Every request gets one answer, and no slot is leaked: in-flight
// returns to 0 after each fault. It runs alone (no t.Parallel): a killed
// fake comes back on its old port, which another test's client could take
// meanwhile.
func TestUpstreamFaults(t *testing.T) {
	const slots = 2
	fakes := startFakes(t, 2, "uf", harness.FakeOptions{Slots: slots, TTFT: 5 * time.Millisecond, PerToken: 20 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant a weight 1 class interactive
		tenant b weight 1 class batch
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
			fail_duration 5s
			max_fails 1
			lb_retries 2
			transport http {
				read_timeout 3s
			}
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])

	t.Run("hangs before headers", func(t *testing.T) {
		for _, f := range fakes {
			f.Pause()
		}
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "a", TestID: "hang-1", MaxTokens: 4})
		expectError(t, r, 502, "proxy_error", "api_error", true)
		for _, f := range fakes {
			f.Resume()
		}
		waitMetricEq(t, c, 0, "caddy_fair_queue_inflight")
		expectServed(t, send(context.Background(), defaultClient, base, chatReq{Tenant: "a", TestID: "hang-after", MaxTokens: 4}))
	})

	t.Run("stream stalls mid-way", func(t *testing.T) {
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "a", TestID: "stall-1", MaxTokens: 20,
			IgnoreEOS: true, Stream: true, Header: map[string]string{"X-Fake-Stall-After": "3"}})
		// Headers were sent: the client gets a 200 whose stream ends
		// early, and the slot comes back within read_timeout.
		if r.Status != 200 || strings.Contains(string(r.Body), "[DONE]") {
			t.Errorf("stalled stream: %v; want a 200 cut short", r)
		}
		waitMetricEq(t, c, 0, "caddy_fair_queue_inflight")
	})

	t.Run("garbage usage", func(t *testing.T) {
		before := metric(scrape(t, c), "caddy_fair_queue_actual_tokens_total", "tenant", "a")
		for i, stream := range []bool{false, true} {
			r := send(context.Background(), defaultClient, base, chatReq{Tenant: "a", TestID: fmt.Sprintf("garbage-%d", i),
				MaxTokens: 5, IgnoreEOS: true, Stream: stream, IncludeUsage: stream,
				Header: map[string]string{"X-Fake-Usage": "garbage"}})
			expectServed(t, r)
		}
		// The lie is not believed: the tenant is charged what was
		// counted or estimated, a small finite number.
		got := metric(scrape(t, c), "caddy_fair_queue_actual_tokens_total", "tenant", "a") - before
		if math.IsNaN(got) || got < 0 || got > 10_000 {
			t.Errorf("actual tokens charged for two small requests with garbage usage: %v", got)
		}
	})

	t.Run("upstream killed mid-stream and mid-queue", func(t *testing.T) {
		// Passive health remembers the faults above for fail_duration:
		// start with both upstreams healthy again.
		waitMetricEq(t, c, 2*slots, "caddy_fair_queue_capacity")
		// Fill all four slots with long streams and queue six more.
		var chs []<-chan result
		for i := range 2 * slots {
			chs = append(chs, async(context.Background(), defaultClient, base, chatReq{Tenant: "b",
				TestID: fmt.Sprintf("kill-run-%d", i), MaxTokens: 100, IgnoreEOS: true, Stream: true}))
			waitRunning(t, i+1, fakes...)
		}
		for i := range 6 {
			chs = append(chs, async(context.Background(), defaultClient, base, chatReq{Tenant: "b",
				TestID: fmt.Sprintf("kill-q-%d", i), MaxTokens: 4}))
		}
		waitMetricEq(t, c, 6, "caddy_fair_queue_queue_depth", "tenant", "b")
		fakes[0].Kill()
		// Every request gets exactly one answer: a stream cut short, a
		// served request, or an error in the API's shape.
		streamsServed, queuedServed := 0, 0
		for _, ch := range chs {
			r := await(t, ch, "request during the kill")
			switch {
			case r.Err != nil:
				// A stream cut mid-body surfaces as a read error.
				if !strings.HasPrefix(r.TestID, "kill-run-") {
					t.Errorf("%v: a queued request ended in a transport error", r)
				}
			case r.Status == 200 && strings.HasPrefix(r.TestID, "kill-run-"):
				streamsServed++
			case r.Status == 200:
				queuedServed++
			case r.Status == 502:
				expectError(t, r, 502, "proxy_error", "", true)
			default:
				t.Errorf("unexpected answer %v", r)
			}
		}
		// The two streams on the survivor are served. A queued request
		// the gateway dispatched to the dying upstream in its last
		// instant (a connection it held to it, before anything said it
		// died) gets a 502 the client may retry: how many do depends on
		// how fast the machine let the gateway learn of the death, so it
		// is observed, not bounded.
		if streamsServed < 2 {
			t.Errorf("%d of the 4 streams served after one of two upstreams died; want the survivor's 2", streamsServed)
		}
		t.Logf("observed: %d of the 6 queued served, the rest answered 502 proxy_error", queuedServed)
		waitMetricEq(t, c, 0, "caddy_fair_queue_inflight")
		waitMetricEq(t, c, 0, "caddy_fair_queue_queue_depth")
		// Once the gateway has seen the upstream die (its active health
		// check), what comes next is served by the survivor, all of it,
		// twice its slots at once.
		waitMetric(t, c, "the gateway's health check to see the killed upstream down", func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_healthy_upstreams") == 1 && metric(s, "caddy_fair_queue_capacity") == slots
		})
		var after []chatReq
		for i := range 2 * slots {
			after = append(after, chatReq{Tenant: "b", TestID: fmt.Sprintf("kill-after-%d", i), MaxTokens: 4})
		}
		for _, r := range sendAll(context.Background(), defaultClient, base, after) {
			expectServed(t, r)
			if up := r.Header.Get("X-Fake-Upstream"); r.Status == 200 && up != fakes[1].Name() {
				t.Errorf("%s served by %s, want the survivor %s", r.TestID, up, fakes[1].Name())
			}
		}
		fakes[0].Restart()
	})
}

// TestReloadRemovesQueue: a reload that renames the queue leaves its
// waiters with no queue to wait in; they get an answer at once (503, retry)
// rather than hanging, and requests in flight finish normally. A config
// with two handlers of one name is refused and the running one stays.
func TestReloadRemovesQueue(t *testing.T) {
	t.Parallel()
	const slots = 1
	fakes := startFakes(t, 1, "rq", harness.FakeOptions{Slots: slots, TTFT: 5 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site", "Site2")
	tmpl := `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		name {{.Name}}
		max_inflight 1
		tenant a weight 1 class batch
		reverse_proxy {{.Upstreams}}
	}
}
`
	data := map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Site2": p["Site2"], "Upstreams": addrs(fakes...), "Name": "first"}
	c := startCaddy(t, tmpl, data)
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])

	fakes[0].Pause()
	holder := fillSlots(t, base, "a", "rq-hold", 1, fakes...)
	var waiters []<-chan result
	for i := range 3 {
		waiters = append(waiters, async(context.Background(), defaultClient, base,
			chatReq{Tenant: "a", TestID: fmt.Sprintf("rq-%d", i), MaxTokens: 4}))
	}
	waitMetric(t, c, "3 queued in queue first", func(s harness.Series) bool {
		return s.Sum("caddy_fair_queue_queue_depth", "queue", "first") == 3
	})

	// Two handlers named alike in one config: refused, nothing changes.
	dup := tmpl + `
http://127.0.0.1:{{.Site2}} {
	fair_queue {
		name first
		reverse_proxy {{.Upstreams}}
	}
}
`
	if err := c.Reload(harness.Render(t, dup, data)); err == nil || !strings.Contains(err.Error(), "two fair_queue handlers") {
		t.Fatalf("reload with two handlers named first: %v, want a refusal naming the cause", err)
	}

	data["Name"] = "second"
	if err := c.Reload(harness.Render(t, tmpl, data)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, ch := range waiters {
		r := await(t, ch, "waiter of the removed queue")
		e := expectError(t, r, 503, "server_busy", "overloaded_error", true)
		if !strings.Contains(e.Message, "configuration") {
			t.Errorf("message %q does not say the configuration changed", e.Message)
		}
	}
	t.Logf("observed: waiters of the removed queue answered %s after the reload", time.Since(start).Round(time.Millisecond))
	fakes[0].Resume()
	expectServed(t, await(t, holder[0], "request in flight across the reload"))
	expectServed(t, send(context.Background(), defaultClient, base, chatReq{Tenant: "a", TestID: "rq-after", MaxTokens: 4}))
}
