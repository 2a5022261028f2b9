package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// clusterSlowTmpl: a gateway whose Redis is .Redis (the server itself, or
// a delaying proxy in front of it), with a metered tenant and the rest
// unmetered, and capacity to spare (slots are not what is measured).
const clusterSlowTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 32
		{{.Extra}}
		cluster {
			redis     redis://{{.Redis}}
			instances 2
			timeout   {{.Timeout}}
			prefix    {{.Prefix}}
		}
		tenant metered weight 1 class interactive wait_budget 5s {
			quota qps {{.QPS}} burst_allow 0
		}
		default_tenant weight 1 class interactive wait_budget 5s
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

type slowGateway struct {
	c    *harness.Caddy
	base string
}

func startSlowGateway(t *testing.T, redisAddr, timeout, prefix string, qps int, fakes []*harness.Fake) slowGateway {
	t.Helper()
	return startSlowGatewayWith(t, redisAddr, timeout, prefix, qps, "", fakes)
}

// startSlowGatewayWith is startSlowGateway with extra settings of the
// fair_queue block (one line).
func startSlowGatewayWith(t *testing.T, redisAddr, timeout, prefix string, qps int, extra string, fakes []*harness.Fake) slowGateway {
	t.Helper()
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, clusterSlowTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Redis": redisAddr,
		"Timeout": timeout, "Prefix": prefix, "QPS": qps, "Extra": extra, "Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 64, "caddy_fair_queue_capacity")
	return slowGateway{c, fmt.Sprintf("http://127.0.0.1:%d", p["Site"])}
}

// mixedRun sends 400 requests of an unmetered tenant (16 at a time) while
// a metered tenant sends 100 (8 at a time), and returns how long the
// unmetered ones took and every answer's code by tenant.
// nearAndFar runs the mixed load through near and slow, twice each,
// interleaved, so that the shared machine's noise hits both alike, and
// returns the unmetered tenant's time through each. Every answer through
// slow is a 200, or a documented refusal to the metered tenant; check
// looks at each of slow's runs' answers too. id prefixes the runs' IDs.
func nearAndFar(t *testing.T, near, slow slowGateway, id string, check func(codes map[string]map[string]int)) (tookNear, tookFar time.Duration) {
	t.Helper()
	for i := range 2 {
		d, codes := mixedRun(t, near, fmt.Sprint(id, "near", i))
		tookNear += d
		t.Logf("redis near, run %d: unmetered 400 in %v; answers %v", i, d, codes)
		d, codes = mixedRun(t, slow, fmt.Sprint(id, "far", i))
		tookFar += d
		t.Logf("redis 100 ms away, run %d: unmetered 400 in %v; answers %v", i, d, codes)
		for tenant, byCode := range codes {
			for code, n := range byCode {
				switch {
				case code == "200 ":
				case tenant == "metered" && (code == "429 quota_exceeded" || code == "503 wait_budget_exceeded"):
				default:
					t.Errorf("redis far: %d answers %q to %s", n, code, tenant)
				}
			}
		}
		check(codes)
	}
	return tookNear, tookFar
}

func mixedRun(t *testing.T, g slowGateway, run string) (time.Duration, map[string]map[string]int) {
	t.Helper()
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	var mu sync.Mutex
	codes := map[string]map[string]int{"free": {}, "metered": {}}
	record := func(tenant string, r result) {
		code := "error"
		if r.Err == nil {
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(r.Body, &body)
			code = fmt.Sprint(r.Status, " ", body.Error.Code)
		}
		mu.Lock()
		codes[tenant][code]++
		mu.Unlock()
	}
	workers := func(tenant string, n, total int, next *atomic.Int64, wg *sync.WaitGroup) {
		for w := range n {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(total) {
						return
					}
					r := send(context.Background(), cl, g.base, chatReq{Tenant: tenant, TestID: fmt.Sprintf("%s-%s-%d-%d", run, tenant, w, i), MaxTokens: 3})
					record(tenant, r)
				}
			})
		}
	}
	var free, metered sync.WaitGroup
	var nf, nm atomic.Int64
	start := time.Now()
	workers("metered", 8, 100, &nm, &metered)
	workers("free", 16, 400, &nf, &free)
	free.Wait()
	took := time.Since(start)
	metered.Wait()
	return took, codes
}

// TestClusterSlowRedis: with Redis 100 ms away each way (a delaying proxy
// in front of a real redis-server), and timeout 500ms, a tenant without a
// quota is served as fast as with Redis next to the gateway (within 1.5x),
// while a metered tenant's requests go through Redis: the round trips are
// made off the queue's lock, so only the metered requests wait for them
// (before, the calls were made under it, and the unmetered tenant took
// 11.5 s for what took 1.44 s). The gateway works through Redis, not in
// its local fallback: a new connection's set-up is not counted against
// timeout (before, every call on a new connection failed at this
// distance). With timeout 150ms, below the round trip, Redis counts as
// down: redis_up 0, and the metered tenant is held to its local share of
// the quota.
func TestClusterSlowRedis(t *testing.T) {
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cslow", harness.FakeOptions{Slots: 64, TTFT: time.Millisecond, PerToken: 100 * time.Microsecond})
	far := harness.StartDelayProxy(t, rs.Addr(), 100*time.Millisecond)
	near := startSlowGateway(t, rs.Addr(), "500ms", "near:", 20, fakes)
	slow := startSlowGateway(t, far.Addr(), "500ms", "far:", 20, fakes)
	waitMetricEq(t, slow.c, 1, "caddy_fair_queue_cluster_redis_up")

	tookNear, tookFar := nearAndFar(t, near, slow, "", func(codes map[string]map[string]int) {
		if codes["metered"]["200 "] == 0 {
			t.Error("redis far: no metered request served")
		}
	})
	ratio := tookFar.Seconds() / tookNear.Seconds()
	t.Logf("unmetered tenant: %v with redis near, %v with redis 100 ms away: ratio %.2f", tookNear, tookFar, ratio)
	if ratio > 1.5 {
		t.Errorf("the unmetered tenant took %.2fx as long with redis 100 ms away (%v against %v); want at most 1.5x", ratio, tookFar, tookNear)
	}
	// Through Redis all along: no outage, no local decision, and the
	// metered tenant's meter is in Redis.
	s := scrape(t, slow.c)
	if up, fb := metric(s, "caddy_fair_queue_cluster_redis_up"), metric(s, "caddy_fair_queue_cluster_fallback_total"); up != 1 || fb != 0 {
		t.Errorf("redis 200 ms round trip, timeout 500ms: redis_up %v, %v local decisions; want 1 and none", up, fb)
	}

	// Past timeout: down, and decided locally on half the quota (2
	// instances): 10 a second, not 20.
	down := startSlowGateway(t, far.Addr(), "150ms", "down:", 20, fakes)
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	send(context.Background(), cl, down.base, chatReq{Tenant: "metered", TestID: "down-first", MaxTokens: 3})
	waitMetricEq(t, down.c, 0, "caddy_fair_queue_cluster_redis_up")
	var served atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(3 * time.Second)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				r := send(context.Background(), cl, down.base, chatReq{Tenant: "metered", TestID: fmt.Sprintf("down-%d-%d", w, i), MaxTokens: 3})
				if r.Err == nil && r.Status == http.StatusOK {
					served.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	s = scrape(t, down.c)
	if up := metric(s, "caddy_fair_queue_cluster_redis_up"); up != 0 {
		t.Errorf("timeout 150ms with a 200 ms round trip: redis_up %v, want 0", up)
	}
	if fb := metric(s, "caddy_fair_queue_cluster_fallback_total"); fb == 0 {
		t.Error("timeout 150ms with a 200 ms round trip: no local decision counted")
	}
	// Locally 10 a second, no burst: at most 10 x the time, plus the
	// first.
	if allowed := 10*took.Seconds() + 2; float64(served.Load()) > allowed || served.Load() < 10 {
		t.Errorf("redis down: the metered tenant was served %d requests in %v; want some, and at most %.0f (half its quota, locally)", served.Load(), took, allowed)
	}
	t.Logf("redis past timeout: %d metered requests served in %v (local share: 10/s)", served.Load(), took)
}

// TestClusterSlowRedisProviderAccount: TestClusterSlowRedis with a
// provider account (upstream_quota), which every request draws on at
// dispatch, under the queue's lock. With Redis 100 ms away each way and
// timeout 500ms, the tenant without a quota is still served as fast as
// with Redis next to the gateway (within 1.5x): the account is decided in
// memory on the gateway's share of it (a quota.Mirror) and synced with
// Redis off the lock (before, its Status and Charge went to Redis under
// the lock, two round trips per dispatch that every tenant waited on). The
// syncs reach Redis (cluster_account_sync_seconds counts them, none
// failed). The account is large enough not to bind: what is measured is
// the lock, not the account.
func TestClusterSlowRedisProviderAccount(t *testing.T) {
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cslowacct", harness.FakeOptions{Slots: 64, TTFT: time.Millisecond, PerToken: 100 * time.Microsecond})
	far := harness.StartDelayProxy(t, rs.Addr(), 100*time.Millisecond)
	const account = "upstream_quota rpm 60000 tpm 10000000"
	near := startSlowGatewayWith(t, rs.Addr(), "500ms", "anear:", 20, account, fakes)
	slow := startSlowGatewayWith(t, far.Addr(), "500ms", "afar:", 20, account, fakes)
	waitMetricEq(t, slow.c, 1, "caddy_fair_queue_cluster_redis_up")

	tookNear, tookFar := nearAndFar(t, near, slow, "a", func(codes map[string]map[string]int) {
		if codes["free"]["200 "] != 400 {
			t.Errorf("redis far: %d of the unmetered tenant's 400 served; want all", codes["free"]["200 "])
		}
	})
	ratio := tookFar.Seconds() / tookNear.Seconds()
	t.Logf("unmetered tenant with a provider account: %v with redis near, %v with redis 100 ms away: ratio %.2f", tookNear, tookFar, ratio)
	if ratio > 1.5 {
		t.Errorf("the unmetered tenant took %.2fx as long with redis 100 ms away (%v against %v); want at most 1.5x", ratio, tookFar, tookNear)
	}
	s := scrape(t, slow.c)
	syncs, errs := metric(s, "caddy_fair_queue_cluster_account_sync_seconds_count"), metric(s, "caddy_fair_queue_cluster_account_sync_errors_total")
	if syncs == 0 || errs != 0 {
		t.Errorf("redis 200 ms round trip, timeout 500ms: %v syncs of the account, %v failed; want some, none failed", syncs, errs)
	}
	if syncs > 0 {
		t.Logf("observed: %v syncs of the account, %.0f ms each on average", syncs, 1000*metric(s, "caddy_fair_queue_cluster_account_sync_seconds_sum")/syncs)
	}
	if up := metric(s, "caddy_fair_queue_cluster_redis_up"); up != 1 {
		t.Errorf("redis_up %v with redis 200 ms away and timeout 500ms; want 1", up)
	}
}
