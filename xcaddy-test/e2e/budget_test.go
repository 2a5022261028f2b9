package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Wait budgets end to end (DESIGN.md section 4): under a flood, a request
// that cannot start within its budget is told so at once, before any
// upstream sees it; one whose budget runs out while queued is told so
// before its budget ends; one a boost can save is dispatched ahead.

const (
	budgetSlots = 4 // per fake and max_inflight: 8 slots with two fakes
	// budgetFloodWorkers closed-loop senders keep about this many flood
	// requests queued (minus the slots): at ~100 ms a request and 8 slots,
	// some 2.4 s of work stand in front of a request at the back.
	budgetFloodWorkers = 200
	// budgetFloodTokens with ignore_eos: 20 ms to first token + 40 x 2 ms.
	budgetFloodTokens = 40
	// probeTokens makes a probe large: with weight 1 against the flood's
	// 50, its virtual finish puts all of the flood's queue ahead of it.
	probeTokens = 200
)

const budgetTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	` + accessLogTmpl + `
	fair_queue {
		max_inflight {{.Slots}}
		class realtime wait_budget 2s
		tenant flood  weight 50 class batch
		tenant deep   weight 50 class batch
		tenant rt     weight 1  class realtime
		tenant canary weight 1  class realtime
		tenant hold   weight 1  class batch
		{{.AntiStarvation}}
		reverse_proxy {{.Upstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// budgetGateway starts two fakes and a gateway with budgetTmpl.
func budgetGateway(t *testing.T, prefix, antiStarvation string) ([]*harness.Fake, *harness.Caddy, string, accessLog) {
	t.Helper()
	fakes := startFakes(t, 2, prefix, harness.FakeOptions{Slots: budgetSlots, TTFT: 20 * time.Millisecond, PerToken: 2 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	log := accessLog(filepath.Join(t.TempDir(), "access.log"))
	c := startCaddy(t, budgetTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": budgetSlots,
		"Upstreams": addrs(fakes...), "AntiStarvation": antiStarvation, "AccessLog": log})
	waitMetricEq(t, c, float64(2*budgetSlots), "caddy_fair_queue_capacity")
	return fakes, c, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]), log
}

// startBudgetFlood starts the flood and waits for its backlog.
func startBudgetFlood(t *testing.T, c *harness.Caddy, cl *http.Client, base string, fakes []*harness.Fake) *closedFlood {
	t.Helper()
	f := startClosedFlood(cl, base, "flood", "flood", budgetFloodWorkers, budgetFloodTokens)
	t.Cleanup(func() {
		// On a failure path: let held requests finish, then stop. Stop
		// twice is harmless.
		for _, fk := range fakes {
			fk.Resume()
		}
		f.Stop()
	})
	want := float64(budgetFloodWorkers - 2*budgetSlots - 20)
	waitMetric(t, c, fmt.Sprintf("a flood backlog of %v", want), func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_queue_depth", "tenant", "flood") >= want
	})
	return f
}

// warmUp waits until the throughput estimator measures the flood: it
// sends canaries (tenant canary, a short X-Wait-Budget, behind the whole
// flood) one at a time until one gets the answer that only a measured rate
// gives (warm). Before that the queue has no rate and never refuses on a
// guess: a canary is queued and expires (queue_timeout). Every canary's
// answer is checked against the allowed ones.
func warmUp(t *testing.T, cl *http.Client, base string, budget time.Duration, warm func(timedResult) bool, allowed ...string) []timedResult {
	t.Helper()
	var out []timedResult
	limit := harness.Scale(60 * time.Second)
	deadline := time.Now().Add(limit)
	for i := 0; ; i++ {
		r := sendTimed(context.Background(), cl, base, chatReq{Tenant: "canary", TestID: fmt.Sprintf("canary-%d", i),
			MaxTokens: probeTokens, Header: map[string]string{"X-Wait-Budget": budget.String()}})
		out = append(out, r)
		if warm(r) {
			t.Logf("estimator warm: canary-%d answered %d after %d canaries", i, r.Status, i+1)
			return out
		}
		ok := false
		for _, code := range allowed {
			if r.Err == nil && r.Status == http.StatusServiceUnavailable && strings.Contains(string(r.Body), `"code":"`+code+`"`) {
				ok = true
			}
		}
		if !ok {
			t.Fatalf("canary-%d: unexpected answer while warming up (allowed: 503 %v): %v", i, allowed, r)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for the throughput estimator to measure the flood (a canary answered as only a measured rate answers): not within %s (%d canaries, last %v)", limit, i+1, r)
		}
		time.Sleep(250 * time.Millisecond) // pacing only: one canary at a time
	}
}

func isCode(r timedResult, status int, code string) bool {
	return r.Err == nil && r.Status == status && strings.Contains(string(r.Body), `"code":"`+code+`"`)
}

// TestFastFailUnderFlood: with boosting off, a request that cannot start
// within its budget — behind a long queue of other tenants' work, or behind
// its own tenant's deep queue — gets 503 wait_budget_exceeded with
// Retry-After at once: no upstream ever sees it and the answer is complete
// before its budget has elapsed. A request admitted on a good estimate
// whose budget then runs out in the queue gets 503 queue_timeout before its
// budget ends, never reaching upstream.
func TestFastFailUnderFlood(t *testing.T) {
	t.Parallel()
	fakes, c, base, log := budgetGateway(t, "ff", "anti_starvation {\n\t\t\tboost_share_max 0\n\t\t}")
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx := context.Background()

	flood := startBudgetFlood(t, c, cl, base, fakes)
	const canaryBudget = 200 * time.Millisecond
	canaries := warmUp(t, cl, base, canaryBudget, func(r timedResult) bool {
		return isCode(r, 503, "wait_budget_exceeded")
	}, "queue_timeout")
	var refusedIDs []string
	for _, r := range canaries {
		refusedIDs = append(refusedIDs, r.TestID)
		code := "queue_timeout"
		if isCode(r, 503, "wait_budget_exceeded") {
			code = "wait_budget_exceeded"
		}
		expectRefusedWithinBudget(t, log, r, code, canaryBudget)
	}

	// Behind other tenants' work: tenant rt (weight 1) behind the flood
	// (weight 50), asking for 200ms.
	const rtBudget = 200 * time.Millisecond
	s := scrape(t, c)
	t.Logf("flood queue depth %v, flood served so far %v", metric(s, "caddy_fair_queue_queue_depth", "tenant", "flood"),
		metric(s, "caddy_fair_queue_requests_total", "tenant", "flood", "outcome", "served"))
	const probes = 3
	for i := range probes {
		r := sendTimed(ctx, cl, base, chatReq{Tenant: "rt", TestID: fmt.Sprintf("rt-behind-%d", i), MaxTokens: probeTokens,
			Header: map[string]string{"X-Wait-Budget": rtBudget.String()}})
		expectRefusedWithinBudget(t, log, r, "wait_budget_exceeded", rtBudget)
		refusedIDs = append(refusedIDs, r.TestID)
	}

	// Behind its own deep queue: tenant deep queues a burst (batch, 300s
	// budget: admitted), then asks for 300ms on one more.
	const deepBurst, deepBudget = 80, 300 * time.Millisecond
	var deepReqs []chatReq
	for i := range deepBurst {
		deepReqs = append(deepReqs, chatReq{Tenant: "deep", TestID: fmt.Sprintf("deep-%d", i), MaxTokens: budgetFloodTokens, IgnoreEOS: true})
	}
	deepDone := make(chan []result, 1)
	go func() { deepDone <- sendAll(ctx, cl, base, deepReqs) }()
	s = waitMetric(t, c, "tenant deep's own queue >= 60", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_queue_depth", "tenant", "deep") >= 60
	})
	t.Logf("tenant deep queue depth %v", metric(s, "caddy_fair_queue_queue_depth", "tenant", "deep"))
	for i := range probes {
		r := sendTimed(ctx, cl, base, chatReq{Tenant: "deep", TestID: fmt.Sprintf("deep-probe-%d", i), MaxTokens: budgetFloodTokens,
			Header: map[string]string{"X-Wait-Budget": deepBudget.String()}})
		expectRefusedWithinBudget(t, log, r, "wait_budget_exceeded", deepBudget)
		refusedIDs = append(refusedIDs, r.TestID)
	}
	expectAllServed(t, "tenant deep's burst", <-deepDone)
	// A canary refused at once no longer means a measured rate: the
	// queue refuses on a bound before it has measured (early refusal).
	// The ETA check below needs flood requests admitted on a measured
	// rate and dispatched: keep the flood up until there are some.
	waitMetric(t, c, "flood requests dispatched with a measured ETA", func(s harness.Series) bool {
		_, n := histogramMean(s, "caddy_fair_queue_eta_ratio", "flood")
		return n > 0
	})
	floodRes := flood.Stop()
	expectAllServed(t, "flood", floodRes)
	t.Logf("flood: %d requests served", len(floodRes))

	s = waitMetric(t, c, "the queue drained", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_inflight") == 0 && metric(s, "caddy_fair_queue_queue_depth") == 0
	})
	for tenant, want := range map[string]float64{"rt": probes, "deep": probes} {
		if got := metric(s, "caddy_fair_queue_requests_total", "tenant", tenant, "outcome", "wait_budget_exceeded"); got != want {
			t.Errorf("requests_total{tenant=%q,outcome=\"wait_budget_exceeded\"} = %v, want %v", tenant, got, want)
		}
	}
	if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "canary", "outcome", "wait_budget_exceeded"); n < 1 {
		t.Errorf("requests_total{tenant=\"canary\",outcome=\"wait_budget_exceeded\"} = %v, want >= 1", n)
	}
	for _, tenant := range []string{"rt", "deep"} {
		if n := metric(s, "caddy_fair_queue_requests_total", "tenant", tenant, "outcome", "queue_timeout"); n != 0 {
			t.Errorf("tenant %s: %v queue_timeout: its refusals should all have been at admission", tenant, n)
		}
	}
	mean, count := histogramMean(s, "caddy_fair_queue_eta_ratio", "flood")
	if count == 0 {
		t.Errorf("caddy_fair_queue_eta_ratio has no observation for the flood's queued requests; fair_queue series:\n%s", fairQueueSeries(s))
	}
	t.Logf("eta_ratio (predicted/actual wait) over %v dispatched flood requests: mean %.2f", count, mean)

	// Budget runs out while queued: every slot held (the fakes paused), so
	// requests admitted on an ETA of "the next slot" never get one.
	for _, f := range fakes {
		f.Pause()
	}
	holds := fillSlots(t, base, "hold", "hold", 2*budgetSlots, fakes...)
	qtClass := asyncTimed(ctx, cl, base, chatReq{Tenant: "rt", TestID: "qt-class", MaxTokens: 5, IgnoreEOS: true})
	qtHeader := asyncTimed(ctx, cl, base, chatReq{Tenant: "rt", TestID: "qt-header", MaxTokens: 5, IgnoreEOS: true,
		Header: map[string]string{"X-Wait-Budget": "1s"}})
	waitMetricEq(t, c, 2, "caddy_fair_queue_queue_depth", "tenant", "rt")
	rClass := await(t, qtClass, "qt-class")
	rHeader := await(t, qtHeader, "qt-header")
	expectRefusedWithinBudget(t, log, rClass, "queue_timeout", 2*time.Second)
	expectRefusedWithinBudget(t, log, rHeader, "queue_timeout", time.Second)
	refusedIDs = append(refusedIDs, "qt-class", "qt-header")
	for _, f := range fakes {
		f.Resume()
	}
	for i, ch := range holds {
		expectServed(t, await(t, ch, fmt.Sprint("hold-", i)))
	}
	waitMetricEq(t, c, 2, "caddy_fair_queue_requests_total", "tenant", "rt", "outcome", "queue_timeout")
	expectNotUpstream(t, fakes, refusedIDs...)
}

// TestBudgetBoostUnderFlood: with the default boost budget, a realtime
// request that tag order puts behind the whole flood is boosted: it is
// dispatched at the next free slot, ahead of the flood requests queued
// before it, and counted in caddy_fair_queue_boosts_total. A boosted request
// whose slot does not come (every upstream slot held) still gets 503 before
// its budget ends.
func TestBudgetBoostUnderFlood(t *testing.T) {
	t.Parallel()
	fakes, c, base, log := budgetGateway(t, "bo", "")
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx := context.Background()

	flood := startBudgetFlood(t, c, cl, base, fakes)
	const probeBudget = 500 * time.Millisecond
	canaries := warmUp(t, cl, base, probeBudget, func(r timedResult) bool {
		return r.Err == nil && r.Status == 200
	}, "queue_timeout", "wait_budget_exceeded")
	var refusedIDs []string
	for _, r := range canaries[:len(canaries)-1] {
		refusedIDs = append(refusedIDs, r.TestID)
	}
	expectServed(t, canaries[len(canaries)-1].result)
	s := waitMetric(t, c, "the boosted canary complete", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_boosted_inflight") == 0
	})
	if n := metric(s, "caddy_fair_queue_boosts_total", "tenant", "canary"); n < 1 {
		t.Errorf("the served canary was not counted as boosted: boosts_total{tenant=\"canary\"} = %v", n)
	}

	depth := metric(s, "caddy_fair_queue_queue_depth", "tenant", "flood")
	boosts0 := metric(s, "caddy_fair_queue_boosts_total", "tenant", "rt")
	probe := sendTimed(ctx, cl, base, chatReq{Tenant: "rt", TestID: "rt-boost", MaxTokens: probeTokens,
		Header: map[string]string{"X-Wait-Budget": probeBudget.String()}})
	expectServed(t, probe.result)
	t.Logf("rt-boost: served, X-Fair-Queue-Wait-Ms %s (budget %s), flood queue depth when sent %v",
		probe.Header.Get("X-Fair-Queue-Wait-Ms"), probeBudget, depth)
	waitMetricEq(t, c, boosts0+1, "caddy_fair_queue_boosts_total", "tenant", "rt")

	// A stall: every upstream slot held. Tag order puts rt-stall behind
	// the whole flood, while the estimator still expects a slot within
	// milliseconds: it is boosted at admission and waits in the boost
	// lane for a slot that does not come. It must still be answered
	// before its budget ends (Tick expires it), not when a slot finally
	// frees.
	for _, f := range fakes {
		f.Pause()
	}
	// Held is what the fakes say: requests holding a slot before their
	// first token, which no request does while paused but the ones that
	// took their slot after the pause (or just before it, before they
	// looked). The gateway agrees: all its slots in flight.
	harness.WaitFor(t, "every upstream slot held at the paused fakes (their held count) and in flight at the gateway (its inflight gauge)", func() (bool, string) {
		held := 0
		for _, f := range fakes {
			held += f.Stats().Held
		}
		inflight := metric(scrape(t, c), "caddy_fair_queue_inflight")
		return held == 2*budgetSlots && inflight == 2*budgetSlots, fmt.Sprintf("%d held at the fakes, %v in flight at the gateway", held, inflight)
	})
	stallCh := asyncTimed(ctx, cl, base, chatReq{Tenant: "rt", TestID: "rt-stall", MaxTokens: probeTokens,
		Header: map[string]string{"X-Wait-Budget": probeBudget.String()}})
	// Its answer must come while every slot is still held: the guard
	// is long past its budget, and then the upstreams resume so that the
	// failure shows what the request got instead.
	var stall timedResult
	guard := probeBudget + harness.Scale(10*time.Second)
	select {
	case stall = <-stallCh:
	case <-time.After(guard):
		for _, f := range fakes {
			f.Resume()
		}
		stall = await(t, stallCh, "rt-stall")
		t.Errorf("waiting for rt-stall's answer (X-Wait-Budget %s, every slot held): none %s after it was sent; once the upstreams resumed it got, %s after sending: %v",
			probeBudget, guard, stall.Latency().Round(time.Millisecond), stall.result)
	}
	for _, f := range fakes {
		f.Resume()
	}
	code := "queue_timeout"
	if isCode(stall, 503, "wait_budget_exceeded") {
		code = "wait_budget_exceeded"
	}
	expectRefusedWithinBudget(t, log, stall, code, probeBudget)
	refusedIDs = append(refusedIDs, "rt-stall")

	floodRes := flood.Stop()
	expectAllServed(t, "flood", floodRes)
	t.Logf("flood: %d requests served", len(floodRes))

	// Dispatched ahead: the flood requests sent before the probe that
	// started upstream after it. In tag order (weight 1 against 50, and a
	// large request) it would have been behind all of the flood's queue.
	recs := records(t, fakes...)
	pr, ok := recs["rt-boost"]
	if !ok || pr.StartedUnixNano == 0 {
		t.Fatalf("rt-boost: no fake record of its start: %+v", pr)
	}
	overtaken := 0
	for _, r := range floodRes {
		fr, ok := recs[r.TestID]
		if !ok || fr.StartedUnixNano == 0 {
			t.Fatalf("%s: served, but no fake record of its start", r.TestID)
		}
		if r.Sent.Before(probe.Sent) && fr.StartedUnixNano > pr.StartedUnixNano {
			overtaken++
		}
	}
	t.Logf("rt-boost started upstream ahead of %d flood requests sent before it (flood queue depth %v when it was sent)", overtaken, depth)
	if float64(overtaken) < depth/2 {
		t.Errorf("rt-boost overtook %d flood requests queued before it, want at least half the flood's queue (%v): it was not dispatched ahead", overtaken, depth)
	}

	s = waitMetric(t, c, "the queue drained", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_inflight") == 0 && metric(s, "caddy_fair_queue_queue_depth") == 0
	})
	if n := metric(s, "caddy_fair_queue_boosts_total", "tenant", "flood"); n != 0 {
		t.Errorf("flood requests (batch, 300s budget) were boosted: %v", n)
	}
	mean, count := histogramMean(s, "caddy_fair_queue_eta_ratio", "flood")
	if count == 0 {
		t.Errorf("caddy_fair_queue_eta_ratio has no observation for the flood; fair_queue series:\n%s", fairQueueSeries(s))
	}
	t.Logf("eta_ratio over %v dispatched flood requests: mean %.2f; boosts: canary %v, rt %v", count, mean,
		metric(s, "caddy_fair_queue_boosts_total", "tenant", "canary"), metric(s, "caddy_fair_queue_boosts_total", "tenant", "rt"))
	expectNotUpstream(t, fakes, refusedIDs...)
}
