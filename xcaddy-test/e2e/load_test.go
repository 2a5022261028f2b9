package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/loadtest"
)

// TestLoadToolRuns runs a short version of make load (xcaddy-test/fqload):
// two rounds of a second per site, alternating, at max rate. It checks the
// machinery, not the ratios (this machine is shared: timed assertions are
// forbidden; make load reports the ratios as observed): every request of
// both sites was answered 200, the fair rounds went through fair_queue (its
// response header on every answer, its requests_total counting exactly
// them) and the plain rounds did not, the upstream answered every request,
// and every figure the report prints was computed. A shorter control run
// (-control) sends nothing through fair_queue.
func TestLoadToolRuns(t *testing.T) {
	t.Parallel()
	caddyBin, _ := bins(t)
	o := loadtest.Options{Rounds: 2, Duration: time.Second, Warmup: 200 * time.Millisecond, Workers: 4, Tenants: 3}
	rig := loadtest.Start(t, caddyBin, o.MaxInflight())
	metricsURL := rig.Caddy.AdminURL() + "/metrics"
	servedBefore := harness.Metrics(t, metricsURL).Sum("caddy_fair_queue_requests_total", "queue", loadtest.QueueName, "outcome", "served")
	upBefore := rig.Upstream.Served()

	rep, err := loadtest.Run(t.Context(), rig, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.Print(&out)
	t.Logf("short load run (figures not asserted):\n%s", out.String())

	if got := len(rep.Rounds); got != 2*o.Rounds {
		t.Fatalf("%d rounds, want %d", got, 2*o.Rounds)
	}
	sent := map[string]int{}
	for i, r := range rep.Rounds {
		// Strict alternation, plain first.
		wantSite := []string{loadtest.SitePlain, loadtest.SiteFair}[i%2]
		if r.Site != wantSite || r.Index != i/2 {
			t.Errorf("round %d is %s #%d, want %s #%d", i, r.Site, r.Index, wantSite, i/2)
		}
		if r.Requests == 0 || r.OK != r.Requests || r.Errors != 0 {
			t.Errorf("%s #%d: %d requests, %d answered 200, %d errors (first: %s); want all 200",
				r.Site, r.Index, r.Requests, r.OK, r.Errors, r.ErrorSample)
		}
		wantVia := 0
		if r.Site == loadtest.SiteFair {
			wantVia = r.Requests
		}
		if r.ViaFairQueue != wantVia {
			t.Errorf("%s #%d: %d of %d answers carry X-Fair-Queue-Wait-Ms, want %d", r.Site, r.Index, r.ViaFairQueue, r.Requests, wantVia)
		}
		if r.Throughput <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Elapsed <= 0 {
			t.Errorf("%s #%d: throughput %.1f/s, p50 %s, p99 %s over %s: want all positive, p99 >= p50",
				r.Site, r.Index, r.Throughput, r.P50, r.P99, r.Elapsed)
		}
		if r.CaddyCPU <= 0 || r.CPUPerRequest <= 0 {
			t.Errorf("%s #%d: Caddy CPU %s, %s per request: want positive (from /proc/%d/stat)",
				r.Site, r.Index, r.CaddyCPU, r.CPUPerRequest, rig.Caddy.PID())
		}
		sent[r.Site] += r.Requests
	}
	for _, site := range []string{loadtest.SitePlain, loadtest.SiteFair} {
		if rep.Warmup[site] == 0 || rep.WarmupOK[site] != rep.Warmup[site] {
			t.Errorf("%s warm-up: %d of %d answered 200, want all of at least one", site, rep.WarmupOK[site], rep.Warmup[site])
		}
	}

	// fair_queue served exactly the fair site's requests: none of the plain
	// site's went through it, none of the fair site's went around it.
	// fair_queue counts a request once the proxy has returned, which may be
	// just after the client has its answer: wait for the count to get
	// there, then check it did not go past.
	fairTotal := sent[loadtest.SiteFair] + rep.Warmup[loadtest.SiteFair]
	var served float64
	harness.WaitFor(t, "fair_queue to count the fair site's requests", func() (bool, string) {
		served = harness.Metrics(t, metricsURL).Sum("caddy_fair_queue_requests_total", "queue", loadtest.QueueName, "outcome", "served") - servedBefore
		return served >= float64(fairTotal), fmt.Sprintf("%v served", served)
	})
	if served != float64(fairTotal) {
		t.Errorf("caddy_fair_queue_requests_total{outcome=served} grew by %v, want %d (the fair site's requests)", served, fairTotal)
	}
	all := fairTotal + sent[loadtest.SitePlain] + rep.Warmup[loadtest.SitePlain]
	if got := rig.Upstream.Served() - upBefore; got != uint64(all) {
		t.Errorf("upstream answered %d requests, want %d (every request of both sites)", got, all)
	}

	s := rep.Summary()
	for name, v := range map[string]float64{
		"throughput ratio": s.ThroughputRatio, "p50 ratio": s.P50Ratio,
		"p99 ratio": s.P99Ratio, "cpu/request ratio": s.CPURatio,
	} {
		if v <= 0 {
			t.Errorf("%s = %v, want computed (positive)", name, v)
		}
	}
	if len(s.PairThroughput) != o.Rounds || len(s.PairP50) != o.Rounds || len(s.PairCPU) != o.Rounds {
		t.Errorf("round-by-round ratios: %d/%d/%d, want %d each", len(s.PairThroughput), len(s.PairP50), len(s.PairCPU), o.Rounds)
	}
	if s.Plain.Requests != sent[loadtest.SitePlain] || s.Fair.Requests != sent[loadtest.SiteFair] {
		t.Errorf("summary counts plain %d fair %d requests, rounds sent %d and %d",
			s.Plain.Requests, s.Fair.Requests, sent[loadtest.SitePlain], sent[loadtest.SiteFair])
	}

	// Control mode (-control): the second site is another plain
	// reverse_proxy, so nothing goes through fair_queue.
	co := o
	co.Rounds, co.Duration, co.Control = 1, 300*time.Millisecond, true
	servedBefore = harness.Metrics(t, metricsURL).Sum("caddy_fair_queue_requests_total", "queue", loadtest.QueueName, "outcome", "served")
	crep, err := loadtest.Run(t.Context(), rig, co, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(crep.Rounds) != 2 || crep.Rounds[0].Site != loadtest.SitePlain || crep.Rounds[1].Site != loadtest.SiteControl {
		t.Fatalf("control run: rounds %+v, want plain then control", crep.Rounds)
	}
	for _, r := range crep.Rounds {
		if r.Requests == 0 || r.OK != r.Requests || r.ViaFairQueue != 0 {
			t.Errorf("control run, %s: %d requests, %d answered 200, %d through fair_queue; want all 200, none through it",
				r.Site, r.Requests, r.OK, r.ViaFairQueue)
		}
	}
	if cs := crep.Summary(); cs.Fair.Requests != crep.Rounds[1].Requests || cs.ThroughputRatio <= 0 {
		t.Errorf("control summary: second site %d requests (round sent %d), throughput ratio %v",
			cs.Fair.Requests, crep.Rounds[1].Requests, cs.ThroughputRatio)
	}
	if d := harness.Metrics(t, metricsURL).Sum("caddy_fair_queue_requests_total", "queue", loadtest.QueueName, "outcome", "served") - servedBefore; d != 0 {
		t.Errorf("control run: fair_queue served %v requests, want 0", d)
	}
}
