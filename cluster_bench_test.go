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
