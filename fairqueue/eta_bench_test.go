package fairqueue

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"
)

// etaBenchQueue returns a queue with wait budgets on (fast-fail, boosts up
// to a tenth of the slots, a rate prior so that every ETA is known from
// the start) and n tenants, declared or not, each backlogged two or more
// requests deep with requests due in due, the capacity full. With walk the
// queue computes its ETAs by the walk over the backlogged flows, without
// walk by the work-ahead index, whatever their number. ring receives the
// dispatched tickets, oldest first.
func etaBenchQueue(b *testing.B, n int, declared, walk bool, due time.Duration, ring *[]*Ticket) (*Queue, *ManualClock, []string) {
	b.Helper()
	const capacity = 64
	clk := NewManualClock(time.Unix(0, 0))
	cfg := Config{
		MaxInflight: capacity,
		Classes:     []ClassConfig{{Name: "batch"}},
		Default:     TenantConfig{Weight: 1, Class: "batch"},
		Admission:   BudgetConfig{FastFail: true, BoostShareMax: 0.1, Margin: 50 * time.Millisecond},
	}
	// The prior puts every ETA well within the deadlines: the queue admits
	// all and, re-checking, boosts none.
	cfg.Admission.Throughput.Prior = 1e9
	names := make([]string, n)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	if declared {
		cfg.Tenants = make(map[string]TenantConfig, n)
		for i, name := range names {
			cfg.Tenants[name] = TenantConfig{Weight: float64(1 + i%4), Class: "batch"}
		}
	}
	q, err := New(cfg, clk)
	if err != nil {
		b.Fatal(err)
	}
	q.adm.walkMax = -1 // the index, however few the flows: a quick fill
	q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventDispatched {
			*ring = append(*ring, tk)
		}
	})
	q.SetHealthy(1)
	depth := 2 + 2*capacity/n
	for r := 0; r < depth; r++ {
		for i := 0; i < n; i++ {
			if _, err := q.Enqueue(etaBenchRequest(clk, names, i+r*n, due)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if len(*ring) != capacity {
		b.Fatalf("in flight %d, want %d", len(*ring), capacity)
	}
	if walk {
		q.mu.Lock()
		q.adm.walkMax = math.MaxInt
		q.adm.ahead.reset()
		q.mu.Unlock()
	}
	return q, clk, names
}

func etaBenchRequest(clk *ManualClock, names []string, i int, due time.Duration) Request {
	clk.Advance(time.Microsecond)
	return Request{Tenant: names[i%len(names)], Cost: int64(50 + (i*7919)%2000),
		Deadline: clk.Now().Add(due)}
}

// BenchmarkAdmissionETA measures admission with wait budgets at n
// backlogged tenants: one steady-state cycle (release the oldest request
// in flight with an actual cost other than its estimate, which dispatches
// the next by tag, then enqueue a request with a deadline, whose ETA,
// boost plan and fast-fail decision admission computes), with the ETA
// from the walk over every backlogged flow (walk, before) and from the
// work-ahead index (tree), side by side. Undeclared tenants compete inside
// the group (the ETA's inner level); declared ones, of weights 1 to 4, at
// the top level.
func BenchmarkAdmissionETA(b *testing.B) {
	for _, declared := range []bool{false, true} {
		for _, n := range []int{100, 1000, 10000} {
			for _, walk := range []bool{true, false} {
				b.Run(benchName(declared, n, walk), func(b *testing.B) { benchAdmissionETA(b, n, declared, walk) })
			}
		}
	}
}

func benchAdmissionETA(b *testing.B, n int, declared, walk bool) {
	var ring []*Ticket
	q, clk, names := etaBenchQueue(b, n, declared, walk, time.Hour, &ring)
	capacity := len(ring)
	head := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tk := ring[head]
		ring = ring[:capacity]
		tk.Release(tk.cost * 3 / 4)
		if len(ring) != capacity+1 {
			b.Fatalf("release dispatched %d tickets, want 1", len(ring)-capacity)
		}
		ring[head] = ring[capacity]
		if head++; head == capacity {
			head = 0
		}
		if _, err := q.Enqueue(etaBenchRequest(clk, names, i, time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	if walk == q.adm.ahead.active {
		b.Fatalf("walk %v, but the work-ahead index kept: %v", walk, q.adm.ahead.active)
	}
}

// benchName names a sub-benchmark of BenchmarkAdmissionETA and
// BenchmarkAdmissionRecheck.
func benchName(declared bool, n int, walk bool) string {
	kind, how := "undeclared", "tree"
	if declared {
		kind = "declared"
	}
	if walk {
		how = "walk"
	}
	return fmt.Sprintf("%s/tenants=%d/%s", kind, n, how)
}

// BenchmarkAdmissionRecheck measures the boost re-check of one tick
// (recheckLocked) at n backlogged tenants whose requests are all due
// within its horizon: it re-decides maxRecheck of them, each with an ETA,
// from the walk (before) or from the work-ahead index (tree). Every ETA
// makes its deadline, so nothing is promoted and each tick does the same
// work.
func BenchmarkAdmissionRecheck(b *testing.B) {
	for _, declared := range []bool{false, true} {
		for _, n := range []int{100, 1000, 10000} {
			for _, walk := range []bool{true, false} {
				b.Run(benchName(declared, n, walk), func(b *testing.B) {
					var ring []*Ticket
					q, clk, _ := etaBenchQueue(b, n, declared, walk, time.Second, &ring)
					visited := 0
					q.mu.Lock()
					now := clk.Now()
					horizon := now.Add(q.boostETALocked(now, 0)*4 + q.cfg.Admission.Margin + time.Second)
					q.deadlines.visitBefore(horizon.UnixNano(), maxRecheck, func(*Ticket) { visited++ })
					q.mu.Unlock()
					if visited != maxRecheck {
						b.Fatalf("the re-check visits %d requests, want %d", visited, maxRecheck)
					}
					b.ReportAllocs()
					for b.Loop() {
						q.mu.Lock()
						q.recheckLocked(now)
						q.mu.Unlock()
					}
					if q.boost.n != 0 {
						b.Fatalf("the re-check promoted %d requests", q.boost.n)
					}
				})
			}
		}
	}
}

// BenchmarkAdmissionIndexBuild measures building the work-ahead index
// from scratch at n backlogged tenants, what the first ETA after a reload
// (or after the queue ran empty) pays once, under the lock.
func BenchmarkAdmissionIndexBuild(b *testing.B) {
	for _, declared := range []bool{false, true} {
		for _, n := range []int{10000, 100000} {
			b.Run(benchName(declared, n, false), func(b *testing.B) {
				var ring []*Ticket
				q, _, _ := etaBenchQueue(b, n, declared, false, time.Hour, &ring)
				q.mu.Lock()
				defer q.mu.Unlock()
				b.ReportAllocs()
				for b.Loop() {
					q.adm.ahead.reset()
					q.aheadSyncLocked()
				}
				if q.adm.ahead.size < n {
					b.Fatalf("%d tenants filed, want %d or more", q.adm.ahead.size, n)
				}
			})
		}
	}
}
