package caddyfairqueue

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// interleaveBatch is how many requests each side sends per turn in
// BenchmarkProxyInterleaved: enough to amortize the turn's clock and
// rusage reads, few enough that a side never runs alone for long.
const interleaveBatch = 64

// interleaveWith is the case of proxyCases that BenchmarkProxyInterleaved
// puts beside plain.
const interleaveWith = "fair_queue"

// BenchmarkProxyInterleaved is BenchmarkProxy's comparison made so that
// the machine's drift cancels: reverse_proxy alone and fair_queue take
// turns of interleaveBatch requests each (which side goes first
// alternates), through the same loopback upstream, in one benchmark, and
// each side's wall and CPU time are summed over its turns. On a shared
// machine, where two sub-benchmarks run seconds apart can differ by 15%,
// this ratio moves by a few points only. One op is one request of each
// side; plain-ns/op and fair-ns/op are per request of that side, vs_plain_%
// and vs_plain_cpu_% fair_queue's overhead. In parallel GOMAXPROCS
// clients share each turn.
func BenchmarkProxyInterleaved(b *testing.B) {
	cases, serve := proxyCases(b)
	var plain, fair caddyhttp.Handler
	for _, c := range cases {
		switch c.name {
		case "plain":
			plain = c.h
		case interleaveWith:
			fair = c.h
		}
	}
	for _, mode := range []struct {
		name    string
		clients int
	}{{"seq", 1}, {"parallel", runtime.GOMAXPROCS(0)}} {
		b.Run(mode.name, func(b *testing.B) {
			// turn sends n requests through h from the mode's clients.
			turn := func(h caddyhttp.Handler, n int) {
				if mode.clients == 1 {
					for range n {
						if err := serve(h); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				var wg sync.WaitGroup
				errs := make(chan error, mode.clients)
				for c := range mode.clients {
					k := n / mode.clients
					if c < n%mode.clients {
						k++
					}
					wg.Go(func() {
						for range k {
							if err := serve(h); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
			sides := [2]caddyhttp.Handler{plain, fair}
			for _, h := range sides { // warm: connections, pools, metric children
				turn(h, 2*mode.clients)
			}
			var wall, cpu [2]int64
			b.ReportAllocs()
			b.ResetTimer()
			first := 0
			for done := 0; done < b.N; done += interleaveBatch {
				n := min(interleaveBatch, b.N-done)
				for i := range 2 {
					side := (first + i) % 2
					t0, c0 := time.Now(), processCPU()
					turn(sides[side], n)
					wall[side] += int64(time.Since(t0))
					cpu[side] += processCPU() - c0
				}
				first ^= 1
			}
			b.StopTimer()
			per := func(v int64) float64 { return float64(v) / float64(b.N) }
			b.ReportMetric(per(wall[0]), "plain-ns/op")
			b.ReportMetric(per(wall[1]), "fair-ns/op")
			if wall[0] > 0 && cpu[0] > 0 {
				b.ReportMetric(100*(float64(wall[1])/float64(wall[0])-1), "vs_plain_%")
				b.ReportMetric(100*(float64(cpu[1])/float64(cpu[0])-1), "vs_plain_cpu_%")
			}
		})
	}
}
