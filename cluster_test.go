package caddyfairqueue

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

func TestClusterCaddyfile(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		cluster {
			redis     {env.REDIS_URL}
			instances 3
			timeout   20ms
			prefix    gw:
			share_fairness
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	c := h.Cluster
	if c == nil || c.Redis != "{env.REDIS_URL}" || c.Instances != 3 || c.Timeout != dur(20*time.Millisecond) || c.Prefix != "gw:" ||
		!c.ShareFairness || c.ShareSlots {
		t.Fatalf("cluster: %+v", c)
	}
	for _, tc := range []struct{ input, want string }{
		{"cluster redis://a:1", `cluster: unexpected argument "redis://a:1"`},
		{"cluster {\n}", "cluster: missing 'redis <url>'"},
		{"cluster {\ninstances 2\n}", "cluster: missing 'redis <url>'"},
		{"cluster {\nsentinel {\nmaster m\n}\n}", "cluster: sentinel: want master <name> and addrs"},
		{"cluster {\nsentinel {\nport 1\n}\n}", `cluster: sentinel: unknown setting "port"`},
		{"cluster {\ncluster_addrs\n}", "cluster: cluster_addrs: want one or more"},
		{"cluster {\nredis redis://a:1\nshare_fairness yes\n}", "cluster: share_fairness takes no argument"},
		{"cluster {\nredis a b\n}", "cluster: redis: want exactly one argument"},
		{"cluster {\nredis redis://a:1\nredis redis://b:1\n}", "cluster: redis given twice"},
		{"cluster {\nredis redis://a:1\ninstances 0\n}", `cluster: instances: "0" must be a positive integer`},
		{"cluster {\nredis redis://a:1\ntimeout soon\n}", `cluster: timeout: "soon" is not a duration`},
		{"cluster {\nredis redis://a:1\nprefix a{b\n}", "contains '{'"},
		{"cluster {\nredis redis://a:1\nspeed 100ms\n}", `cluster: unknown setting "speed" (want redis, sentinel, cluster_addrs, instances, timeout, prefix, share_slots, share_fairness, sync or lease_ttl)`},
		{"cluster {\nredis redis://a:1\nshare_slots yes\n}", "share_slots takes no argument"},
		{"cluster {\nredis redis://a:1\nlease_ttl never\n}", `cluster: lease_ttl: "never" is not a duration`},
		{"cluster {\nredis redis://a:1\n}\ncluster {\nredis redis://a:1\n}", "cluster given twice"},
	} {
		_, err := parseBlock("fair_queue {\n" + tc.input + "\nreverse_proxy a:1\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.input, err, tc.want)
		}
	}
}

// clusterJSON is a fair_queue config on u whose tenant a has a quota of
// one request a second, no burst, and a wait budget too short to wait for
// it: a second request within the second is refused at once (429
// quota_exceeded). cc is the cluster object's JSON.
func clusterJSON(name string, u *fakeUpstream, cc string) string {
	return fqConfig(name, u, `"tenants":{"a":{"wait_budget":"100ms","quota":{"qps":1,"burst_allow":0}}},"cluster":`+cc)
}

// wantQuotaExceeded checks a 429 quota_exceeded answer (whose body has
// the quota's reason besides the OpenAI error shape).
func wantQuotaExceeded(t *testing.T, r result) {
	t.Helper()
	var body struct {
		Error struct{ Code, Reason string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &body)
	if r.status != http.StatusTooManyRequests || body.Error.Code != "quota_exceeded" || body.Error.Reason == "" || r.header.Get("Retry-After") == "" {
		t.Fatalf("want 429 quota_exceeded with a reason and Retry-After, got %d %s", r.status, r.body)
	}
}

// redisUp reads caddy_fair_queue_cluster_redis_up for queue; -1 when absent.
func redisUp(queue string) float64 { return clusterGauge(descClusterRedisUp, queue) }

// clusterGauge reads the cluster collector's gauge desc for queue; -1 when
// absent.
func clusterGauge(desc *prometheus.Desc, queue string) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { queueCollector.Collect(ch); close(ch) }()
	v := -1.0
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		if m.Desc() == desc && d.GetLabel()[0].GetValue() == queue {
			v = d.GetGauge().GetValue()
		}
	}
	return v
}

func TestClusterProvision(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	t.Setenv("FQ_TEST_REDIS_URL", "redis://"+mr.Addr()+"/0")
	name := queueName(t)
	h, _ := mustLoad(t, clusterJSON(name, u, `{"redis":"{env.FQ_TEST_REDIS_URL}","instances":3}`))
	if h.cluster == nil || h.qcfg.QuotaStore != h.cluster.store {
		t.Fatal("cluster set, but the queue's quota store is not the cluster's")
	}
	o := h.cluster.client.(*redis.Client).Options()
	// MaxRetries -1 (no retry) reads 0 once the client is built; 0 given
	// would have read 3.
	// The timeout bounds a command's reads and writes; a connection's
	// set-up has its own budget, and a few connections are kept ready.
	if o.Addr != mr.Addr() || o.MaxRetries != 0 || o.ContextTimeoutEnabled || o.ReadTimeout != defaultClusterTimeout ||
		o.WriteTimeout != defaultClusterTimeout || o.DialTimeout != time.Second || o.MinIdleConns != 4 ||
		!o.DisableIdentity || o.TLSConfig != nil {
		t.Errorf("client options: addr %s, retries %d, context timeouts %v, timeouts %v %v %v, min idle %d, identity off %v, tls %v",
			o.Addr, o.MaxRetries, o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MinIdleConns, o.DisableIdentity, o.TLSConfig != nil)
	}
	if v := redisUp(name); v != 1 {
		t.Errorf("cluster_redis_up %v, want 1", v)
	}
	if v := clusterGauge(descClusterSlotGrant, name); v != -1 {
		t.Errorf("cluster_slot_grant %v without share_slots, want none", v)
	}

	// rediss:// is TLS; nothing connects until the first call.
	h2, _ := mustLoad(t, clusterJSON(queueName(t)+"_tls", u, `{"redis":"rediss://:secret@localhost:1","timeout":"10ms","prefix":"x:"}`))
	if o := h2.cluster.client.(*redis.Client).Options(); o.TLSConfig == nil || o.ReadTimeout != 10*time.Millisecond {
		t.Errorf("rediss: tls %v, read timeout %v", o.TLSConfig != nil, o.ReadTimeout)
	}

	for _, tc := range []struct{ cluster, want string }{
		{`{"redis":"{env.FQ_TEST_UNSET}"}`, `"{env.FQ_TEST_UNSET}" is empty once its placeholders are replaced`},
		{`{"redis":"http://:hunter2@host:1"}`, "not a redis://, rediss:// or redis-sentinel:// URL"},
		{`{"redis":"redis://a:1","instances":-1}`, "instances must not be negative"},
		{`{"redis":"redis://a:1","timeout":"-1s"}`, "timeout must not be negative"},
		{`{"redis":"redis://a:1","prefix":"a{"}`, "contains '{'"},
	} {
		ctx, cancel := configContext(t)
		_, err := loadHandler(ctx, clusterJSON(queueName(t)+"_bad", u, tc.cluster))
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.cluster, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password: %v", tc.cluster, err)
		}
	}
}

// TestClusterQuotaShared: two gateways (two queues in this process, with
// the same key prefix, as two Caddy instances would have) on one Redis
// share a tenant's quota: the request one served counts on the other. Then
// Redis goes away: no request fails for it, both decide locally (half the
// quota each), report redis_up 0 and count fallbacks; Redis comes back and
// they decide on it again.
func TestClusterQuotaShared(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"shared:"}`, mr.Addr())
	nameA, nameB := queueName(t)+"_a", queueName(t)+"_b"
	ha, _ := mustLoad(t, clusterJSON(nameA, u, cc))
	hb, _ := mustLoad(t, clusterJSON(nameB, u, cc))
	ga, gb := newGateway(t, ha), newGateway(t, hb)

	if r := ga.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	if !mr.Exists("shared:t{a}") {
		t.Fatalf("no key for tenant a in redis; keys %v", mr.Keys())
	}
	// The other gateway knows: the second request within the second is
	// refused, not served as a second instance's own quota would.
	wantQuotaExceeded(t, gb.post("a", chatBody("")))

	mr.Close()
	fallbacks := counterValue(clusterFallbacks, nameA) + counterValue(clusterFallbacks, nameB)
	for i := range 6 {
		g := []*gateway{ga, gb}[i%2]
		r := g.post("a", chatBody(""))
		if r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
			t.Fatalf("request %d with redis down: %d %s (want served or 429 quota_exceeded)", i, r.status, r.body)
		}
		if r.status == http.StatusTooManyRequests {
			wantQuotaExceeded(t, r)
		}
	}
	if v := redisUp(nameA); v != 0 {
		t.Errorf("redis down: cluster_redis_up %v, want 0", v)
	}
	if got := counterValue(clusterFallbacks, nameA) + counterValue(clusterFallbacks, nameB); got <= fallbacks {
		t.Errorf("redis down: cluster_fallback_total %v, want more than %v", got, fallbacks)
	}
	// Locally each gateway has half the quota: a request every 2 s, so
	// of two requests sent back to back to one gateway the second is
	// refused by its own meter.
	ra := ga.post("a", chatBody(""))
	wantQuotaExceeded(t, ra)

	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	// The probe (every second, started by the queues' ticks without any
	// request) finds it.
	eventually(t, "redis_up 1 on both gateways", func() bool {
		return redisUp(nameA) == 1 && redisUp(nameB) == 1
	})
	mr.FlushAll()
	if r := ga.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("after redis came back (flushed): %d %s", r.status, r.body)
	}
	if !mr.Exists("shared:t{a}") {
		t.Error("after redis came back, the charge did not reach it")
	}
}

// TestClusterReload: a reload that changes the cluster's Redis takes
// effect when the new config starts; the old config's client is closed at
// its Cleanup and the queue, shared across the reload, goes on deciding on
// the new one.
func TestClusterReload(t *testing.T) {
	u := newFakeUpstream(t)
	mr1, mr2 := miniredis.RunT(t), miniredis.RunT(t)
	name := queueName(t)
	h1, stop1 := mustLoad(t, clusterJSON(name, u, fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s"}`, mr1.Addr())))
	g := newGateway(t, h1)
	if r := g.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("before the reload: %d %s", r.status, r.body)
	}
	if !mr1.Exists("fq:quota:" + name + ":t{a}") {
		t.Fatalf("before the reload: no key in the first redis: %v", mr1.Keys())
	}

	h2, _ := mustLoad(t, clusterJSON(name, u, fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s"}`, mr2.Addr())))
	if h2.shared != h1.shared {
		t.Fatal("the reload did not share the queue")
	}
	stop1() // the old config's Cleanup
	if !h1.cluster.closed.Load() {
		t.Error("the old config's redis client is still open after its Cleanup")
	}
	if h2.cluster.closed.Load() {
		t.Error("the new config's redis client was closed")
	}
	g.h.Store(h2)
	mr1.FlushAll()
	if r := g.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("after the reload: %d %s (the new redis has no debt for a)", r.status, r.body)
	}
	if !mr2.Exists("fq:quota:"+name+":t{a}") || len(mr1.Keys()) != 0 {
		t.Errorf("after the reload: keys in the new redis %v, in the old %v; want the charge in the new one only", mr2.Keys(), mr1.Keys())
	}
	if h2.cluster.store.Degraded() || h2.cluster.store.LocalCalls() != 0 {
		t.Error("the new config's store fell back: it was handed the old, closed client")
	}
}

// TestClusterSharedSlotsGrants: two queues standing for two gateways share
// one pool through Redis (share_slots): idle, they split it; with demand,
// their grants add up to the pool, each with a share.
// Under -race, it also exercises the renewals started by the ticker and
// by a config taking over.
func TestClusterSharedSlotsGrants(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"slots:","share_slots":true,"sync":"20ms"}`, mr.Addr())
	nameA, nameB := queueName(t)+"_a", queueName(t)+"_b"
	ha, _ := mustLoad(t, clusterJSON(nameA, u, cc))
	hb, _ := mustLoad(t, clusterJSON(nameB, u, cc))
	pool := ha.MaxInflight * countHealthy(ha.proxy)
	// Both have synced: both entries are in the pool (before its first
	// grant a gateway holds no slot).
	eventually(t, "both gateways' entries in the pool", func() bool {
		fields, _ := mr.HKeys(cluster.PoolKey("slots:"))
		return len(fields) == 2
	})
	// Idle, the two split the spare pool.
	eventually(t, "the idle pool split between the two", func() bool {
		a, b := ha.shared.q.Stats(false).Capacity, hb.shared.q.Stats(false).Capacity
		return a+b == pool && a == b
	})
	// Both with demand: the grants split the pool.
	for _, h := range []*Handler{ha, hb} {
		for range pool {
			if _, err := h.shared.q.Enqueue(fairqueue.Request{Tenant: "x", Cost: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the pool split between the two", func() bool {
		a, b := ha.shared.q.Stats(false).Capacity, hb.shared.q.Stats(false).Capacity
		return a+b == pool && a > 0 && b > 0
	})
	// The gauge shows each gateway's grant: the split just checked.
	eventually(t, "cluster_slot_grant adds up to the pool", func() bool {
		a, b := clusterGauge(descClusterSlotGrant, nameA), clusterGauge(descClusterSlotGrant, nameB)
		return a+b == float64(pool) && a > 0 && b > 0
	})
	if g := clusterGauge(descClusterSlotGrant, queueName(t)+"_none"); g != -1 {
		t.Errorf("cluster_slot_grant for a queue that does not exist: %v", g)
	}
}

// A gateway that joins while another holds the whole pool dispatches
// nothing until its first grant, rather than taking pool/instances on top:
// the two never hold more than the pool, from the joiner's first moment.
func TestClusterSharedSlotsJoinHoldsNothingBeforeGrant(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"join:","share_slots":true,"sync":"20ms"}`, mr.Addr())
	nameA, nameB := queueName(t)+"_a", queueName(t)+"_b"
	ha, _ := mustLoad(t, clusterJSON(nameA, u, cc))
	pool := ha.MaxInflight * countHealthy(ha.proxy)
	// Alone and busy, A takes the whole pool.
	for range 2 * pool {
		if _, err := ha.shared.q.Enqueue(fairqueue.Request{Tenant: "x", Cost: 10}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "A holding the whole pool", func() bool {
		return ha.shared.q.Stats(false).Inflight == pool
	})
	hb, _ := mustLoad(t, clusterJSON(nameB, u, cc))
	for range pool {
		if _, err := hb.shared.q.Enqueue(fairqueue.Request{Tenant: "y", Cost: 10}); err != nil {
			t.Fatal(err)
		}
	}
	// A's requests never complete here, so B's grant stays 0: anything
	// B dispatches would be over the pool. Watched from B's first
	// moment through its first grant and five renewals after it, each a
	// chance to take a slot (counted, not timed: a loaded machine makes
	// them slower, not fewer).
	renewals := watchRenewals(t, hb, "B's first grant and five renewals after it", 5, func() {
		if n := hb.shared.q.Stats(false).Inflight; n > 0 {
			t.Fatalf("B dispatched %d requests while A held the whole pool of %d", n, pool)
		}
	})
	t.Logf("B held nothing through %d renewals", renewals)
	if g := clusterGauge(descClusterSlotGrant, nameB); g != 0 {
		t.Errorf("B's cluster_slot_grant %v, want 0", g)
	}
}

// watchRenewals calls check after every change it sees, until h's queue
// has had its first grant of the shared slots and then started n renewals
// (a renewal notes its start in slotSyncAt), and returns how many it saw.
// It stands for "a while" in tests of what a gateway must not do: each
// renewal is a chance to do it.
func watchRenewals(t *testing.T, h *Handler, what string, n int, check func()) int {
	t.Helper()
	seen, last := 0, h.shared.slotSyncAt.Load()
	eventually(t, what, func() bool {
		check()
		if at := h.shared.slotSyncAt.Load(); at != last && h.shared.slotsGranted.Load() {
			seen++
			last = at
		}
		return seen >= n
	})
	check()
	return seen
}

// share_slots without instances, or with a lease that could expire between
// renewals, is refused at load, naming the reason.
func TestClusterSharedSlotsValidation(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	ctx, cancel := configContext(t)
	defer cancel()
	for _, tc := range []struct{ cluster, want string }{
		{fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","share_slots":true}`, mr.Addr()), "share_slots needs instances"},
		{fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"share_slots":true,"sync":"1s","lease_ttl":"2s"}`, mr.Addr()), "lease_ttl 2s must be at least 3 x sync + timeout"},
	} {
		_, err := loadHandler(ctx, clusterJSON(queueName(t), u, tc.cluster))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.cluster, err, tc.want)
		}
	}
}

// A queue removed with its config (a stop, or a reload without it) gives
// its shared slots back at once, not after the lease's TTL.
func TestClusterSharedSlotsReleased(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"rel:","share_slots":true,"sync":"20ms","lease_ttl":"10s"}`, mr.Addr())
	h, stop := mustLoad(t, clusterJSON(queueName(t), u, cc))
	instance := h.shared.instance
	eventually(t, "the gateway's entry in the pool", func() bool {
		fields, _ := mr.HKeys(cluster.PoolKey("rel:"))
		return len(fields) == 1 && fields[0] == instance
	})
	stop() // Cleanup: the last user leaves, the queue is gone
	eventually(t, "the entry released", func() bool {
		fields, _ := mr.HKeys(cluster.PoolKey("rel:"))
		return len(fields) == 0
	})
}

// TestClusterShareFairness: two queues standing for two gateways share
// their tenants' service (share_fairness): what A serves tenant a is
// charged to a on B, where a has requests queued, and only there.
func TestClusterShareFairness(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","prefix":"fair:","share_fairness":true,"sync":"20ms"}`, mr.Addr())
	nameA, nameB := queueName(t)+"_a", queueName(t)+"_b"
	// Declared: undeclared tenants' service is shared as their group's.
	tenants := `"tenants":{"a":{"weight":1},"b":{"weight":1},"c":{"weight":1}},`
	ha, _ := mustLoad(t, fqConfig(nameA, u, tenants+`"max_inflight":1,"cluster":`+cc))
	hb, _ := mustLoad(t, fqConfig(nameB, u, tenants+`"max_inflight":1,"cluster":`+cc))
	eventually(t, "both gateways syncing", func() bool {
		return ha.shared.sharesUp.Load() && hb.shared.sharesUp.Load()
	})
	vt := func(h *Handler, tenant string) float64 {
		for _, ts := range h.shared.q.Stats(true).Tenants {
			if ts.Name == tenant {
				return ts.VirtualTime
			}
		}
		return -1
	}
	// Counters are per queue name, kept across runs of the test (-count).
	count := func(name, dir string) func() float64 {
		base := counterValue(clusterShared, name, dir)
		return func() float64 { return counterValue(clusterShared, name, dir) - base }
	}
	sentA, receivedB, appliedB := count(nameA, "sent"), count(nameB, "received"), count(nameB, "applied")
	receivedA, appliedA := count(nameA, "received"), count(nameA, "applied")
	capB := hb.shared.q.Stats(false).Capacity
	for range capB + 2 {
		if _, err := hb.shared.q.Enqueue(fairqueue.Request{Tenant: "b", Cost: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hb.shared.q.Enqueue(fairqueue.Request{Tenant: "a", Cost: 10}); err != nil {
		t.Fatal(err)
	}
	before := vt(hb, "a")
	// A serves a 1000 (one slot: c waits behind it).
	for _, r := range []fairqueue.Request{{Tenant: "a", Cost: 1000}, {Tenant: "c", Cost: 500}} {
		if _, err := ha.shared.q.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "a charged on B what A served it", func() bool {
		return vt(hb, "a") >= before+1000
	})
	if got := vt(hb, "a"); got != before+1000 {
		t.Errorf("a's virtual time on B moved by %v, want 1000 (weight 1)", got-before)
	}
	eventually(t, "the entries counted", func() bool {
		return sentA() == 1 && receivedB() == 1 && appliedB() == 1
	})
	// B's own service goes the other way; a has nothing queued on A (its
	// one request is in flight there): nothing applied.
	eventually(t, "B's entries read by A", func() bool { return receivedA() >= 1 })
	if got := appliedA(); got != 0 {
		t.Errorf("A applied %v entries, want 0: none of B's tenants has requests queued on A", got)
	}
	// Redis gone: syncs fail, counted, and nothing else changes.
	mr.Close()
	eventually(t, "a failed sync counted", func() bool {
		return counterValue(clusterShareFailures, nameA) > 0 && !ha.shared.sharesUp.Load()
	})
}

// TestClusterSharedSlotsHandoff: a slot freed on one gateway goes to a
// request queued on another through the announcements, not at the next
// sync: here the next sync is an hour away, so every move the test sees
// was announced. B takes the pool of one slot when its tenant queues (B's
// claim, A's release); a heavier tenant queuing on A then wins that slot
// when B's request ends (A's claim lowers B's grant, B gives the slot back
// as its request completes, A owed it takes it), and the two never hold
// more than the pool. How long a move takes is measured, not asserted
// (BenchmarkSlotHandoff).
func TestClusterSharedSlotsHandoff(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"handoff:","share_slots":true,"sync":"1h","lease_ttl":"4h"}`, mr.Addr())
	cfg := func(name string) string {
		return fqConfig(name, u, `"max_inflight":1,`+noFastFail+
			`,"tenants":{"bulk":{"weight":1,"class":"batch"},"rt":{"weight":9,"class":"interactive"}},"cluster":`+cc)
	}
	nameA, nameB := queueName(t)+"_a", queueName(t)+"_b"
	ha, stopA := mustLoad(t, cfg(nameA))
	hb, stopB := mustLoad(t, cfg(nameB))
	eventually(t, "both gateways' first grants, and their subscriptions", func() bool {
		return ha.shared.slotsGranted.Load() && hb.shared.slotsGranted.Load() &&
			ha.shared.slotsListening.Load() && hb.shared.slotsListening.Load()
	})
	ga, gb := newGateway(t, ha), newGateway(t, hb)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a failure leaves no request waiting its budget
	within := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(waitLimit):
			t.Fatalf("%s: not within %s (the next sync is an hour away: an announcement was lost or not acted on)", what, waitLimit)
		}
	}
	bulkArrived, releaseBulk := u.hold("bulk")
	bulk := gb.async(gb.newRequest(ctx, "bulk", chatBody(""), "X-Test-Hold", "bulk"))
	within("B's request dispatched", bulkArrived)

	rtArrived, releaseRT := u.hold("rt")
	rt := ga.async(ga.newRequest(ctx, "rt", chatBody(""), "X-Test-Hold", "rt"))
	eventually(t, "A's request queued and A owed the slot", func() bool {
		return ha.shared.q.Stats(false).Queued == 1 && ha.shared.slotsOwed.Load() && hb.shared.slotsOver.Load()
	})
	select {
	case <-rtArrived:
		t.Fatal("A dispatched while B held the pool's only slot")
	default:
	}
	releaseBulk()
	within("A's request dispatched once B's completed", rtArrived)
	if n := hb.shared.q.Stats(false).Inflight; n != 0 {
		t.Errorf("B has %d requests in flight while A holds the pool's only slot", n)
	}
	releaseRT()
	wantOK(t, <-bulk)
	wantOK(t, <-rt)
	// A sender counts its announcement once its script call returns,
	// which may be after the others acted on it.
	for _, k := range []struct{ queue, kind, direction string }{
		{nameA, "claim", "sent"}, {nameB, "claim", "received"},
		{nameB, "freed", "sent"}, {nameA, "freed", "received"},
	} {
		eventually(t, fmt.Sprintf("cluster_slot_moves_total{queue=%s,kind=%s,direction=%s} at least 1", k.queue, k.kind, k.direction), func() bool {
			return counterValue(clusterSlotMoves, k.queue, k.kind, k.direction) >= 1
		})
	}
	// Stopped, the gateways leave no subscription behind.
	stopA()
	stopB()
	eventually(t, "the subscriptions' goroutines gone", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "followMoves")
	})
}

// With share_slots the inner proxy's default policy is
// fair_queue_least_conn: it places requests below the gateway's targets
// (from the last renewal) first, then by the requests in flight
// cluster-wide (the others' as reported), so the gateways together fill
// the upstreams evenly; without the report it is least_conn.
func TestClusterLeastConn(t *testing.T) {
	u1, u2 := newFakeUpstream(t), newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"lc:","share_slots":true,"sync":"10s","lease_ttl":"40s"}`, mr.Addr())
	proxy := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q},{"dial":%q}]}`, u1.dial(), u2.dial())
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":%s,"cluster":%s}`, queueName(t), proxy, cc))
	p, ok := h.proxy.LoadBalancing.SelectionPolicy.(*ClusterLeastConn)
	if !ok {
		t.Fatalf("selection policy %T with share_slots, want *ClusterLeastConn", h.proxy.LoadBalancing.SelectionPolicy)
	}
	ups := h.proxy.Upstreams
	eventually(t, "the first renewal's report of the others", func() bool {
		v := h.shared.slotView.Load()
		return v != nil && len(v.others) == 2 && len(v.targets) == 2
	})
	for _, c := range []struct {
		others, targets map[string]int
		want            *fakeUpstream
	}{
		{map[string]int{u1.dial(): 3, u2.dial(): 1}, nil, u2},
		{map[string]int{u1.dial(): 0, u2.dial(): 2}, nil, u1},
		// Places below the target come first, whatever the loads.
		{map[string]int{u1.dial(): 0, u2.dial(): 3}, map[string]int{u1.dial(): 0, u2.dial(): 1}, u2},
		{map[string]int{u1.dial(): 3, u2.dial(): 0}, map[string]int{u1.dial(): 2, u2.dial(): 0}, u1},
		// No place left anywhere: the fewest in flight cluster-wide.
		{map[string]int{u1.dial(): 3, u2.dial(): 1}, map[string]int{u1.dial(): 0, u2.dial(): 0}, u2},
	} {
		h.shared.slotView.Store(&upstreamView{others: c.others, targets: c.targets})
		for range 20 {
			if got := p.Select(ups, nil, nil); got == nil || got.Dial != c.want.dial() {
				t.Fatalf("others %v: picked %v, want %s", c.others, got, c.want.dial())
			}
		}
	}
	// Unknown (Redis down): this gateway's own counts alone, ties at random.
	// (With a 10s sync nothing renews the report meanwhile.)
	h.shared.slotView.Store(nil)
	seen := map[string]bool{}
	for range 200 {
		seen[p.Select(ups, nil, nil).Dial] = true
	}
	if len(seen) != 2 {
		t.Errorf("without a report picked %v, want both upstreams (a tie)", seen)
	}

	// Without share_slots: least_conn.
	hl, _ := mustLoad(t, fqConfig(queueName(t)+"_plain", u1, ""))
	if _, ok := hl.proxy.LoadBalancing.SelectionPolicy.(*reverseproxy.LeastConnSelection); !ok {
		t.Errorf("selection policy %T without share_slots, want least_conn", hl.proxy.LoadBalancing.SelectionPolicy)
	}
}

// Concurrent Selects see one another's places at once, before
// reverse_proxy counts a request on its upstream: a flood of requests
// selected together fills each upstream to its target, never one past it
// while another has room, and a request's end (or a retry's new Select)
// frees its place. Before placements, every Select of a burst saw the
// same counts and chose the same upstream.
func TestClusterLeastConnConcurrentSelects(t *testing.T) {
	u1, u2 := newFakeUpstream(t), newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"lcc:","share_slots":true,"sync":"10s","lease_ttl":"40s"}`, mr.Addr())
	proxy := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q},{"dial":%q}]}`, u1.dial(), u2.dial())
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":%s,"cluster":%s}`, queueName(t), proxy, cc))
	p := h.proxy.LoadBalancing.SelectionPolicy.(*ClusterLeastConn)
	if h.placed == nil || p.placed != h.placed {
		t.Fatal("share_slots: the handler and its policy share no placements")
	}
	ups := h.proxy.Upstreams
	eventually(t, "the first renewal", func() bool { return h.shared.slotView.Load() != nil })
	targets := map[string]int{u1.dial(): 3, u2.dial(): 5}
	h.shared.slotView.Store(&upstreamView{others: map[string]int{}, targets: targets})

	const n = 8 // the targets' sum
	places := make([]*placement, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range places {
		wg.Go(func() {
			r, pl := withPlacement(httptest.NewRequest("POST", "/", nil), h.placed)
			places[i] = pl
			<-start
			if p.Select(ups, r, nil) == nil {
				t.Error("no upstream selected")
			}
		})
	}
	close(start)
	wg.Wait()
	got := map[string]int{}
	for _, pl := range places {
		got[pl.dial]++
	}
	if got[u1.dial()] != 3 || got[u2.dial()] != 5 {
		t.Fatalf("%d concurrent selects placed %v, want the targets %v", n, got, targets)
	}
	// A retry moves its place; an end frees it.
	r, pl := withPlacement(httptest.NewRequest("POST", "/", nil), h.placed)
	_ = p.Select(ups, r, nil)
	_ = p.Select(ups, r, nil)
	if c := h.placed.n[u1.dial()] + h.placed.n[u2.dial()]; c != n+1 {
		t.Errorf("after a retry %d places held, want %d (one per request)", c, n+1)
	}
	pl.release()
	for _, pl := range places {
		pl.release()
	}
	if len(h.placed.n) != 0 {
		t.Errorf("places left after every request ended: %v", h.placed.n)
	}
}

// What a renewal tells the others this gateway may have on each upstream
// (its requests there, plus up to its previous targets as many as it holds
// beyond them) is where it places during the call, and room beside the
// new targets until its next renewal: so a request ending during the call
// is replaced where it was, and a target that moved away from an upstream
// does not send requests past the room the others were given.
func TestClusterLeastConnHoldsUntilNextRenewal(t *testing.T) {
	loads := []cluster.Load{{Upstream: "a", Inflight: 1, Slots: 4}, {Upstream: "b", Inflight: 0, Slots: 4}}
	prev := map[string]int{"a": 3, "b": 1}
	// Holding 3 with 1 in flight: 2 more may have gone out, by the old targets.
	if got, want := holdsUntilNext(loads, prev, 3), map[string]int{"a": 3, "b": 1}; !maps.Equal(got, want) {
		t.Errorf("holds %v, want %v", got, want)
	}
	// Holding no more than in flight: nothing beyond the loads.
	if got, want := holdsUntilNext(loads, prev, 1), map[string]int{"a": 1, "b": 0}; !maps.Equal(got, want) {
		t.Errorf("holds with nothing spare %v, want %v", got, want)
	}

	u1, u2 := newFakeUpstream(t), newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"lch:","share_slots":true,"sync":"10s","lease_ttl":"40s"}`, mr.Addr())
	proxy := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q},{"dial":%q}]}`, u1.dial(), u2.dial())
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":%s,"cluster":%s}`, queueName(t), proxy, cc))
	p := h.proxy.LoadBalancing.SelectionPolicy.(*ClusterLeastConn)
	eventually(t, "the first renewal", func() bool { return h.shared.slotView.Load() != nil })
	// The new targets put nothing on u1; the renewal held 2 there.
	h.shared.slotView.Store(&upstreamView{others: map[string]int{}, targets: map[string]int{u1.dial(): 0, u2.dial(): 0},
		holds: map[string]int{u1.dial(): 2, u2.dial(): 0}})
	var places []*placement
	for range 2 {
		r, pl := withPlacement(httptest.NewRequest("POST", "/", nil), h.placed)
		if got := p.Select(h.proxy.Upstreams, r, nil); got == nil || got.Dial != u1.dial() {
			t.Fatalf("with 2 held on %s: picked %v", u1.dial(), got)
		}
		places = append(places, pl)
	}
	// A renewal begins holding 3 (2 placed, 1 more may go): until it is
	// applied, places within what its call tells the others.
	holds, loads2 := h.shared.beginRenewal(h, 3)
	if want := map[string]int{u1.dial(): 2, u2.dial(): 0}; !maps.Equal(holds, want) {
		t.Errorf("the renewal's holds %v, want %v (2 in flight on %s, no target with room)", holds, want, u1.dial())
	}
	if v := h.shared.slotView.Load(); !maps.Equal(v.targets, holds) || v.holds != nil {
		t.Errorf("during the renewal: targets %v, holds %v; want its holds as the targets", v.targets, v.holds)
	}
	for _, l := range loads2 {
		if l.Upstream == u1.dial() && l.Inflight != 2 {
			t.Errorf("the renewal's loads count %d on %s, want the 2 placed", l.Inflight, u1.dial())
		}
	}
	for _, pl := range places {
		pl.release()
	}
}

// TestClusterSharedSlotsRedisLost: when Redis loses the pool (a restart
// without persistence), the first gateway to renew finds it empty; it must
// not take the pool the others still hold. Each gateway takes no more than
// it held before until the others have renewed.
func TestClusterSharedSlotsRedisLost(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"lost:","share_slots":true,"sync":"10s","lease_ttl":"40s"}`, mr.Addr())
	cfg := func(name string) string { return fqConfig(name, u, `"max_inflight":4,"cluster":`+cc) }
	ha, _ := mustLoad(t, cfg(queueName(t)+"_a"))
	hb, _ := mustLoad(t, cfg(queueName(t)+"_b"))
	// With a 10s sync, renewals come from kicks alone.
	eventually(t, "the idle pool of 4 split 2/2", func() bool {
		ha.shared.kickSlots()
		hb.shared.kickSlots()
		return ha.shared.q.Stats(false).Capacity == 2 && hb.shared.q.Stats(false).Capacity == 2
	})
	for _, h := range []*Handler{ha, hb} {
		for range 8 {
			if _, err := h.shared.q.Enqueue(fairqueue.Request{Tenant: "x", Cost: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the pool of 4 split 2/2 and filled", func() bool {
		ha.shared.kickSlots()
		hb.shared.kickSlots()
		a, b := ha.shared.q.Stats(false), hb.shared.q.Stats(false)
		return a.Capacity == 2 && b.Capacity == 2 && a.Inflight == 2 && b.Inflight == 2
	})
	eventually(t, "no renewal in flight", func() bool {
		return !ha.shared.slotSyncing.Load() && !hb.shared.slotSyncing.Load()
	})
	mr.FlushAll()
	ha.shared.kickSlots()
	eventually(t, "A's entry back in the pool", func() bool {
		fields, _ := mr.HKeys(cluster.PoolKey("lost:"))
		return len(fields) == 1 && fields[0] == ha.shared.instance
	})
	eventually(t, "A's renewal applied", func() bool { return !ha.shared.slotSyncing.Load() })
	if a := ha.shared.q.Stats(false); a.Capacity != 2 || a.Inflight != 2 {
		t.Fatalf("A alone in the lost pool: capacity %d, %d in flight; want 2 and 2 (B still holds 2 of 4)", a.Capacity, a.Inflight)
	}
}

// TestClusterSharedSlotsRestoreWaitsForEveryGateway: after Redis lost the
// pool, a gateway whose client has not reconnected yet (B: it renews
// nothing) still holds its slots. However long that lasts, A takes no
// more than it held until B has renewed (a fixed window of a few syncs
// let A take B's slots too: CI saw 10 requests on a pool of 8), and then
// no longer holds back.
func TestClusterSharedSlotsRestoreWaitsForEveryGateway(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	cc := fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"wait:","share_slots":true,"sync":"100ms","lease_ttl":"20s"}`, mr.Addr())
	cfg := func(name string) string { return fqConfig(name, u, `"max_inflight":4,"cluster":`+cc) }
	ha, _ := mustLoad(t, cfg(queueName(t)+"_a"))
	hb, _ := mustLoad(t, cfg(queueName(t)+"_b"))
	// Split while idle first: A alone would fill the pool with its own.
	eventually(t, "the idle pool of 4 split 2/2", func() bool {
		return ha.shared.q.Stats(false).Capacity == 2 && hb.shared.q.Stats(false).Capacity == 2
	})
	for _, h := range []*Handler{ha, hb} {
		for range 8 {
			if _, err := h.shared.q.Enqueue(fairqueue.Request{Tenant: "x", Cost: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the pool of 4 split 2/2 and filled", func() bool {
		a, b := ha.shared.q.Stats(false), hb.shared.q.Stats(false)
		return a.Capacity == 2 && b.Capacity == 2 && a.Inflight == 2 && b.Inflight == 2
	})
	// B renews nothing from here: a renewal counts as in flight forever.
	eventually(t, "B's renewal in flight done", func() bool { return hb.shared.slotSyncing.CompareAndSwap(false, true) })
	mr.FlushAll()
	// Fifteen of A's renewals, far past the four syncs the fixed window
	// waited (2 x (sync + tick + timeout)).
	watchRenewals(t, ha, "fifteen of A's renewals after Redis lost the pool", 15, func() {
		if a := ha.shared.q.Stats(false); a.Capacity > 2 {
			t.Fatalf("A took %d slots while B, not renewed since Redis lost the pool, holds 2 of 4", a.Capacity)
		}
	})
	if fields, _ := mr.HKeys(cluster.PoolKey("wait:")); len(fields) != 1 || fields[0] != ha.shared.instance {
		t.Fatalf("entries %v, want A's alone (A renewed, B did not)", fields)
	}
	if ha.shared.slotRestoreSince.Load() == 0 {
		t.Fatal("A is not holding back while B has not renewed")
	}
	hb.shared.slotSyncing.Store(false)
	hb.shared.kickSlots()
	eventually(t, "A no longer holding back once B renewed", func() bool { return ha.shared.slotRestoreSince.Load() == 0 })
}
