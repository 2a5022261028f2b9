package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Cluster-wide tenant quotas end to end: three gateways share
// one redis-server, so a tenant sending round-robin over them is held to
// its quota, not three times it; when Redis dies no request fails for it,
// each gateway decides on a third of the quota, and when it comes back
// they decide in Redis again.

const clusterTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 8
		cluster {
			redis     {{.Redis}}
			instances 3
			timeout   ` + clusterTimeout + `
		}
		tenant metered weight 1 class interactive wait_budget {{.Budget}} {
			quota tokens_per_min {{.TPM}} burst_window 10s burst_allow 0.2
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

const (
	clusterTPM     = 60000       // 1000 tokens/s
	clusterTau     = 2.0         // s: burst_allow 0.2 x burst_window 10s
	clusterOutput  = 190         // output tokens per request; ~200 with the prompt
	clusterOffered = 15          // requests/s over the three gateways: ~3x the quota
	clusterBudget  = time.Second // scaled: see clusterWaitBudget
)

// clusterWaitBudget is the metered tenant's wait budget: clusterBudget
// stretched by harness.Scale. The test's bound is on the answers
// (none a queue_timeout: each request's quota time is fixed at admission),
// and with a 1 s budget on a 2-core machine running two busy loops and
// the suite beside it a gateway stalled past a booked request's deadline
// (2 of 306 queue_timeout in one such run): a budget is a wait the
// gateway keeps, and a wait is what FQ_TEST_SLOWDOWN stretches. The quota
// ratios below are unchanged by it (the down phase counts the booking
// horizon, which is this budget).
func clusterWaitBudget() time.Duration { return harness.Scale(clusterBudget) }

// clusterTimeout is the timeout per Redis call of every cluster block in
// these tests, not the 50ms default: a loopback redis-server on a loaded
// 2-core machine answers slower than 50 ms now and then (CI logged i/o
// timeouts), and a call over the timeout is an outage to the gateway
// (quotas decided on its own share, pool/instances of the slots), which is
// not what a test of the shared state measures. The tests of outages make
// theirs by killing Redis. docs/cluster.md's "Redis down or slow" says the same to
// users: a timeout below Redis's worst latency turns slowness into outages.
const clusterTimeout = "1s"

// clusterResult is one answer of the load, with the phase it was sent in.
type clusterResult struct {
	result
	phase string
}

// TestClusterQuota runs alone (no t.Parallel): it kills its redis-server
// and starts another on the same port, which another test's client could
// take meanwhile.
func TestClusterQuota(t *testing.T) {
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cluster", harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 50 * time.Microsecond})
	var gws []*harness.Caddy
	var bases []string
	for range 3 {
		p := harness.Ports(t, "Admin", "Site")
		c := startCaddy(t, clusterTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
			"Upstreams": addrs(fakes...), "TPM": clusterTPM, "Redis": rs.URL(), "Budget": clusterWaitBudget()})
		gws = append(gws, c)
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	for _, c := range gws {
		waitMetricEq(t, c, 16, "caddy_fair_queue_capacity")
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
	}

	// Open loop: clusterOffered requests a second, round-robin over the
	// gateways, whatever the answers.
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	var (
		mu      sync.Mutex
		phase   = "A"
		results []clusterResult
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	var loop sync.WaitGroup
	loop.Go(func() {
		tick := time.NewTicker(time.Second / clusterOffered)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			ph := phase
			mu.Unlock()
			base := bases[i%len(bases)]
			id := fmt.Sprintf("%s-%d", ph, i)
			wg.Go(func() {
				r := send(context.Background(), cl, base, chatReq{Tenant: "metered", TestID: id, MaxTokens: clusterOutput, IgnoreEOS: true})
				mu.Lock()
				results = append(results, clusterResult{r, ph})
				mu.Unlock()
			})
		}
	})
	setPhase := func(p string) {
		mu.Lock()
		phase = p
		mu.Unlock()
	}

	// The phases are measurement windows of an open loop, not waits: the
	// bounds are on the tokens served over the span the fakes recorded,
	// whatever the machine's speed made of it.
	//
	// A: 12 s with Redis. The timeout is clusterTimeout, not the 50 ms
	// default: a call over it would make a gateway decide alone for a
	// second (on its third of the quota, from rest), which is the
	// fallback at work, not the shared quota this phase measures.
	time.Sleep(12 * time.Second)
	for i, c := range gws {
		if n := metric(scrape(t, c), "caddy_fair_queue_cluster_fallback_total"); n != 0 {
			t.Errorf("gateway %d decided %v times locally while redis was up (a call over the %s timeout): "+
				"the tokens below are not the shared quota's alone", i, n, clusterTimeout)
		}
	}
	killed := time.Now()
	rs.Kill()
	setPhase("B")
	// B: 8 s without (a measurement window too).
	for _, c := range gws {
		waitMetricEq(t, c, 0, "caddy_fair_queue_cluster_redis_up")
	}
	time.Sleep(time.Until(killed.Add(8 * time.Second)))
	restarted := time.Now()
	rs.Start()
	setPhase("C")
	for _, c := range gws {
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
	}
	// C: with Redis again, until it has served the tenant a few times.
	harness.WaitFor(t, "five requests served with redis back", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if r.phase == "C" && r.Err == nil && r.Status == http.StatusOK {
				n++
			}
		}
		return n >= 5, fmt.Sprintf("%d served", n)
	})
	close(stop)
	loop.Wait()
	wg.Wait()

	// Every answer is served or a documented refusal: 429 quota_exceeded
	// (at admission, where each request is booked on the tenant's quota
	// in Redis, first come first served over the gateways, or refused at
	// once when its place leaves it no time to start), or 503
	// wait_budget_exceeded. None is an error, none a 5xx of another kind,
	// none a queue_timeout: a request's quota time is fixed when it is
	// admitted, and no other gateway can take it.
	count := map[string]map[string]int{}
	timeouts := 0
	for _, r := range results {
		code := "served"
		switch {
		case r.Err != nil:
			t.Errorf("phase %s: %s", r.phase, r.result)
			continue
		case r.Status == http.StatusOK:
		default:
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(r.Body, &body)
			code = fmt.Sprintf("%d %s", r.Status, body.Error.Code)
			switch code {
			case "429 quota_exceeded", "503 wait_budget_exceeded":
			case "503 queue_timeout":
				timeouts++
			default:
				t.Errorf("phase %s: an answer outside the contract: %s", r.phase, r.result)
			}
		}
		if count[r.phase] == nil {
			count[r.phase] = map[string]int{}
		}
		count[r.phase][code]++
	}
	t.Logf("answers by phase: %v", count)
	if timeouts != 0 {
		t.Errorf("%d of %d answers were queue_timeout, want none: a refusal must come when the quota is known not to fit",
			timeouts, len(results))
	}

	// Tokens the fakes served to the tenant, by dispatch time: with Redis
	// up (before the kill) and down (between the kill and the restart).
	recs := records(t, fakes...)
	type span struct {
		first, last int64
		tokens      int
		n           int
	}
	var up, down span
	for _, r := range recs {
		if r.Tenant != "metered" || r.Outcome != "ok" {
			continue
		}
		sp := &up
		switch at := r.ReceivedUnixNano; {
		case at >= restarted.UnixNano():
			continue
		case at >= killed.UnixNano():
			sp = &down
		}
		if sp.n == 0 || r.ReceivedUnixNano < sp.first {
			sp.first = r.ReceivedUnixNano
		}
		sp.last = max(sp.last, r.ReceivedUnixNano)
		sp.tokens += r.PromptTokens + r.OutputTokens
		sp.n++
	}
	rate := float64(clusterTPM) / 60
	// A greedy tenant starting at rest is charged rate x (D + tau) over
	// the D between its first and last dispatch (within one request).
	expect := func(s span) float64 {
		return rate * (time.Duration(s.last-s.first).Seconds() + clusterTau)
	}
	ratioUp := float64(up.tokens) / expect(up)
	t.Logf("redis up: %d requests, %d tokens over %v; quota allows %.0f: ratio %.3f",
		up.n, up.tokens, time.Duration(up.last-up.first), expect(up), ratioUp)
	if ratioUp < 0.95 || ratioUp > 1.05 {
		t.Errorf("with redis up, three gateways served the tenant %d tokens, %.3f of its quota's %.0f; want within 5%%",
			up.tokens, ratioUp, expect(up))
	}
	// Down: each gateway on a third of the quota, its own meter starting
	// at rest (a third of the burst each): together the quota again, far
	// from three times it. The requests booked in Redis before it died
	// still go, at their times: at most the booking horizon's worth of
	// the quota (the budget) on top. Over the 8 s, a request is 2% of
	// the tokens, and each of the three meters may be a request ahead at
	// the end of the span: at most 1.10x.
	expectDown := expect(down) + rate*clusterWaitBudget().Seconds()
	ratioDown := float64(down.tokens) / expectDown
	t.Logf("redis down: %d requests, %d tokens over %v; quota allows %.0f (with the places booked before): ratio %.3f",
		down.n, down.tokens, time.Duration(down.last-down.first), expectDown, ratioDown)
	if down.n == 0 || ratioDown > 1.10 {
		t.Errorf("with redis down, the gateways served the tenant %d tokens, %.3f of the %.0f its quota allows with what was booked before; want some, and at most 1.10x (each on its third)",
			down.tokens, ratioDown, expectDown)
	}

	for i, c := range gws {
		s := scrape(t, c)
		if n := metric(s, "caddy_fair_queue_cluster_fallback_total"); n == 0 {
			t.Errorf("gateway %d: cluster_fallback_total 0 after an outage of redis", i)
		}
		// One outage, logged once as it started and once as it ended,
		// however many requests met it.
		var down, back int
		for _, e := range caddyLog(c) {
			switch msg := e.str("msg"); {
			case strings.HasPrefix(msg, "redis unreachable"):
				down++
			case strings.HasPrefix(msg, "redis answers again"):
				back++
			}
		}
		if down != 1 || back != 1 {
			t.Errorf("gateway %d: logged %d outages and %d recoveries, want 1 and 1", i, down, back)
		}
	}
}
