package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestClientDisconnectWhileQueued: a client that leaves while queued is
// never sent upstream and is counted as client_gone; a client that leaves
// mid-stream frees its slot for the next request.
func TestClientDisconnectWhileQueued(t *testing.T) {
	t.Parallel()
	const slots = 2
	fakes := startFakes(t, 2, "dc", harness.FakeOptions{Slots: slots, TTFT: 10 * time.Millisecond, PerToken: 10 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant hog      weight 1 class batch
		tenant victim   weight 1 class batch
		tenant streamer weight 1 class batch
		tenant next     weight 1 class batch
		reverse_proxy {{.Upstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	capacity := 2 * slots
	waitMetricEq(t, c, float64(capacity), "caddy_fair_queue_capacity")
	ctx := context.Background()

	t.Run("queued", func(t *testing.T) {
		for _, f := range fakes {
			f.Pause()
		}
		hogs := fillSlots(t, base, "hog", "hog", capacity, fakes...)

		goneCtx, cancel := context.WithCancel(ctx)
		gone := async(goneCtx, defaultClient, base, chatReq{Tenant: "victim", TestID: "gone", MaxTokens: 10, IgnoreEOS: true})
		waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "victim")
		cancel()
		if r := await(t, gone, "gone"); !errors.Is(r.Err, context.Canceled) {
			t.Errorf("the cancelled request should end with context.Canceled: %v", r)
		}
		waitMetricEq(t, c, 1, "caddy_fair_queue_requests_total", "tenant", "victim", "outcome", "client_gone")
		waitMetricEq(t, c, 0, "caddy_fair_queue_queue_depth", "tenant", "victim")

		for _, f := range fakes {
			f.Resume()
		}
		for i, ch := range hogs {
			expectServed(t, await(t, ch, fmt.Sprint("hog-", i)))
		}
		recs := records(t, fakes...)
		if r, ok := recs["gone"]; ok {
			t.Errorf("the request cancelled while queued reached an upstream: %+v", r)
		}
		for i := range capacity {
			if r := recs[fmt.Sprint("hog-", i)]; r.Outcome != "ok" {
				t.Errorf("hog-%d: fake record %+v", i, r)
			}
		}
		s := waitMetric(t, c, "nothing in flight", func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_inflight") == 0
		})
		if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "victim"); n != 1 {
			t.Errorf("victim: requests_total over all outcomes %v, want 1 (client_gone only)", n)
		}
		// Every slot is free again: a full round is served at once.
		var again []chatReq
		for i := range capacity {
			again = append(again, chatReq{Tenant: "victim", TestID: fmt.Sprint("again-", i), MaxTokens: 3, IgnoreEOS: true})
		}
		for _, r := range sendAll(ctx, defaultClient, base, again) {
			expectServed(t, r)
		}
	})

	t.Run("mid-stream", func(t *testing.T) {
		// Streams of 2000 tokens x 10 ms hold their slots for 20 s: far
		// longer than the test needs them, so "still streaming" is a
		// state, not a race.
		type stream struct {
			id     string
			cancel context.CancelFunc
			done   chan error
		}
		var streams []stream
		for i := range capacity {
			sctx, cancel := context.WithCancel(ctx)
			id := fmt.Sprint("stream-", i)
			resp, sse, _ := openStream(t, sctx, defaultClient, base, chatReq{Tenant: "streamer", TestID: id,
				MaxTokens: 2000, IgnoreEOS: true, Stream: true})
			if _, err := sse.next(); err != nil {
				cancel()
				t.Fatalf("%s: first event: %v", id, err)
			}
			// Keep reading in the background, as a client would, until
			// the stream breaks.
			done := make(chan error, 1)
			go func() {
				defer resp.Body.Close()
				for {
					ev, err := sse.next()
					if err != nil {
						done <- err
						return
					}
					if ev == "[DONE]" {
						done <- nil
						return
					}
				}
			}()
			streams = append(streams, stream{id: id, cancel: cancel, done: done})
			// Running at a fake before the next is sent: least_conn then
			// puts each stream on a free slot.
			waitRunning(t, i+1, fakes...)
		}
		t.Cleanup(func() {
			for _, s := range streams {
				s.cancel()
			}
		})
		waitRunning(t, capacity, fakes...)

		next := async(ctx, defaultClient, base, chatReq{Tenant: "next", TestID: "next", MaxTokens: 3, IgnoreEOS: true})
		waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "next")

		streams[0].cancel()
		if err := <-streams[0].done; !errors.Is(err, context.Canceled) {
			t.Errorf("%s: the cancelled stream should end with context.Canceled, got %v", streams[0].id, err)
		}
		r := await(t, next, "next")
		expectServed(t, r)

		harness.WaitFor(t, "the fake to record stream-0 as client_gone", func() (bool, string) {
			rec := records(t, fakes...)["stream-0"]
			return rec.Outcome == "client_gone", fmt.Sprintf("%+v", rec)
		})
		recs := records(t, fakes...)
		nextRec := recs["next"]
		if nextRec.Outcome != "ok" || nextRec.StartedUnixNano == 0 {
			t.Fatalf("next: fake record %+v", nextRec)
		}
		for _, s := range streams[1:] {
			rec := recs[s.id]
			if rec.Outcome != "in_flight" {
				t.Errorf("%s should still be streaming when next ran: %+v", s.id, rec)
			}
		}
		if st := fakes[0].Stats().Running + fakes[1].Stats().Running; st != capacity-1 {
			t.Errorf("%d requests running at the fakes, want the %d remaining streams", st, capacity-1)
		}

		// End the remaining streams; each ends with the cancellation.
		for _, s := range streams[1:] {
			s.cancel()
			if err := <-s.done; !errors.Is(err, context.Canceled) {
				t.Errorf("%s: want context.Canceled, got %v", s.id, err)
			}
		}
		waitRunning(t, 0, fakes...)
		waitMetricEq(t, c, 0, "caddy_fair_queue_inflight")
		// The gateway counts each stream its client abandoned. (Caddy's
		// reverse_proxy ends such a response by panicking with
		// http.ErrAbortHandler, so the accounting must not sit only after
		// the proxy call returns.)
		waitMetricEq(t, c, float64(capacity), "caddy_fair_queue_requests_total", "tenant", "streamer", "outcome", "client_gone")
	})
}
