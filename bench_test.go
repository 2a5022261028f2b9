package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkProxy puts fair_queue + its reverse_proxy side by side with
// Caddy's reverse_proxy alone, both provisioned the real way and both
// proxying to the same fast in-process upstream (a small chat completion
// with usage) over loopback HTTP/1.1 with keep-alive. Each op is one
// request: made, prepared as Caddy's server prepares it (replacer and
// context values), served by the handler in-process, recorded.
//
//	seq/plain                reverse_proxy alone, one client
//	seq/fair_queue           fair_queue (tokenizer cl100k_base, the default) + reverse_proxy
//	seq/fair_queue_approx    the same with tokenizer approx: on this small
//	                         prompt both count it exactly in a microsecond or
//	                         two, so the difference is mostly noise
//	seq/fair_queue_quota     fair_queue with a tenant quota that never binds: the
//	                         difference to fair_queue is the quota's cost
//	parallel/...             the same under b.RunParallel (GOMAXPROCS
//	                         clients; the queue's 16 slots are never all taken)
//	backlog/<size>/...       a chat of 1 KB, 32 KB or 128 KB of English and
//	                         Chinese, one client, through plain, fair_queue
//	                         with its queue empty (idle), and fair_queue while
//	                         64 requests of another tenant wait in its queue
//	                         (backlogged; a quota holds them there, so the
//	                         request measured still finds a free slot)
//
// Within each mode plain runs first, and every fair_queue variant reports
// its overhead over the plain run just before it, in the same process:
// vs_plain_% of ns/op and vs_plain_cpu_% of CPU per op (the steadier on a
// shared machine), with allocs/op and B/op side by side in the usual
// columns. The goal is vs_plain_% <= 5 in parallel.
func BenchmarkProxy(b *testing.B) {
	cases, serve := proxyCases(b)
	loops := map[string]func(b *testing.B, h caddyhttp.Handler){
		"seq": func(b *testing.B, h caddyhttp.Handler) {
			for b.Loop() {
				if err := serve(h); err != nil {
					b.Fatal(err)
				}
			}
		},
		"parallel": func(b *testing.B, h caddyhttp.Handler) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := serve(h); err != nil {
						b.Error(err)
						return
					}
				}
			})
		},
	}
	b.Run("backlog", benchmarkBacklog)
	for _, mode := range []string{"seq", "parallel"} {
		b.Run(mode, func(b *testing.B) {
			// The plain run's figures, per op, for the fair variants after it.
			var plainNs, plainCPU float64
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) {
					if err := serve(c.h); err != nil { // warm: connection and encodings
						b.Fatal(err)
					}
					b.ReportAllocs()
					cpu := processCPU()
					b.ResetTimer()
					loops[mode](b, c.h)
					b.StopTimer()
					ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					cpuNs := float64(processCPU()-cpu) / float64(b.N)
					b.ReportMetric(cpuNs, "cpu-ns/op")
					if c.name == "plain" {
						plainNs, plainCPU = ns, cpuNs
					} else if plainNs > 0 && plainCPU > 0 {
						b.ReportMetric(100*(ns/plainNs-1), "vs_plain_%")
						b.ReportMetric(100*(cpuNs/plainCPU-1), "vs_plain_cpu_%")
					}
				})
			}
		})
	}
}

// proxyCase is one handler of BenchmarkProxy.
type proxyCase struct {
	name string
	h    caddyhttp.Handler
	mod  caddy.Module // as provisioned
}

// proxyCases provisions BenchmarkProxy's handlers (plain first) and
// returns them with serve, which makes one request through a handler as
// Caddy's server would and checks it was served.
func proxyCases(tb testing.TB) ([]proxyCase, func(caddyhttp.Handler) error) {
	return proxyCasesIn(tb, false)
}

// proxyCasesIn is proxyCases with the upstream in memory (memTransport)
// when inMemory, where the plain_read_timeout case, a setting of the
// network transport, has no meaning and is left out.
func proxyCasesIn(tb testing.TB, inMemory bool) ([]proxyCase, func(caddyhttp.Handler) error) {
	body := chatBody("")
	// upstream is the reverse_proxy fields that say where requests go.
	var upstream string
	if inMemory {
		upstream = `"upstreams":[{"dial":"localhost:9"}],"transport":{"protocol":"fq_bench_memory"}`
	} else {
		up := newBenchUpstream(tb)
		upstream = fmt.Sprintf(`"upstreams":[{"dial":%q}]`, up.Listener.Addr().String())
	}

	ctx, cancel := configContext(tb)
	tb.Cleanup(cancel)
	load := func(name, id, cfg string) proxyCase {
		mod, err := ctx.LoadModuleByID(id, json.RawMessage(cfg))
		if err != nil {
			tb.Fatalf("%s: %v", id, err)
		}
		mh := mod.(caddyhttp.MiddlewareHandler)
		return proxyCase{name, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return mh.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		}), mod.(caddy.Module)}
	}
	fq := func(name, tokenizer string) string {
		return fmt.Sprintf(`{"name":%q,"tokenizer":%q,"proxy":{"handler":"reverse_proxy",%s}}`, name, tokenizer, upstream)
	}
	// The same with a quota on the tenant that never binds (all three
	// meters): its difference to fair_queue is what a quota costs.
	fqQuota := fmt.Sprintf(`{"name":"bench_quota","tenants":{"acme":{"quota":{"qps":1e8,"tokens_per_min":1e12}}},`+
		`"proxy":{"handler":"reverse_proxy",%s}}`, upstream)
	suffix := ""
	if inMemory {
		suffix = "_mem" // queue names are process-wide
	}
	cases := []proxyCase{load("plain", "http.handlers.reverse_proxy", "{"+upstream+"}")} // first: the others compare to it
	if !inMemory {
		// plain with the transport settings fair_queue gives its inner
		// proxy by default (read_timeout, module.go): Caddy then sets a
		// deadline around each read of the upstream connection, a cost of
		// the setting, not of the queue. Compare fair_queue with both.
		cases = append(cases, load("plain_read_timeout", "http.handlers.reverse_proxy",
			fmt.Sprintf(`{%s,"transport":{"protocol":"http","read_timeout":%q}}`, upstream, defaultReadTimeout.String())))
	}
	cases = append(cases,
		load("fair_queue", "http.handlers.fair_queue", fq("bench_cl100k"+suffix, "cl100k_base")),
		load("fair_queue_approx", "http.handlers.fair_queue", fq("bench_approx"+suffix, "approx")),
		load("fair_queue_quota", "http.handlers.fair_queue", strings.Replace(fqQuota, "bench_quota", "bench_quota"+suffix, 1)),
	)
	srv := &caddyhttp.Server{}
	serve := func(h caddyhttp.Handler) error {
		r, err := http.NewRequest(http.MethodPost, "http://gateway/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant-ID", "acme")
		// As net/http's server leaves it for a request with a body.
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
		if err := h.ServeHTTP(w, r); err != nil || w.Code != http.StatusOK {
			return fmt.Errorf("status %d, error %v, body %s", w.Code, err, w.Body)
		}
		return nil
	}
	return cases, serve
}

// benchResponse is the benchmarks' upstream's answer: a small chat
// completion with usage.
var benchResponse = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":25,"completion_tokens":7,"total_tokens":32}}`)

// newBenchUpstream answers every request with the same small chat
// completion, with usage, as fast as it can.
func newBenchUpstream(tb testing.TB) *httptest.Server {
	resp := benchResponse
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(resp)))
		_, _ = w.Write(resp)
	}))
	tb.Cleanup(s.Close)
	return s
}

// BenchmarkRefusedBeforeBody is the cost of a request refused by the
// checks that need no body (here its tenant's queue is full) with a 64 KiB
// prompt, through the handler: the body is neither read nor parsed nor
// tokenized, so a flood of requests that will be refused costs the gateway
// next to nothing. "parsed" is the same body read, parsed and estimated
// (refused later, by max_request_tokens), for comparison.
func BenchmarkRefusedBeforeBody(b *testing.B) {
	u := newFakeUpstream(b)
	h, _ := mustLoad(b, fqConfig(queueName(b), u,
		`"max_inflight":1,"max_request_tokens":100,"tenants":{"capped":{"max_queue":1}}`))
	g := newGateway(b, h)
	arrived, release := u.hold("slot")
	defer release()
	holder := g.async(g.newRequest(context.Background(), "capped", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived
	queued := g.async(g.newRequest(context.Background(), "capped", chatBody("")))
	waitQueued(b, h, 1)

	prompt := bytes.Repeat([]byte("lorem ipsum dolor sit amet "), 64<<10/27)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + string(prompt) + `"}]}`)
	for _, c := range []struct {
		name, tenant string
		status       int
	}{
		{"refused_before_body", "capped", http.StatusTooManyRequests},
		{"parsed", "other", http.StatusBadRequest},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if res := g.post(c.tenant, body); res.status != c.status {
					b.Fatalf("status %d, want %d", res.status, c.status)
				}
			}
		})
	}
	release()
	<-holder
	<-queued
}

// BenchmarkReadBody reads a 1 MiB body the way the handler does (a buffer
// that grows as bytes arrive, never more than 64 KiB ahead of them) and
// with io.ReadAll, side by side.
func BenchmarkReadBody(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 1<<20)
	b.Run("readGrowing", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := readGrowing(bytes.NewReader(body), int64(len(body)), 8<<20, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("io.ReadAll", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := io.ReadAll(bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchmarkBacklog is BenchmarkProxy's backlog mode: the request path
// users hit when the queue is not empty, with prompts of the sizes that
// make estimation cost something.
func benchmarkBacklog(b *testing.B) {
	up := newBenchUpstream(b)
	upstream := fmt.Sprintf(`"upstreams":[{"dial":%q}]`, up.Listener.Addr().String())
	ctx, cancel := configContext(b)
	b.Cleanup(cancel)
	load := func(id, cfg string) caddy.Module {
		mod, err := ctx.LoadModuleByID(id, json.RawMessage(cfg))
		if err != nil {
			b.Fatalf("%s: %v", id, err)
		}
		return mod.(caddy.Module)
	}
	// The backlog tenant may send one request in 1000 s: after the first,
	// its requests wait for their quota within their 100 hours of budget,
	// in the queue, never holding a slot.
	fq := func(name string) *Handler {
		return load("http.handlers.fair_queue", fmt.Sprintf(`{"name":%q,`+
			`"tenants":{"backlog":{"wait_budget":"100h","quota":{"qps":0.001}}},"proxy":{"handler":"reverse_proxy",%s}}`, name, upstream)).(*Handler)
	}
	plain := load("http.handlers.reverse_proxy", "{"+upstream+"}").(caddyhttp.MiddlewareHandler)
	idle, backlogged := fq("bench_idle"), fq("bench_backlogged")

	srv := &caddyhttp.Server{}
	serve := func(ctx context.Context, h caddyhttp.MiddlewareHandler, tenant string, body []byte) (int, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gateway/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant-ID", tenant)
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
		err = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		return w.Code, err
	}

	// The backlog: the first request takes the quota's burst; the rest wait.
	const waiting = 64
	bctx, stop := context.WithCancel(context.Background())
	small := benchPrompt(b, 1<<10)
	if code, err := serve(bctx, backlogged, "backlog", small); err != nil || code != http.StatusOK {
		b.Fatalf("the backlog tenant's first request: status %d, error %v", code, err)
	}
	var done sync.WaitGroup
	for range waiting {
		done.Go(func() { _, _ = serve(bctx, backlogged, "backlog", small) })
	}
	waitQueued(b, backlogged, waiting)
	defer func() {
		stop() // the waiting clients go away: their requests leave the queue
		done.Wait()
	}()

	for _, size := range []int{1 << 10, 32 << 10, 128 << 10} {
		body := benchPrompt(b, size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			var plainCPU float64
			for _, c := range []struct {
				name string
				h    caddyhttp.MiddlewareHandler
			}{{"plain", plain}, {"fair_queue_idle", idle}, {"fair_queue_backlogged", backlogged}} {
				b.Run(c.name, func(b *testing.B) {
					if code, err := serve(context.Background(), c.h, "acme", body); err != nil || code != http.StatusOK {
						b.Fatalf("status %d, error %v", code, err)
					}
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					cpu := processCPU()
					for b.Loop() {
						if code, err := serve(context.Background(), c.h, "acme", body); err != nil || code != http.StatusOK {
							b.Fatalf("status %d, error %v", code, err)
						}
					}
					cpuNs := float64(processCPU()-cpu) / float64(b.N)
					b.ReportMetric(cpuNs, "cpu-ns/op")
					if c.name == "plain" {
						plainCPU = cpuNs
					} else if plainCPU > 0 {
						b.ReportMetric(100*(cpuNs/plainCPU-1), "vs_plain_cpu_%")
					}
					if c.h == backlogged {
						if q, _ := queueStats(backlogged); q != waiting {
							b.Fatalf("%d requests waiting, want %d: the case lost its backlog", q, waiting)
						}
					}
				})
			}
		})
	}
}

// benchPrompt is a chat completion request of about size bytes: a system
// prompt and user messages of English and Chinese prose (llmapi's test
// corpora), as a long RAG or document prompt is.
func benchPrompt(tb testing.TB, size int) []byte {
	tb.Helper()
	var paras []string
	for _, f := range []string{"llmapi/testdata/en.md", "llmapi/testdata/zh.txt"} {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		paras = append(paras, strings.Split(string(b), "\n\n")...)
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []message{{"system", "You are a helpful assistant. Answer from the documents below."}}
	n := 0
	for i := 0; n < size; i++ {
		var doc strings.Builder
		for doc.Len() < min(size-n, 4096) {
			doc.WriteString(paras[(i*7+doc.Len())%len(paras)])
			doc.WriteString("\n\n")
		}
		msgs = append(msgs, message{"user", doc.String()})
		n += doc.Len()
	}
	body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 256, "messages": msgs})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}
