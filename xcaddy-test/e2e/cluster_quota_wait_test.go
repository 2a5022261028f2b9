package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// clusterQuotaWaitTmpl: a gateway of three sharing a realtime tenant's
// quota through Redis (no burst: every request exactly at the quota's
// rate), its slots kept busy by a batch tenant.
const clusterQuotaWaitTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 2
		cluster {
			redis     {{.Redis}}
			instances 3
			timeout   ` + clusterTimeout + `
		}
		tenant rt weight 8 class realtime {
			quota qps {{.QPS}} burst_allow 0
		}
		tenant bulk weight 1 class batch
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// The quota is high enough that each gateway sees about 550 of the
// tenant's requests: a refusal rate per gateway then has a standard
// error of about 3% of itself (binomial), and the 10% bound is three of
// them. With 4 requests/s (110 a gateway) it was about 8%, and a run
// under load failed the bound on noise alone (0.545, 0.573, 0.655).
const (
	cqwQPS     = 20 // the realtime tenant's quota, requests/s
	cqwOffered = 55 // its requests/s over the three gateways: 2.75x
	cqwSent    = 1650
	cqwBulk    = 10 // closed-loop bulk senders per gateway: its 4 slots stay busy
)

// TestClusterQuotaHeldThroughThreeGateways: three gateways behind a
// round robin share a realtime tenant's quota (20 requests/s, 5 s budget)
// while a batch tenant keeps every slot of every gateway busy with
// requests of about 0.75 s, which run alike and so free their slots in
// bunches. The tenant sends 2.75x its quota. Every answer is served or
// refused at once at admission (429 quota_exceeded): none is a
// queue_timeout (before: 25 of 330, the requests that lost the race for
// the quota's next place to another gateway's, or waited for a slot past
// their quota time, at 4 requests/s); the three gateways refuse the same share of the
// requests sent to them, within 10% of their mean (before: 0.58, 0.71 and
// 0.76 in one run, each gateway refusing on its own estimate of the
// others' queues); and the tenant is served its quota, within 5% (before:
// 39%, the quota's time lost to the waits for slots). It runs alone: it
// measures shares of a paced load, which another test's load would skew.
func TestClusterQuotaHeldThroughThreeGateways(t *testing.T) {
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cqw", harness.FakeOptions{Slots: 64, TTFT: 5 * time.Millisecond, PerToken: 5 * time.Millisecond})
	var gws []*harness.Caddy
	var bases []string
	for range 3 {
		p := harness.Ports(t, "Admin", "Site")
		c := startCaddy(t, clusterQuotaWaitTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
			"Upstreams": addrs(fakes...), "QPS": cqwQPS, "Redis": rs.URL()})
		gws = append(gws, c)
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	for _, c := range gws {
		waitMetricEq(t, c, 4, "caddy_fair_queue_capacity")
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
	}
	cl := newClient(true)
	defer cl.CloseIdleConnections()

	// The bulk tenant keeps every slot of every gateway busy, with a
	// backlog, until the realtime load is done.
	stop := make(chan struct{})
	var bulk sync.WaitGroup
	var bulkServed atomic.Int64
	for g, base := range bases {
		for w := range cqwBulk {
			bulk.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					r := send(context.Background(), cl, base, chatReq{Tenant: "bulk", TestID: fmt.Sprintf("bulk-%d-%d-%d", g, w, i), MaxTokens: 150, IgnoreEOS: true})
					if r.Err == nil && r.Status == http.StatusOK {
						bulkServed.Add(1)
					}
				}
			})
		}
	}
	for _, c := range gws {
		waitMetric(t, c, "a bulk backlog", func(s harness.Series) bool {
			return metric(s, "caddy_fair_queue_inflight") == 4 && metric(s, "caddy_fair_queue_queue_depth") >= 2
		})
	}

	// The realtime tenant's requests at a steady pace, round robin over
	// the gateways.
	type answer struct {
		gw   int
		code string
		took time.Duration
	}
	answers := make([]answer, cqwSent)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range cqwSent {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / cqwOffered)))
		g := i % len(bases)
		wg.Go(func() {
			start := time.Now()
			r := send(context.Background(), cl, bases[g], chatReq{Tenant: "rt", TestID: fmt.Sprintf("rt-%d", i), MaxTokens: 5, IgnoreEOS: true})
			code := "error " + fmt.Sprint(r.Err)
			if r.Err == nil {
				var body struct {
					Error struct{ Code string } `json:"error"`
				}
				_ = json.Unmarshal(r.Body, &body)
				code = fmt.Sprint(r.Status, " ", body.Error.Code)
			}
			answers[i] = answer{g, code, time.Since(start)}
		})
	}
	wg.Wait()
	close(stop)
	bulk.Wait()

	byGW := make([]map[string]int, len(bases))
	for i := range byGW {
		byGW[i] = map[string]int{}
	}
	timeouts := 0
	var timeoutAt []time.Duration
	for _, a := range answers {
		byGW[a.gw][a.code]++
		switch a.code {
		case "200 ", "429 quota_exceeded", "503 wait_budget_exceeded":
		case "503 queue_timeout":
			timeouts++
			timeoutAt = append(timeoutAt, a.took)
		default:
			t.Errorf("gateway %d: an answer outside the contract: %s", a.gw, a.code)
		}
	}
	rates := make([]float64, len(bases))
	mean := 0.0
	for g, m := range byGW {
		n, refused := 0, 0
		for code, k := range m {
			n += k
			if code != "200 " {
				refused += k
			}
		}
		rates[g] = float64(refused) / float64(n)
		mean += rates[g] / float64(len(bases))
	}
	t.Logf("answers by gateway: %v; refusal rates %.3f; bulk served %d (observed); queue_timeouts after %v", byGW, rates, bulkServed.Load(), timeoutAt)
	var first, last int64
	served := 0
	for _, r := range records(t, fakes...) {
		if r.Tenant != "rt" || r.Outcome != "ok" {
			continue
		}
		if served == 0 || r.ReceivedUnixNano < first {
			first = r.ReceivedUnixNano
		}
		last = max(last, r.ReceivedUnixNano)
		served++
	}
	// No burst: over the span between its first and last dispatch the
	// quota allows qps x span + 1; a booked request goes at or after its
	// time, so the span may be short of its booked times' by the wait for
	// a slot (under a second here).
	allowed := cqwQPS*time.Duration(last-first).Seconds() + 1
	ratio := float64(served) / allowed
	t.Logf("realtime tenant served %d over %v; its quota allows %.1f: ratio %.3f", served, time.Duration(last-first), allowed, ratio)
	if ratio < 0.95 || float64(served) > allowed+cqwQPS {
		t.Errorf("the realtime tenant was served %d requests, %.3f of the %.1f its quota allows over the span; want at least 0.95, and at most a second's worth more", served, ratio, allowed)
	}
	if timeouts != 0 {
		t.Errorf("%d of %d realtime requests held by the quota ended in queue_timeout, want 0", timeouts, cqwSent)
	}
	for g, r := range rates {
		if math.Abs(r-mean) > 0.10*mean {
			t.Errorf("gateway %d refused %.3f of the realtime requests sent to it, the three %.3f: want each within 10%% of their mean %.3f", g, r, rates, mean)
		}
	}
}
