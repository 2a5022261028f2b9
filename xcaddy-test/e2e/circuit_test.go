package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Tiered circuit breaking end to end: a low-tier and a high-tier tenant
// together send 1.5x what the fakes serve; the circuit sheds low (429
// circuit_open, logged with the caller) within its window and hold, never
// high, and readmits low by itself once demand falls.

const circuitTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 4
		tenant bulk weight 1 class interactive tier low
		tenant core weight 1 class interactive tier high
		circuit_break {
			trigger 1.3
			recover 1.0
			hold 2s
			window 2s
			order low high
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// openLoop sends tenant's requests at rate per second until stop closes,
// each in its own goroutine, and collects the answers.
type openLoop struct {
	mu  sync.Mutex
	res []result
	wg  sync.WaitGroup
}

func (o *openLoop) run(cl *http.Client, base, tenant string, rate float64, stop <-chan struct{}) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		o.wg.Go(func() {
			r := send(context.Background(), cl, base, chatReq{Tenant: tenant, TestID: fmt.Sprintf("%s-%d", tenant, i), MaxTokens: 40, IgnoreEOS: true})
			o.mu.Lock()
			o.res = append(o.res, r)
			o.mu.Unlock()
		})
	}
}

// count is how many answers so far match.
func (o *openLoop) count(match func(result) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, r := range o.res {
		if match(r) {
			n++
		}
	}
	return n
}

func (o *openLoop) results() []result {
	o.wg.Wait()
	return o.res
}

// It runs alone: the shed is timed against the overload's start.
func TestCircuitShedsLowTier(t *testing.T) {
	// 2 fakes x 4 slots, 10 ms + 40 x 5 ms = 210 ms a request: about 38
	// requests/s.
	fakes := startFakes(t, 2, "cb", harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 5 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, circuitTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 8, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()

	// Overload: bulk 0.9x, core 0.6x.
	var bulk, core openLoop
	stopBulk, stopCore := make(chan struct{}), make(chan struct{})
	overload := time.Now()
	go bulk.run(cl, base, "bulk", 34, stopBulk)
	go core.run(cl, base, "core", 23, stopCore)
	waitMetric(t, c, "circuit sheds low", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_circuit_shed", "tier", "low") == 1
	})
	// The overload goes on: low stays shed (one transition, none back)
	// while bulk is answered circuit_open a third of what it sends in 3 s,
	// and high is served.
	isShed := func(r result) bool {
		return isCode(timedResult{result: r}, http.StatusTooManyRequests, "circuit_open")
	}
	harness.WaitFor(t, "bulk answered circuit_open 34 times while the circuit holds low shed", func() (bool, string) {
		n := bulk.count(isShed)
		return n >= 34, fmt.Sprintf("%d circuit_open answers", n)
	})
	s := scrape(t, c)
	if shed, back := metric(s, "caddy_fair_queue_circuit_transitions_total", "tier", "low", "direction", "shed"),
		metric(s, "caddy_fair_queue_circuit_transitions_total", "tier", "low", "direction", "readmitted"); shed != 1 || back != 0 ||
		metric(s, "caddy_fair_queue_circuit_shed", "tier", "low") != 1 {
		t.Errorf("under the overload low was shed %v times and readmitted %v times, shed now %v; want shed once and held",
			shed, back, metric(s, "caddy_fair_queue_circuit_shed", "tier", "low"))
	}
	// Demand falls to 0.5x with low readmitted: bulk stops, core slows.
	close(stopBulk)
	close(stopCore)
	var lighter openLoop
	stopLight := make(chan struct{})
	go lighter.run(cl, base, "core", 19, stopLight)
	go lighter.run(cl, base, "bulk", 0.5, stopLight)
	s = waitMetric(t, c, "circuit readmits low", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_circuit_shed", "tier", "low") == 0
	})
	close(stopLight)

	if n := metric(s, "caddy_fair_queue_circuit_transitions_total", "tier", "low", "direction", "shed"); n < 1 {
		t.Errorf("circuit_transitions_total shed low = %v", n)
	}
	if n := metric(s, "caddy_fair_queue_circuit_transitions_total", "tier", "high"); n != 0 {
		t.Errorf("the top tier moved: %v transitions", n)
	}
	shed := 0
	for _, r := range append(bulk.results(), lighter.results()...) {
		if r.Tenant == "bulk" && isCode(timedResult{result: r}, http.StatusTooManyRequests, "circuit_open") {
			shed++
			if r.Header.Get("Retry-After") == "" {
				t.Errorf("%s: circuit_open without Retry-After", r.TestID)
			}
		}
	}
	coreServed, coreAll := 0, 0
	for _, r := range append(core.results(), lighter.results()...) {
		if r.Tenant != "core" {
			continue
		}
		coreAll++
		if r.Err == nil && r.Status == http.StatusOK {
			coreServed++
		}
		if isCode(timedResult{result: r}, http.StatusTooManyRequests, "circuit_open") {
			t.Errorf("%s: the top tier was shed", r.TestID)
		}
	}
	if coreServed*100 < coreAll*99 {
		t.Errorf("core served %d of %d requests, want >= 99%%", coreServed, coreAll)
	}
	// The alert: the log names the tier, the ratio and the caller; and the
	// shed came within the window and the hold (2 s + 2 s) of the
	// overload's start, the model servers saturated.
	found := false
	for _, e := range caddyLog(c) {
		if strings.HasPrefix(e.str("msg"), "circuit breaker: circuit shed tier low") {
			ts, _ := e["ts"].(float64)
			at := time.Unix(0, int64(ts*1e9))
			if d := at.Sub(overload); d > 4*time.Second {
				t.Errorf("low shed %v after the overload began, want within window + hold (4 s)", d.Round(time.Millisecond))
			}
			if sat, _ := e["saturation"].(float64); sat < 0.9 {
				t.Errorf("shed logged at saturation %v, want >= 0.9", sat)
			}
			t.Logf("shed %v after the overload began: %s", at.Sub(overload).Round(time.Millisecond), e.str("msg"))
			callers, _ := e["callers"].([]any)
			for _, x := range callers {
				if m, _ := x.(map[string]any); m["tenant"] == "bulk" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("no log entry for the shed naming caller bulk")
	}
	t.Logf("bulk answered circuit_open %d times; core served %d of %d", shed, coreServed, coreAll)
}
