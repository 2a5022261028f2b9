package caddyfairqueue

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func init() { caddy.RegisterModule(memTransport{}) }

// memTransport is a reverse_proxy transport that answers every request
// itself, in memory, with newBenchUpstream's response: no socket, no
// other goroutine. Through it a request's whole path through the handlers
// runs on the caller's goroutine, so that its cost is the same count of
// instructions on every run (see BenchmarkProxyInMemory), where over
// loopback the scheduler and the kernel add their own, which vary.
type memTransport struct{}

// CaddyModule returns the Caddy module information.
func (memTransport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.fq_bench_memory",
		New: func() caddy.Module { return new(memTransport) },
	}
}

var (
	memResponse       = benchResponse
	memResponseLength = strconv.Itoa(len(benchResponse))
)

// RoundTrip reads the request body, as an upstream would, and answers.
func (memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Content-Length": {memResponseLength}},
		Body:          io.NopCloser(bytes.NewReader(memResponse)),
		ContentLength: int64(len(memResponse)),
		Request:       r,
	}, nil
}

var _ http.RoundTripper = memTransport{}

// BenchmarkProxyInMemory is BenchmarkProxy's sequential cases with the
// upstream in memory (memTransport) instead of over loopback: what is left
// is the handlers' own work, Caddy's and fair_queue's, on one goroutine.
// Its ns/op still swing with the machine; its instructions per request do
// not, which is what `make bench-instructions` counts (cachegrind, with
// the collector off: allocations are counted by -benchmem instead).
func BenchmarkProxyInMemory(b *testing.B) {
	cases, serve := proxyCasesIn(b, true)
	var plainNs, plainCPU float64
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if err := serve(c.h); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := processCPU()
			b.ResetTimer()
			for b.Loop() {
				if err := serve(c.h); err != nil {
					b.Fatal(err)
				}
			}
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
}

// TestProxyInMemory checks that BenchmarkProxyInMemory measures what it
// says: every case serves the request through memTransport, and the
// fair_queue cases through the queue.
func TestProxyInMemory(t *testing.T) {
	cases, serve := proxyCasesIn(t, true)
	for _, c := range cases {
		for range 4 {
			if err := serve(c.h); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
	}
	// Each fair_queue case charged acme the usage memTransport's answer
	// reports (32 tokens) for each of its 4 requests (one warm-up): the
	// answer went through the queue and was read for its usage.
	for _, c := range cases {
		fq, ok := c.mod.(*Handler)
		if !ok {
			continue
		}
		var served float64
		for _, ts := range fq.shared.q.Stats(true).Tenants {
			if ts.Name == "acme" {
				served = ts.Served
			}
		}
		if served != 4*32 {
			t.Errorf("%s: acme served %v tokens, want %v", c.name, served, 4*32)
		}
	}
	// The quota case charged acme's quota for each: a request and its
	// tokens (through the handler's cached metric children).
	if n := counterValue(quotaCharged, "bench_quota_mem", "acme", "qps"); n != 4 {
		t.Errorf("quota_charged_total{meter=qps} = %v, want 4", n)
	}
	if n := counterValue(quotaCharged, "bench_quota_mem", "acme", "tokens"); n != 4*32 {
		t.Errorf("quota_charged_total{meter=tokens} = %v, want %v", n, 4*32)
	}
}
