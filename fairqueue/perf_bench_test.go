package fairqueue

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cycleRig is a queue in BenchmarkCycleFull's steady state: n undeclared
// tenants backlogged, the capacity full, every request with a deadline and
// completed at an actual cost other than its estimate.
type cycleRig struct {
	q     *Queue
	clk   *ManualClock
	names []string
	ring  []*Ticket
	head  int
	i     int
}

const rigCapacity = 64

func newCycleRig(b testing.TB, n int) *cycleRig {
	q, clk := benchQueue(b, rigCapacity)
	r := &cycleRig{q: q, clk: clk, names: make([]string, n), ring: make([]*Ticket, 0, 2*rigCapacity)}
	for i := range r.names {
		r.names[i] = "tenant-" + strconv.Itoa(i)
	}
	q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventDispatched {
			r.ring = append(r.ring, tk)
		}
	})
	depth := 2 + 2*rigCapacity/n
	for k := 0; k < depth*n; k++ {
		if _, err := q.Enqueue(r.request(k)); err != nil {
			b.Fatal(err)
		}
	}
	if len(r.ring) != rigCapacity {
		b.Fatalf("in flight %d, want %d", len(r.ring), rigCapacity)
	}
	return r
}

func (r *cycleRig) request(i int) Request {
	r.clk.Advance(time.Microsecond)
	return Request{Tenant: r.names[i%len(r.names)], Cost: int64(50 + (i*7919)%2000),
		Deadline: r.clk.Now().Add(time.Hour)}
}

// cycle releases the oldest in-flight ticket, which dispatches the next
// request in tag order, and enqueues one more.
func (r *cycleRig) cycle(b testing.TB) {
	tk := r.ring[r.head]
	r.ring = r.ring[:rigCapacity]
	tk.Release(tk.cost * 3 / 4)
	if len(r.ring) != rigCapacity+1 {
		b.Fatalf("release dispatched %d tickets, want 1", len(r.ring)-rigCapacity)
	}
	r.ring[r.head] = r.ring[rigCapacity]
	if r.head++; r.head == rigCapacity {
		r.head = 0
	}
	if _, err := r.q.Enqueue(r.request(r.i)); err != nil {
		b.Fatal(err)
	}
	r.i++
}

// BenchmarkScrapeDispatch measures what a metrics scrape costs dispatch at
// 100k remembered tenants: each scheduling cycle (a completion that
// dispatches the next request, and an arrival) is timed, and its p50, p99,
// p99.9, p99.99 and max reported (a scrape comes every few thousand
// cycles, so what holding the lock for a whole copy costs shows in the
// tail and the max more than at p99), without a scrape (scrape=off) and with a goroutine
// calling Stats(true) in a loop meanwhile (scrape=on), side by side.
func BenchmarkScrapeDispatch(b *testing.B) {
	for _, scrape := range []bool{false, true} {
		name := "scrape=off"
		if scrape {
			name = "scrape=on"
		}
		b.Run(name+"/tenants=100000", func(b *testing.B) {
			r := newCycleRig(b, 100000)
			var stop atomic.Bool
			var scrapes atomic.Int64
			var wg sync.WaitGroup
			if scrape {
				wg.Go(func() {
					for !stop.Load() {
						if s := r.q.Stats(true); len(s.Tenants) < 100000 {
							panic("scrape lost tenants")
						}
						scrapes.Add(1)
					}
				})
			}
			lat := make([]time.Duration, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				r.cycle(b)
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[min(int(p*float64(b.N)), b.N-1)]) }
			b.ReportMetric(q(0.5), "p50-ns")
			b.ReportMetric(q(0.99), "p99-ns")
			b.ReportMetric(q(0.999), "p99.9-ns")
			b.ReportMetric(q(0.9999), "p99.99-ns")
			b.ReportMetric(float64(lat[b.N-1]), "max-ns")
			b.ReportMetric(float64(scrapes.Load()), "scrapes")
		})
	}
}

// BenchmarkStats measures one Stats(true) at 100k remembered tenants (the
// rig of BenchmarkScrapeDispatch): the copy, which before chunking held
// the queue's lock throughout and now holds it for statsChunk tenants at a
// time, and the sort by name outside the lock.
func BenchmarkStats(b *testing.B) {
	r := newCycleRig(b, 100000)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if s := r.q.Stats(true); len(s.Tenants) != 100000 {
			b.Fatalf("%d tenants", len(s.Tenants))
		}
	}
}

// TestCycleAllocs holds the scheduling cycle to its one allocation
// (the new request's ticket) at 10 and 100k tenants, in the rig of
// BenchmarkScrapeDispatch: deadlines on every request, completions that
// correct the estimate. Allocations are counted, not timed, so the bound
// is exact on any machine.
func TestCycleAllocs(t *testing.T) {
	for _, n := range []int{10, 100000} {
		r := newCycleRig(t, n)
		if allocs := testing.AllocsPerRun(2000, func() { r.cycle(t) }); allocs > 1 {
			t.Errorf("%d tenants: %.2f allocations a cycle, want at most 1", n, allocs)
		}
	}
}
