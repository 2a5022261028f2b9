package caddyfairqueue

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

// scaleTenants is how many tenants BenchmarkScale's requests rotate
// through: each undeclared, each under a quota of its own.
const scaleTenants = 100_000

// BenchmarkScale gives the figures an operator asks before trusting one
// gateway, or a cluster of them, with many tenants. Each request is a
// small chat completion through the handler as BenchmarkProxy serves it,
// from GOMAXPROCS clients, for the next of 100k tenants in turn, each
// under a quota of its own (default_tenant's, which never binds here).
//
//	gateway     one gateway, quotas in process, the upstream in memory
//	            (memTransport): what the gateway itself admits and
//	            dispatches. req/s, CPU per request (cpu-ns/op), and the heap
//	            that stays per remembered tenant after each of the 100k
//	            sent one request (B/tenant: its queue state, quota meters
//	            and name).
//	redis_3gw   three gateways (three handlers with their own queues, as
//	            three Caddy processes would have) sharing the quotas through
//	            one real redis-server ($REDIS_ADDR, or one started here):
//	            Redis round trips per request (rt/op), requests per second
//	            of the three together (req/s), Redis's own CPU time per
//	            request (redis-cpu-ns/op, from INFO: every quota decision
//	            and reconciliation of the request), and the requests one
//	            Redis core sustains at that cost (req/s/redis-core).
//
// Everything runs on one shared machine, Redis included: the rates are
// observed, not limits of the design.
func BenchmarkScale(b *testing.B) {
	ctx, cancel := configContext(b)
	b.Cleanup(cancel)
	const quota = `"default_tenant":{"quota":{"qps":1e8,"tokens_per_min":1e12}}`
	load := func(name, cluster string) *Handler {
		if cluster != "" {
			cluster = `,"cluster":` + cluster
		}
		mod, err := ctx.LoadModuleByID("http.handlers.fair_queue", []byte(fmt.Sprintf(`{"name":%q,"max_inflight":1024,%s,`+
			`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":"localhost:9"}],"transport":{"protocol":"fq_bench_memory"}}%s}`,
			name, quota, cluster)))
		if err != nil {
			b.Fatal(err)
		}
		return mod.(*Handler)
	}
	tenants := make([]string, scaleTenants)
	for i := range tenants {
		tenants[i] = "tenant-" + strconv.Itoa(i)
	}
	body := chatBody("")
	srv := &caddyhttp.Server{}
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	serve := func(h *Handler, tenant string) error {
		r, err := http.NewRequest(http.MethodPost, "http://gateway/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant-ID", tenant)
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
		if err := h.ServeHTTP(w, r, next); err != nil || w.Code != http.StatusOK {
			return fmt.Errorf("status %d, error %v, body %.200s", w.Code, err, w.Body)
		}
		return nil
	}
	// run sends b.N requests from GOMAXPROCS clients, the i-th to
	// gateways[i%len] for tenant i%scaleTenants, after start (the next
	// tenant's index), and reports req/s and CPU per request.
	run := func(b *testing.B, gateways []*Handler, start int) {
		var n atomic.Int64
		n.Store(int64(start))
		b.ReportAllocs()
		cpu := processCPU()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := int(n.Add(1))
				if err := serve(gateways[i%len(gateways)], tenants[i%scaleTenants]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
	}

	b.Run("gateway", func(b *testing.B) {
		h := load(fmt.Sprintf("bench_scale_%d", time.Now().UnixNano()), "")
		heap0 := heapAfterGC()
		for _, t := range tenants { // every tenant remembered, with its meters
			if err := serve(h, t); err != nil {
				b.Fatal(err)
			}
		}
		heap1 := heapAfterGC()
		if got := h.shared.q.Stats(false).Remembered; got < scaleTenants {
			b.Fatalf("%d tenants remembered, want %d", got, scaleTenants)
		}
		run(b, []*Handler{h}, 0)
		b.ReportMetric(float64(int64(heap1)-int64(heap0))/scaleTenants, "B/tenant")
	})

	b.Run("redis_3gw", func(b *testing.B) {
		addr := benchRedis(b)
		cluster := fmt.Sprintf(`{"redis":"redis://%s","prefix":"bench:scale:%d:","instances":3}`, addr, time.Now().UnixNano())
		var gateways []*Handler
		trips := new(benchRoundTrips)
		for i := range 3 {
			h := load(fmt.Sprintf("bench_scale_gw%d_%d", i, time.Now().UnixNano()), cluster)
			h.cluster.client.AddHook(trips)
			gateways = append(gateways, h)
		}
		for i := range 30 { // warm: connections, the script
			if err := serve(gateways[i%3], tenants[i]); err != nil {
				b.Fatal(err)
			}
		}
		rc := redis.NewClient(&redis.Options{Addr: addr})
		defer rc.Close()
		trips.n.Store(0)
		cpu0 := redisCPU(b, rc)
		run(b, gateways, 30)
		cpu1 := redisCPU(b, rc)
		b.ReportMetric(float64(trips.n.Load())/float64(b.N), "rt/op")
		perRequest := float64(cpu1-cpu0) / float64(b.N)
		b.ReportMetric(perRequest, "redis-cpu-ns/op")
		if perRequest > 0 {
			b.ReportMetric(1e9/perRequest, "req/s/redis-core")
		}
	})
}

// heapAfterGC is the heap in use after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// redisCPU is the CPU time the Redis server has used (INFO cpu:
// used_cpu_sys + used_cpu_user), in ns.
func redisCPU(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s: %v", line, err)
			}
			total += f
		}
	}
	return int64(total * 1e9)
}
