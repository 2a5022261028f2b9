package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// clusterSlotsTmpl: gateways sharing a pool's slots (and, with .Fairness,
// their tenants' service, of the tenants declared: wide and narrow);
// tenant rt, of weight 9, claims slots when its requests queue.
const clusterSlotsTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 4
		class batch wait_budget 60s
		tenant rt weight 9 class interactive
		{{if .Fairness}}tenant wide weight 1 class batch
		tenant narrow weight 1 class batch{{end}}
		cluster {
			redis {{.Redis}}
			timeout ` + clusterTimeout + `
			instances {{.Instances}}
			share_slots
			{{if .Fairness}}share_fairness{{end}}
			sync 100ms
			lease_ttl {{.LeaseTTL}}
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// maxConcurrent is the most requests the fakes had at once, from their own
// records: received to finished, less 2 ms at the end, the time a fake may
// take to record a finish after its client has the whole response (the
// gateway frees the slot and the next request can arrive meanwhile).
func maxConcurrent(t *testing.T, fakes ...*harness.Fake) int {
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, rec := range records(t, fakes...) {
		if rec.FinishedUnixNano == 0 {
			continue
		}
		edges = append(edges, edge{rec.ReceivedUnixNano, 1}, edge{max(rec.FinishedUnixNano-2e6, rec.ReceivedUnixNano), -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // a finish before a start at the same instant
	})
	cur, peak := 0, 0
	for _, e := range edges {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak
}

// waitFirstGrants waits until every gateway has had its first grant from
// Redis, so that the split the tests check starts from grants rather than
// from a gateway's first moments (it dispatches nothing before its first
// grant).
func waitFirstGrants(t testing.TB, gws ...*harness.Caddy) {
	t.Helper()
	for i, c := range gws {
		harness.WaitFor(t, fmt.Sprintf("gateway %d's first grant of the shared slots", i), func() (bool, string) {
			return strings.Contains(c.Logs(), "sharing the upstream slots through redis"), "no grant logged yet"
		})
	}
}

// startSlotGateways starts n gateways (clusterSlotsTmpl, instances n)
// sharing the pool of fakes through rs, with fairness their tenants'
// service too, and waits for every one's first grant; it returns them and
// their base URLs.
func startSlotGateways(t *testing.T, rs *harness.Redis, n int, leaseTTL string, fairness bool, fakes []*harness.Fake) ([]*harness.Caddy, []string) {
	t.Helper()
	var gws []*harness.Caddy
	var bases []string
	for range n {
		p := harness.Ports(t, "Admin", "Site")
		gws = append(gws, startCaddy(t, clusterSlotsTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
			"Upstreams": addrs(fakes...), "Instances": n, "LeaseTTL": leaseTTL, "Fairness": fairness, "Redis": rs.URL()}))
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	waitFirstGrants(t, gws...)
	return gws, bases
}

// slotFlood is 8 clients per gateway (each gateway alone would fill the
// pool), counting per gateway the requests served and those that failed
// while the flood ran.
type slotFlood struct {
	cancel         context.CancelFunc
	wg             sync.WaitGroup
	mu             sync.Mutex
	served, failed map[int]int
	stops          []chan struct{}
	stopped        []sync.Once
}

func startSlotFlood(t *testing.T, bases []string) *slotFlood {
	cl := newClient(true)
	ctx, cancel := context.WithCancel(context.Background())
	f := &slotFlood{cancel: cancel, served: map[int]int{}, failed: map[int]int{},
		stopped: make([]sync.Once, len(bases))}
	for g, base := range bases {
		stop := make(chan struct{})
		f.stops = append(f.stops, stop)
		for w := range 8 {
			f.wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					r := send(ctx, cl, base, chatReq{Tenant: "t", TestID: fmt.Sprintf("g%d-w%d-%d", g, w, i), MaxTokens: 40, IgnoreEOS: true})
					f.mu.Lock()
					if r.Err == nil && r.Status == http.StatusOK {
						f.served[g]++
					} else if ctx.Err() == nil {
						f.failed[g]++
					}
					f.mu.Unlock()
				}
			})
		}
	}
	t.Cleanup(func() {
		f.end()
		cl.CloseIdleConnections()
	})
	return f
}

// stop ends gateway g's clients after their requests in flight.
func (f *slotFlood) stop(g int) { f.stopped[g].Do(func() { close(f.stops[g]) }) }

// servedNow copies the counts of requests served per gateway so far.
func (f *slotFlood) servedNow() map[int]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.served)
}

// waitServed waits until each of the gateways gws has served n requests
// more than when it was called: the flood's progress, counted, where a
// fixed pause would cover less of it on a slow machine.
func (f *slotFlood) waitServed(t *testing.T, what string, n int, gws ...int) {
	t.Helper()
	base := f.servedNow()
	harness.WaitFor(t, fmt.Sprintf("%s: %d more requests served through each of gateways %v", what, n, gws), func() (bool, string) {
		now := f.servedNow()
		for _, g := range gws {
			if now[g]-base[g] < n {
				return false, fmt.Sprintf("served %v, %v before", now, base)
			}
		}
		return true, ""
	})
}

// end stops every client and waits for them; the counts are final after.
func (f *slotFlood) end() {
	for g := range f.stops {
		f.stop(g)
	}
	f.cancel()
	f.wg.Wait()
}

// TestClusterSharedSlotsRedisRestart: Redis killed in the
// middle of a flood through three gateways sharing the pool and their
// tenants' service, then restarted empty. No request fails because of it;
// while it is down each gateway takes pool/instances (2 of 8); once it
// answers the grants come from Redis again, add up to the pool, and the
// announcements flow again (the subscriptions reconnect); and the fakes
// never see more than the pool's 8 requests at once, through the outage
// and the restart (a gateway finding the pool forgotten takes no more
// than it held until the others have renewed). It runs alone (no
// t.Parallel): Redis restarts on the port it had, which another test's
// client could take meanwhile.
func TestClusterSharedSlotsRedisRestart(t *testing.T) {
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "crestart", harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 4 * time.Millisecond})
	gws, bases := startSlotGateways(t, rs, 3, "2s", true, fakes)
	flood := startSlotFlood(t, bases)
	grants := func() []float64 {
		var g []float64
		for _, c := range gws {
			g = append(g, metric(scrape(t, c), "caddy_fair_queue_cluster_slot_grant"))
		}
		return g
	}
	sum := func(g []float64) float64 { return g[0] + g[1] + g[2] }
	flood.waitServed(t, "the flood on Redis", 20, 0, 1, 2)
	rs.Kill()
	for _, c := range gws {
		waitMetricEq(t, c, 2, "caddy_fair_queue_cluster_slot_grant")
	}
	flood.waitServed(t, "the flood without Redis", 20, 0, 1, 2)
	rs.Start()
	harness.WaitFor(t, "the grants from Redis again, adding up to the pool", func() (bool, string) {
		g := grants()
		return sum(g) == 8, fmt.Sprintf("grants %v", g)
	})
	for i, c := range gws {
		if n := strings.Count(c.Logs(), "sharing the upstream slots through redis"); n < 2 {
			t.Errorf("gateway %d logged going back to Redis %d times, want 2 (start, restart)", i, n)
		}
	}
	// The announcements flow again: requests of rt, queued behind the
	// flood on gateway 0, claim slots, and the others hear of it.
	claims := func(c *harness.Caddy) float64 {
		return metric(scrape(t, c), "caddy_fair_queue_cluster_slot_moves_total", "kind", "claim", "direction", "received")
	}
	before := claims(gws[1])
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	tries := 0
	harness.WaitFor(t, "gateway 1 hearing gateway 0's claims after the restart", func() (bool, string) {
		tries++ // each try its own id: the fakes' records check that none reached them twice
		r := send(context.Background(), cl, bases[0], chatReq{Tenant: "rt", TestID: fmt.Sprint("rt-after-restart-", tries), MaxTokens: 5, IgnoreEOS: true})
		if r.Err != nil || r.Status != http.StatusOK {
			t.Errorf("rt: %v", r)
		}
		n := claims(gws[1])
		return n > before, fmt.Sprintf("claims received %v (before %v)", n, before)
	})
	flood.waitServed(t, "the flood after the restart", 20, 0, 1, 2)
	flood.end()
	peak := maxConcurrent(t, fakes...)
	t.Logf("served per gateway %v, failed %v; the fakes had at most %d requests at once", flood.served, flood.failed, peak)
	for g, n := range flood.failed {
		if n > 0 {
			t.Errorf("gateway %d: %d requests failed across the Redis restart", g, n)
		}
	}
	if peak > 8 {
		t.Errorf("the fakes had %d requests at once, more than the pool's 8 slots", peak)
	}
}

// TestClusterSharedSlots: three gateways in front of one pool of
// 2 fakes x 4 slots, each of which alone would fill the pool (its capacity
// is the pool's 8): sharing the slots through Redis, the fakes never see
// more than 8 requests at once under a flood through all three; a gateway
// killed mid-run gives its slots back within the lease TTL and the others
// take them.
func TestClusterSharedSlots(t *testing.T) {
	t.Parallel()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "cslots", harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 4 * time.Millisecond})
	gws, bases := startSlotGateways(t, rs, 3, "2s", false, fakes)
	flood := startSlotFlood(t, bases)
	flood.waitServed(t, "the flood through all three", 30, 0, 1, 2)
	capacity := func(s harness.Series) float64 { return metric(s, "caddy_fair_queue_capacity") }
	// The grants are visible: with the same demand and weight on all
	// three, they split the pool 3/3/2 and add up to it.
	grant := func(s harness.Series) float64 { return metric(s, "caddy_fair_queue_cluster_slot_grant") }
	waitMetric(t, gws[0], "the three grants split the pool", func(s0 harness.Series) bool {
		g0, g1, g2 := grant(s0), grant(scrape(t, gws[1])), grant(scrape(t, gws[2]))
		return g0+g1+g2 == 8 && min(g0, g1, g2) >= 2
	})
	// Kill the third gateway: its grant expires within the 2 s TTL and
	// the other two share the pool.
	flood.stop(2)
	gws[2].Kill()
	waitMetric(t, gws[0], "the killed gateway's slots back to the others", func(s0 harness.Series) bool {
		return capacity(s0)+capacity(scrape(t, gws[1])) == 8
	})
	flood.waitServed(t, "the two left go on", 30, 0, 1)
	flood.end()
	served := flood.served
	peak := maxConcurrent(t, fakes...)
	t.Logf("served per gateway %v; the fakes had at most %d requests at once", served, peak)
	if peak > 8 {
		t.Errorf("the fakes had %d requests at once, more than the pool's 8 slots", peak)
	}
	if served[0] == 0 || served[1] == 0 || served[2] == 0 {
		t.Errorf("a gateway was never served: %v", served)
	}
}

// clusterTwoTenantsTmpl is a gateway of two sharing a pool of slots (2
// fakes x 3) through Redis, with two declared tenants A and B of weights
// WA and WB; Share adds share_fairness.
const clusterTwoTenantsTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 3
		tenant {{.A}} weight {{.WA}} class batch
		tenant {{.B}} weight {{.WB}} class batch
		class batch wait_budget 60s
		cluster {
			redis {{.Redis}}
			timeout ` + clusterTimeout + `
			instances 2
			share_slots
			{{if .Share}}share_fairness{{end}}
			sync 100ms
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// tenantFlood is workers clients sending tenant's requests back to back
// through gateway gw.
type tenantFlood struct {
	tenant      string
	gw, workers int
}

// Windows of clusterFloodRun, in requests the clients were served: each
// tenant's first clusterSettle let the grants and the shared virtual time
// settle (a few syncs), then the shares are counted until each tenant has
// been served clusterWindow more, so that one request is under 1% of
// either count. Counted, not timed, the window holds as much work on a
// slow machine as on an idle one.
const (
	clusterSettle = 40
	clusterWindow = 120
)

// clusterFloodRun starts two gateways (clusterTwoTenantsTmpl with data)
// on a pool of 6 slots and a Redis of their own, runs floods, and returns
// the requests each tenant completed at the fakes within the window
// (clusterSettle, clusterWindow), and the gateways. The fakes never hold
// more than the pool.
func clusterFloodRun(t *testing.T, prefix string, data map[string]any, floods ...tenantFlood) (map[string]int, []*harness.Caddy) {
	t.Helper()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, prefix, harness.FakeOptions{Slots: 3, TTFT: 10 * time.Millisecond, PerToken: 4 * time.Millisecond})
	var bases []string
	var gws []*harness.Caddy
	for range 2 {
		p := harness.Ports(t, "Admin", "Site")
		d := map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...), "Redis": rs.URL()}
		maps.Copy(d, data)
		gws = append(gws, startCaddy(t, clusterTwoTenantsTmpl, d))
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	waitFirstGrants(t, gws...)
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := map[string]int{}
	for _, f := range floods {
		for w := range f.workers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					r := send(ctx, cl, bases[f.gw], chatReq{Tenant: f.tenant, TestID: fmt.Sprintf("%s-%d-%d-%d", f.tenant, f.gw, w, i),
						MaxTokens: 40, IgnoreEOS: true})
					if r.Err == nil && r.Status == http.StatusOK {
						mu.Lock()
						served[f.tenant]++
						mu.Unlock()
					}
				}
			})
		}
	}
	defer func() { cancel(); wg.Wait() }() // a failed wait stops the floods
	// each waits until every flooding tenant has been served n requests
	// more than in base.
	each := func(what string, base map[string]int, n int) map[string]int {
		t.Helper()
		var now map[string]int
		harness.WaitFor(t, fmt.Sprintf("%s: %d requests served to each tenant", what, n), func() (bool, string) {
			mu.Lock()
			now = maps.Clone(served)
			mu.Unlock()
			for _, f := range floods {
				if now[f.tenant]-base[f.tenant] < n {
					return false, fmt.Sprintf("served %v", now)
				}
			}
			return true, ""
		})
		return now
	}
	settled := each("the floods settle", nil, clusterSettle)
	from := time.Now().UnixNano()
	each("the window", settled, clusterWindow)
	cancel()
	wg.Wait()
	done := map[string]int{}
	for _, rec := range records(t, fakes...) {
		if rec.FinishedUnixNano >= from && rec.Outcome == "ok" {
			done[rec.Tenant]++
		}
	}
	if peak := maxConcurrent(t, fakes...); peak > 6 {
		t.Errorf("the fakes had %d requests at once, more than the pool's 6", peak)
	}
	return done, gws
}

// TestClusterWeightedTenants: two tenants of weights 2 and 1
// flood through different gateways sharing a pool of 6 slots: each
// gateway's claim weighs its tenants' weights, so the pool serves them 2:1
// (within 5%), not 1:1 as two gateways of equal demand would split it.
func TestClusterWeightedTenants(t *testing.T) {
	t.Parallel()
	done, _ := clusterFloodRun(t, "cweights", map[string]any{"A": "heavy", "WA": 2, "B": "light", "WB": 1, "Share": false},
		tenantFlood{"heavy", 0, 12}, tenantFlood{"light", 1, 12})
	ratio := float64(done["heavy"]) / float64(max(done["light"], 1))
	t.Logf("completed in the window: %v, ratio %.3f", done, ratio)
	if ratio < 1.9 || ratio > 2.1 {
		t.Errorf("heavy:light = %.3f, want 2 within 5%% (weights 2:1 through different gateways)", ratio)
	}
}

const clusterAccountTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 8
		upstream_quota tpm 6000 burst 2s
		class batch wait_budget 60s
		cluster {
			redis {{.Redis}}
			timeout ` + clusterTimeout + `
			instances 3
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// TestClusterProviderAccount: three gateways in front of one
// provider account of 6000 tokens/min draw on it together, through Redis:
// over 8 s of a flood through all three, the tokens sent are the account's
// rate x time + burst within 5%, not three times it.
func TestClusterProviderAccount(t *testing.T) {
	t.Parallel()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 1, "cacct", harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 200 * time.Microsecond})
	var bases []string
	for range 3 {
		p := harness.Ports(t, "Admin", "Site")
		c := startCaddy(t, clusterAccountTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...),
			"Redis": rs.URL()})
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	for g := range 3 {
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					send(ctx, cl, bases[g], chatReq{Tenant: "t", TestID: fmt.Sprintf("a%d-%d-%d", g, w, i), MaxTokens: 100, IgnoreEOS: true})
				}
			})
		}
	}
	// The measurement window, not a wait: the bound is on the tokens sent
	// within it, over its measured length.
	time.Sleep(8 * time.Second)
	cancel()
	end := time.Now()
	wg.Wait()
	tokens := 0
	for _, rec := range records(t, fakes...) {
		if rec.ReceivedUnixNano <= end.UnixNano() && rec.Outcome == "ok" {
			tokens += rec.PromptTokens + rec.OutputTokens
		}
	}
	allowed := 6000.0/60*end.Sub(start).Seconds() + 6000.0/60*2 // rate x time + the 2 s burst
	ratio := float64(tokens) / allowed
	t.Logf("%d tokens sent in %v; the account allows %.0f: ratio %.3f", tokens, end.Sub(start).Round(time.Millisecond), allowed, ratio)
	if ratio > 1.05 || ratio < 0.8 {
		t.Errorf("the gateways sent %.3f of what the account allows, want at most 1.05 (and the account used)", ratio)
	}
}

// TestClusterSharedSlotsReleasedOnStop: a gateway stopped the
// usual way (SIGTERM) gives its grant of the shared slots back as it goes,
// so the gateway left takes the whole pool, long before the lease (an
// hour) would have given it back. (Requests the stopped gateway's clients
// send as it stops may fail; they are not counted.)
func TestClusterSharedSlotsReleasedOnStop(t *testing.T) {
	t.Parallel()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 2, "crel", harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 4 * time.Millisecond})
	// A lease far longer than the test and its waits: a grant that comes
	// back does so because its gateway gave it back, not because it
	// lapsed.
	gws, bases := startSlotGateways(t, rs, 2, "1h", false, fakes)
	flood := startSlotFlood(t, bases)
	grant := func(s harness.Series) float64 { return metric(s, "caddy_fair_queue_cluster_slot_grant") }
	waitMetric(t, gws[0], "both gateways hold part of the pool", func(s0 harness.Series) bool {
		g0, g1 := grant(s0), grant(scrape(t, gws[1]))
		return g0+g1 == 8 && g0 >= 3 && g1 >= 3
	})
	// Stop the second gateway while its clients are still sending: the
	// requests it holds finish, then it releases its entry.
	flood.stop(1)
	if err := gws[1].Stop(); err != nil {
		t.Errorf("stopping the second gateway: %v", err)
	}
	stopped := time.Now()
	waitMetric(t, gws[0], "the whole pool of 8 granted to the gateway left (the lease is an hour: only the stopped one's release gives its slots back)",
		func(s harness.Series) bool { return grant(s) == 8 })
	t.Logf("observed: the whole pool back %v after the stop returned", time.Since(stopped).Round(10*time.Millisecond))
	waitMetricEq(t, gws[0], 8, "caddy_fair_queue_capacity")
	flood.end()
	if n := flood.failed[0]; n != 0 {
		t.Errorf("%d requests through the gateway left failed", n)
	}
	if peak := maxConcurrent(t, fakes...); peak > 8 {
		t.Errorf("the fakes had %d requests at once, more than the pool's 8 slots", peak)
	}
}

// TestClusterSharedFairness: tenant wide floods through both
// gateways, tenant narrow through the second only, equal weights, one
// pool of 6 slots. The first gateway claims 2 of them (one tenant's
// weight), the second 4. Each gateway alone divides its slots among its
// own tenants, so wide gets 2 + 2 against narrow's 2: 2:1. Sharing the
// tenants' virtual time (share_fairness), the second gateway sees wide
// ahead by what the first served it and gives narrow the difference:
// 3:3, asserted 1:1 within 5%; and the run without it is asserted 2:1
// within 5%, so that the test shows what sharing changes.
func TestClusterSharedFairness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		share bool
		want  float64
	}{{false, 2}, {true, 1}} {
		t.Run(fmt.Sprintf("share_fairness=%v", tc.share), func(t *testing.T) {
			t.Parallel()
			done, gws := clusterFloodRun(t, fmt.Sprintf("cfair%v", tc.share),
				map[string]any{"A": "wide", "WA": 1, "B": "narrow", "WB": 1, "Share": tc.share},
				tenantFlood{"wide", 0, 8}, tenantFlood{"wide", 1, 8}, tenantFlood{"narrow", 1, 8})
			ratio := float64(done["wide"]) / float64(max(done["narrow"], 1))
			t.Logf("completed in the window: %v, wide:narrow %.3f", done, ratio)
			if math.Abs(ratio-tc.want)/tc.want > 0.05 {
				t.Errorf("wide:narrow = %.3f, want %v within 5%%", ratio, tc.want)
			}
			if tc.share {
				// The second gateway charged wide what the first served it.
				s := scrape(t, gws[1])
				if got := metric(s, "caddy_fair_queue_cluster_shared_entries_total", "direction", "applied"); got < 10 {
					t.Errorf("cluster_shared_entries_total{direction=applied} on the second gateway = %v, want the first's service applied", got)
				}
			}
		})
	}
}
