package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

const (
	floodSlots    = 4   // per fake, and the gateway's max_inflight
	floodRequests = 240 // about 3 s of work for two fakes at ~100 ms each
	sparseCount   = 8
	sparseEvery   = 80 * time.Millisecond
	// floodMaxTokens with ignore_eos: 20 ms to first token + 40 x 2 ms.
	floodMaxTokens = 40
)

// TestSparseTenantDuringFlood: while one tenant floods the gateway, a
// tenant sending now and then starts at about the next free slot; through a
// plain reverse_proxy the same request waits behind the flood.
func TestSparseTenantDuringFlood(t *testing.T) {
	t.Parallel()
	fakeOpts := harness.FakeOptions{Slots: floodSlots, TTFT: 20 * time.Millisecond, PerToken: 2 * time.Millisecond}
	gwFakes := startFakes(t, 2, "gw", fakeOpts)
	plainFakes := startFakes(t, 2, "plain", fakeOpts)
	p := harness.Ports(t, "Admin", "GW", "Plain")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.GW}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant flood  weight 1 class batch
		tenant sparse weight 1 class interactive
		reverse_proxy {{.GWUpstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
http://127.0.0.1:{{.Plain}} {
	reverse_proxy {{.PlainUpstreams}} {
		lb_policy least_conn
	}
}
`, map[string]any{"Admin": p["Admin"], "GW": p["GW"], "Plain": p["Plain"], "Slots": floodSlots,
		"GWUpstreams": addrs(gwFakes...), "PlainUpstreams": addrs(plainFakes...)})
	totalSlots := 2 * floodSlots
	waitMetricEq(t, c, float64(totalSlots), "caddy_fair_queue_capacity")

	// The whole flood arrives while the fakes hold their slots (paused),
	// queued in the gateway, or in the fakes' own queues behind the plain
	// proxy: a backlog however slowly a loaded machine sends it.
	gw, gwWait := runFlood(t, fmt.Sprintf("http://127.0.0.1:%d", p["GW"]), "gw", gwFakes, func() (bool, string) {
		depth := metric(scrape(t, c), "caddy_fair_queue_queue_depth", "tenant", "flood")
		return depth == float64(floodRequests-totalSlots), fmt.Sprintf("gateway queue depth %v", depth)
	})
	plain, _ := runFlood(t, fmt.Sprintf("http://127.0.0.1:%d", p["Plain"]), "plain", plainFakes, func() (bool, string) {
		waiting := 0
		for _, f := range plainFakes {
			waiting += f.Stats().Waiting
		}
		return waiting == floodRequests-totalSlots, fmt.Sprintf("%d waiting at the fakes", waiting)
	})
	t.Logf("flood requests started ahead of each sparse request (sent -> started):")
	t.Logf("  fair_queue:    %s (gateway wait ms %v)", summarize(gw), gwWait)
	t.Logf("  reverse_proxy: %s", summarize(plain))

	// About the next free slot: the flood requests already dispatched
	// but not yet started at a fake when the sparse one was sent (at most
	// one per slot), one that wins a tie of virtual tags, and slack for
	// the client's own latency on a busy machine: 2 x slots in all.
	bound := 2 * totalSlots
	for i, n := range gw {
		if n > bound {
			t.Errorf("fair_queue: sparse-%d waited for %d flood starts, want <= %d (2 x %d slots)", i, n, bound, totalSlots)
		}
	}
	if mg, mp := max(median(gw), 1), median(plain); mp < 5*mg {
		t.Errorf("contrast: median flood starts ahead through reverse_proxy %d, through fair_queue %d; want at least 5x", mp, mg)
	}
}

// runFlood sends floodRequests concurrent flood requests to the fakes
// paused, and once backlog reports the whole flood arrived and held,
// resumes them and sends sparseCount sparse requests spaced sparseEvery
// apart. It
// checks every answer and returns, for each sparse request, how many flood
// requests started at the fakes between its sending and its own start, and
// its X-Fair-Queue-Wait-Ms (empty without the gateway).
func runFlood(t *testing.T, base, label string, fakes []*harness.Fake, backlog func() (bool, string)) ([]int, []string) {
	t.Helper()
	ctx := context.Background()
	cl := newClient(true)
	defer cl.CloseIdleConnections()

	for _, f := range fakes {
		f.Pause()
	}
	t.Cleanup(func() { // a failed wait must not leave the flood held
		for _, f := range fakes {
			f.Resume()
		}
	})
	floodRes := make([]result, floodRequests)
	var wg sync.WaitGroup
	for i := range floodRequests {
		wg.Go(func() {
			floodRes[i] = send(ctx, cl, base, chatReq{Tenant: "flood", TestID: fmt.Sprintf("%s-flood-%d", label, i),
				MaxTokens: floodMaxTokens, IgnoreEOS: true})
		})
	}
	harness.WaitFor(t, label+": the whole flood arrived, the fakes' slots held", backlog)
	for _, f := range fakes {
		f.Resume()
	}

	sparseRes := make([]result, sparseCount)
	tick := time.NewTicker(sparseEvery)
	for i := range sparseCount {
		if i > 0 {
			<-tick.C
		}
		wg.Go(func() {
			sparseRes[i] = send(ctx, cl, base, chatReq{Tenant: "sparse", TestID: fmt.Sprintf("%s-sparse-%d", label, i),
				MaxTokens: floodMaxTokens, IgnoreEOS: true})
		})
	}
	tick.Stop()
	wg.Wait()

	for _, r := range append(floodRes, sparseRes...) {
		if r.Err != nil || r.Status != 200 {
			t.Fatalf("%s: every request must be served: %v", label, r)
		}
	}
	recs := records(t, fakes...)
	var floodStarts []int64
	for i := range floodRequests {
		r, ok := recs[fmt.Sprintf("%s-flood-%d", label, i)]
		if !ok || r.StartedUnixNano == 0 || r.Outcome != "ok" {
			t.Fatalf("%s: flood-%d: fake record %+v (found %t)", label, i, r, ok)
		}
		floodStarts = append(floodStarts, r.StartedUnixNano)
	}
	ahead := make([]int, sparseCount)
	waits := make([]string, sparseCount)
	for i, sr := range sparseRes {
		waits[i] = sr.Header.Get("X-Fair-Queue-Wait-Ms")
		r, ok := recs[sr.TestID]
		if !ok || r.StartedUnixNano == 0 || r.Outcome != "ok" {
			t.Fatalf("%s: %s: fake record %+v (found %t)", label, sr.TestID, r, ok)
		}
		// Ahead of it: the flood requests that started while it waited.
		// Through the gateway, from its arrival there, which its wait
		// gives (a client's request on a loaded machine may take a while
		// to arrive, and the flood goes on meanwhile: not the gateway's
		// doing); through the plain proxy, from its sending.
		sent := sr.Sent.UnixNano()
		from := sent
		if ms, err := strconv.Atoi(waits[i]); err == nil {
			from = max(sent, r.StartedUnixNano-int64(ms)*int64(time.Millisecond))
		}
		after := 0
		for _, s := range floodStarts {
			if s > from && s < r.StartedUnixNano {
				ahead[i]++
			}
			if s > sent {
				after++
			}
		}
		// The comparison is only meaningful while the flood still has a
		// backlog when this request arrives.
		if after < 2*len(fakes)*floodSlots {
			t.Fatalf("%s: %s: only %d flood requests started after it was sent: the flood did not keep a backlog, the test proves nothing", label, sr.TestID, after)
		}
	}
	return ahead, waits
}
