package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Redis that can fail over, end to end: three gateways share a tenant's
// quota through a real three-node Redis Cluster, and through a primary
// and its replica behind Sentinel, failed over under load. Through both
// the quota holds within 5% and every request gets an answer of the
// contract.

// clusterFailoverTmpl: .Where is the cluster block's Redis settings;
// .Budget the tenant's wait budget, stretched on a loaded machine as
// TestClusterQuota's is (clusterWaitBudget): with a fixed 1 s, a gateway
// stalled past a booked request's deadline once in a CI run (one
// queue_timeout of 137 answers, no decision made locally).
const clusterFailoverTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 8
		cluster {
			{{.Where}}
			instances 3
			timeout   250ms
			share_slots
			share_fairness
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

// quotaLoad sends clusterOffered requests a second of the metered tenant
// round-robin over bases until stop is closed, each of ~200 tokens, and
// returns every answer.
func quotaLoad(bases []string, stop <-chan struct{}) func() []result {
	cl := newClient(true)
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
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
			base := bases[i%len(bases)]
			wg.Go(func() {
				r := send(context.Background(), cl, base, chatReq{Tenant: "metered", TestID: fmt.Sprint("fo-", i), MaxTokens: clusterOutput, IgnoreEOS: true})
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			})
		}
	})
	return func() []result {
		loop.Wait()
		wg.Wait()
		cl.CloseIdleConnections()
		return out
	}
}

// checkQuotaRun checks every answer is of the contract (served, 429
// quota_exceeded, 503 wait_budget_exceeded) and that the tokens the fakes
// served the tenant are within 5% of its quota over the run: a greedy
// tenant starting at rest is charged rate x (D + tau) over the D between
// its first and last dispatch (as in TestClusterQuota).
//
// lost is the time a failover took to switch the gateways over: Redis
// replicates asynchronously, so the charges made on the old primary in
// that window may be lost with it, and the tenant be served up to that
// much more (asserted as the upper bound's allowance, and logged).
func checkQuotaRun(t *testing.T, answers []result, fakes []*harness.Fake, lost time.Duration) {
	t.Helper()
	count := map[string]int{}
	for _, r := range answers {
		code := "served"
		if r.Err != nil {
			t.Errorf("lost: %s", r)
			continue
		}
		if r.Status != http.StatusOK {
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(r.Body, &body)
			code = fmt.Sprintf("%d %s", r.Status, body.Error.Code)
			if code != "429 quota_exceeded" && code != "503 wait_budget_exceeded" {
				t.Errorf("an answer outside the contract: %s", r)
			}
		}
		count[code]++
	}
	var first, last int64
	tokens, n := 0, 0
	for _, r := range records(t, fakes...) {
		if r.Tenant != "metered" || r.Outcome != "ok" {
			continue
		}
		if n == 0 || r.ReceivedUnixNano < first {
			first = r.ReceivedUnixNano
		}
		last = max(last, r.ReceivedUnixNano)
		tokens += r.PromptTokens + r.OutputTokens
		n++
	}
	if n != count["served"] {
		t.Errorf("the fakes served %d of the tenant's requests, the clients were answered %d served", n, count["served"])
	}
	rate := float64(clusterTPM) / 60
	allowed := rate * (time.Duration(last-first).Seconds() + clusterTau)
	ratio := float64(tokens) / allowed
	extra := rate * lost.Seconds() / allowed
	t.Logf("answers %v; %d requests, %d tokens over %v; the quota allows %.0f: ratio %.3f (a failover's window may add up to %.3f)",
		count, n, tokens, time.Duration(last-first), allowed, ratio, extra)
	if ratio < 0.95 || ratio > 1.05+extra {
		t.Errorf("the three gateways served the tenant %.3f of its quota; want within 5%% (plus %.3f for the failover's window)", ratio, extra)
	}
}

func startFailoverGateways(t *testing.T, where string, fakes []*harness.Fake) ([]*harness.Caddy, []string) {
	t.Helper()
	var gws []*harness.Caddy
	var bases []string
	for range 3 {
		p := harness.Ports(t, "Admin", "Site")
		gws = append(gws, startCaddy(t, clusterFailoverTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
			"Where": where, "TPM": clusterTPM, "Upstreams": addrs(fakes...), "Budget": clusterWaitBudget()}))
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	waitFirstGrants(t, gws...)
	return gws, bases
}

// TestClusterRedisCluster: a real three-node Redis Cluster (redis-server
// --cluster-enabled yes, redis-cli --cluster create), the gateways given
// its nodes (cluster_addrs): every script and command lands on one node
// (a cross-slot one would be refused), the quota holds within 5%, and no
// decision is made locally.
func TestClusterRedisCluster(t *testing.T) {
	var nodes []string
	for range 3 {
		// The cluster bus listens on a port of its own, by default the
		// client port + 10000: that one would be drawn from the kernel's
		// ephemeral range, where a test's outgoing connection can hold it
		// (FreePort), so it is drawn like the client port.
		bus := strconv.Itoa(harness.FreePort(t))
		addr := harness.StartRedis(t, "--cluster-enabled", "yes", "--cluster-port", bus, "--cluster-node-timeout", "2000").Addr()
		nodes = append(nodes, addr)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, nodes...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes})
	defer cc.Close()
	harness.WaitFor(t, "the cluster's state ok on every node", func() (bool, string) {
		for _, n := range nodes {
			c := redis.NewClient(&redis.Options{Addr: n})
			info, err := c.ClusterInfo(context.Background()).Result()
			c.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, fmt.Sprintf("%s: %v %s", n, err, info)
			}
		}
		return true, ""
	})
	fakes := startFakes(t, 2, "crcluster", harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 50 * time.Microsecond})
	gws, bases := startFailoverGateways(t, "cluster_addrs "+strings.Join(nodes, " "), fakes)
	stop := make(chan struct{})
	done := quotaLoad(bases, stop)
	time.Sleep(8 * time.Second) // pacing only: the load runs
	close(stop)
	checkQuotaRun(t, done(), fakes, 0)
	for i, c := range gws {
		s := scrape(t, c)
		if up, fb, sf := metric(s, "caddy_fair_queue_cluster_redis_up"), metric(s, "caddy_fair_queue_cluster_fallback_total"),
			metric(s, "caddy_fair_queue_cluster_share_failures_total"); up != 1 || fb != 0 || sf != 0 {
			t.Errorf("gateway %d: redis_up %v, %v local decisions, %v failed exchanges; want 1, 0, 0", i, up, fb, sf)
		}
		if strings.Contains(c.Logs(), "CROSSSLOT") || strings.Contains(c.Logs(), "do not hash to the same slot") {
			t.Errorf("gateway %d logged a cross-slot refusal", i)
		}
	}
	// The keys are where their hash tags put them.
	if n := cc.Exists(context.Background(), "fq:quota:default:pool{slots}").Val(); n != 1 {
		t.Error("the shared slots' pool is not in the cluster")
	}
}

// TestClusterSentinelFailover: a primary and its replica behind a
// sentinel; the gateways find the primary through it (sentinel block).
// Under load, SENTINEL FAILOVER promotes the replica: the gateways follow
// it (deciding locally for the moments it takes), every request gets an
// answer of the contract, and the quota holds within 5% over the run.
func TestClusterSentinelFailover(t *testing.T) {
	primary := harness.StartRedis(t).Addr()
	replica := harness.StartRedis(t, "--replicaof", "127.0.0.1", strings.Split(primary, ":")[1]).Addr()
	sdir := t.TempDir()
	conf := filepath.Join(sdir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("sentinel monitor mymaster 127.0.0.1 %s 1\n"+
		"sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 10000\n", strings.Split(primary, ":")[1])), 0o644); err != nil {
		t.Fatal(err)
	}
	sentinel := harness.StartRedis(t, conf, "--sentinel").Addr()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	ctx := context.Background()
	harness.WaitFor(t, "the sentinel to know the replica, in sync", func() (bool, string) {
		reps, err := sc.Replicas(ctx, "mymaster").Result()
		if err != nil || len(reps) != 1 {
			return false, fmt.Sprint(reps, err)
		}
		return reps[0]["master-link-status"] == "ok" && !strings.Contains(reps[0]["flags"], "down"), fmt.Sprint(reps[0])
	})
	fakes := startFakes(t, 2, "csentinel", harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 50 * time.Microsecond})
	gws, bases := startFailoverGateways(t, "sentinel {\n\t\t\t\tmaster mymaster\n\t\t\t\taddrs "+sentinel+"\n\t\t\t}", fakes)
	for _, c := range gws {
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
	}
	stop := make(chan struct{})
	done := quotaLoad(bases, stop)
	time.Sleep(4 * time.Second) // pacing only: the load runs on the first primary
	failStart := time.Now()
	if err := sc.Failover(ctx, "mymaster").Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	harness.WaitFor(t, "the sentinel to name the replica primary", func() (bool, string) {
		a, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		return err == nil && len(a) == 2 && a[0]+":"+a[1] == replica, fmt.Sprint(a, err)
	})
	// The gateways call the scripts on the new primary (what it got as a
	// replica came as the scripts' effects, not as EVALSHA).
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	harness.WaitFor(t, "the gateways' scripts running on the new primary", func() (bool, string) {
		info := rc.Info(ctx, "commandstats").Val()
		return strings.Contains(info, "cmdstat_evalsha:calls="), "no EVALSHA on the new primary yet"
	})
	switched := time.Since(failStart)
	time.Sleep(4 * time.Second) // pacing only: the load runs on the new primary
	close(stop)
	checkQuotaRun(t, done(), fakes, switched)
	for i, c := range gws {
		waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
		t.Logf("gateway %d: %v decisions made locally through the failover", i, metric(scrape(t, c), "caddy_fair_queue_cluster_fallback_total"))
	}
}
