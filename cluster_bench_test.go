package caddyfairqueue

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/redis/go-redis/v9"
)

// BenchmarkQuotaStore is the cost of a cluster-wide quota per request,
// through the handler as BenchmarkProxy serves it, with a tenant quota
// that never binds:
//
//	local        the quota in the queue's in-process store
//	redis        the quota in Redis (cluster block): $REDIS_ADDR, or a
//	             redis-server this benchmark starts on a free port
//	redis_down   cluster block, Redis unreachable: decisions on the
//	             gateway's share (after the first call found the outage)
//
// It reports each op's median and p99 wall time (p50-ns, p99-ns) and, for
// the Redis cases, the commands sent to Redis per request (rt/op): each is
// one round trip. The added latency of a shared quota is redis - local.
func BenchmarkQuotaStore(b *testing.B) {
	up := newBenchUpstream(b)
	addr := benchRedis(b)
	ctx, cancel := configContext(b)
	b.Cleanup(cancel)
	cfg := func(name, cluster string) string {
		if cluster != "" {
			cluster = `,"cluster":` + cluster
		}
		return fmt.Sprintf(`{"name":%q,"tokenizer":"approx","tenants":{"acme":{"quota":{"qps":1e8,"tokens_per_min":1e12}}},`+
			`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}%s}`, name, up.Listener.Addr().String(), cluster)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	cases := []struct{ name, cluster string }{
		{"local", ""},
		{"redis", fmt.Sprintf(`{"redis":"redis://%s","prefix":"bench:%d:"}`, addr, time.Now().UnixNano())},
		{"redis_down", fmt.Sprintf(`{"redis":"redis://%s","instances":3}`, closedAddr)},
	}
	srv := &caddyhttp.Server{}
	body := chatBody("")
	// Loaded once, outside the sub-benchmarks, which -count runs again.
	handlers := make([]*Handler, len(cases))
	trips := make([]*benchRoundTrips, len(cases))
	for i, c := range cases {
		mod, err := ctx.LoadModuleByID("http.handlers.fair_queue", []byte(cfg("bench_store_"+c.name, c.cluster)))
		if err != nil {
			b.Fatal(err)
		}
		handlers[i], trips[i] = mod.(*Handler), new(benchRoundTrips)
		if handlers[i].cluster != nil {
			handlers[i].cluster.client.AddHook(trips[i])
		}
	}
	for i, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h, rt := handlers[i], trips[i]
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
			serve := func() error {
				r, err := http.NewRequest(http.MethodPost, "http://gateway/v1/chat/completions", bytes.NewReader(body))
				if err != nil {
					return err
				}
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("X-Tenant-ID", "acme")
				w := httptest.NewRecorder()
				r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
				if err := h.ServeHTTP(w, r, next); err != nil || w.Code != http.StatusOK {
					return fmt.Errorf("status %d, error %v, body %s", w.Code, err, w.Body)
				}
				return nil
			}
			for range 3 { // warm: connections, the script, the outage found
				if err := serve(); err != nil {
					b.Fatal(err)
				}
			}
			rt.n.Store(0)
			var lat []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if err := serve(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
			if h.cluster != nil {
				b.ReportMetric(float64(rt.n.Load())/float64(len(lat)), "rt/op")
			}
		})
	}
}

// benchRoundTrips counts the commands a client sends, a connection's
// handshake left out.
type benchRoundTrips struct{ n atomic.Int64 }

func (h *benchRoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *benchRoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "hello" && n != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *benchRoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// benchRedis returns the address of a real redis-server: $REDIS_ADDR
// (scripts/test.sh starts one), or one started here for the benchmark.
func benchRedis(b *testing.B) string {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Fatal("neither REDIS_ADDR nor redis-server on PATH: install Debian's redis-server package")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", b.TempDir())
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i == 500 {
			b.Fatal("redis-server did not answer PING")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr
}

// BenchmarkSlotHandoff is how long a slot of a shared pool takes to move
// between two gateways (two queues standing for them) on a real
// redis-server ($REDIS_ADDR, or one it starts), through the announcements
// alone (the next sync is an hour away): the pool is one slot, B holds it,
// A has a heavier tenant's request queued and owed the slot; each op is the
// time from B's request completing upstream to A's reaching it (B's
// release and announcement, A's renewal, A's dispatch). It reports the
// median and p99 (p50-ns, p99-ns). TestClusterSharedSlotsHandoff asserts
// that the move happens without a sync; this measures it.
func BenchmarkSlotHandoff(b *testing.B) {
	u := newFakeUpstream(b)
	addr := benchRedis(b)
	cluster := fmt.Sprintf(`{"redis":"redis://%s","instances":2,"prefix":"handoff:%d:","share_slots":true,"sync":"1h","lease_ttl":"4h"}`,
		addr, time.Now().UnixNano())
	cfg := func(name string) string {
		return fqConfig(name, u, `"max_inflight":1,`+noFastFail+
			`,"tenants":{"bulk":{"weight":1,"class":"batch"},"rt":{"weight":9,"class":"interactive"}},"cluster":`+cluster)
	}
	ha, _ := mustLoad(b, cfg(queueName(b)+"_a"))
	hb, _ := mustLoad(b, cfg(queueName(b)+"_b"))
	eventually(b, "both gateways' first grants, and their subscriptions", func() bool {
		return ha.shared.slotsGranted.Load() && hb.shared.slotsGranted.Load() &&
			ha.shared.slotsListening.Load() && hb.shared.slotsListening.Load()
	})
	ga, gb := newGateway(b, ha), newGateway(b, hb)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	ok := func(r result) {
		if r.err != nil || r.status != http.StatusOK {
			b.Fatalf("status %d, %v: %s", r.status, r.err, r.body)
		}
	}
	await := func(what string, ch <-chan struct{}) {
		select {
		case <-ch:
		case <-time.After(waitLimit):
			a, bs := ha.shared.q.Stats(false), hb.shared.q.Stats(false)
			b.Fatalf("%s: not within %s; A: grant %d, %d queued, %d in flight, capacity %d; B: grant %d, %d queued, %d in flight, capacity %d",
				what, waitLimit, ha.shared.slotGrant.Load(), a.Queued, a.Inflight, a.Capacity,
				hb.shared.slotGrant.Load(), bs.Queued, bs.Inflight, bs.Capacity)
		}
	}
	var lat []time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		bulkArrived, releaseBulk := u.hold(fmt.Sprint("bulk-", i))
		bulk := gb.async(gb.newRequest(ctx, "bulk", chatBody(""), "X-Test-Hold", fmt.Sprint("bulk-", i)))
		await(fmt.Sprintf("B's request dispatched (op %d)", i), bulkArrived)
		rtArrived, releaseRT := u.hold(fmt.Sprint("rt-", i))
		rt := ga.async(ga.newRequest(ctx, "rt", chatBody(""), "X-Test-Hold", fmt.Sprint("rt-", i)))
		eventually(b, fmt.Sprintf("A's request queued and A owed the slot (op %d)", i), func() bool {
			return ha.shared.q.Stats(false).Queued == 1 && ha.shared.slotsOwed.Load() && hb.shared.slotsOver.Load()
		})
		b.StartTimer()
		start := time.Now()
		releaseBulk()
		await("A's request dispatched once B's completed", rtArrived)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		releaseRT()
		ok(<-bulk)
		ok(<-rt)
		// A gateway whose last request ends within its grant does not
		// renew until its next sync (an hour here): Redis would go on
		// counting A's demand, and B's next request would wait for it.
		// Both renew idle before the next op, as a sync would have them.
		ha.shared.kickSlots()
		hb.shared.kickSlots()
		eventually(b, "both gateways' idle renewals", func() bool {
			return !ha.shared.slotSyncing.Load() && !hb.shared.slotSyncing.Load()
		})
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
}

// BenchmarkClusterLeastConnSelect: the cost of a placement (a mutex and a
// map update by dial, and a context value) against the bare pick, over a
// pool of 4 upstreams with a renewal's view.
func BenchmarkClusterLeastConnSelect(b *testing.B) {
	var pool reverseproxy.UpstreamPool
	targets, others := map[string]int{}, map[string]int{}
	for i := range 4 {
		u := &reverseproxy.Upstream{Dial: fmt.Sprintf("127.0.0.1:%d", 9000+i)}
		u.Host = new(reverseproxy.Host)
		pool = append(pool, u)
		targets[u.Dial], others[u.Dial] = 2+i, i
	}
	var view atomic.Pointer[upstreamView]
	view.Store(&upstreamView{others: others, targets: targets})
	set := new(placements)
	p := &ClusterLeastConn{view: &view, placed: set}
	req := httptest.NewRequest("POST", "/", nil)
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			_ = p.Select(pool, req, nil)
		}
	})
	b.Run("placed", func(b *testing.B) {
		for b.Loop() {
			r, pl := withPlacement(req, set)
			_ = p.Select(pool, r, nil)
			pl.release()
		}
	})
}
