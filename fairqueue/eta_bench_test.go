package fairqueue

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// etaBenchQueue returns a queue with wait budgets on (fast-fail, boosts up
// to a tenth of the slots, a rate prior so that every ETA is known from
// the start) and n tenants, declared or not, each backlogged depth deep
// with requests due in an hour, the capacity full. With walk the queue
// computes its ETAs by the walk over the heaps that the work-ahead index
// replaced. ring receives the dispatched tickets, oldest first.
func etaBenchQueue(b *testing.B, n int, declared, walk bool, ring *[]*Ticket) (*Queue, *ManualClock, []string) {
	b.Helper()
	const capacity = 64
	clk := NewManualClock(time.Unix(0, 0))
	cfg := Config{
		MaxInflight: capacity,
		Classes:     []ClassConfig{{Name: "batch"}},
		Default:     TenantConfig{Weight: 1, Class: "batch"},
		Admission:   BudgetConfig{FastFail: true, BoostShareMax: 0.1, Margin: 50 * time.Millisecond},
	}
	cfg.Admission.Throughput.Prior = 1e7
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
	if walk {
		q.adm.walkAhead = (*Queue).workAheadWalkLocked4
	}
	q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventDispatched {
			*ring = append(*ring, tk)
		}
	})
	q.SetHealthy(1)
	depth := 2 + 2*capacity/n
	for r := 0; r < depth; r++ {
		for i := 0; i < n; i++ {
			if _, err := q.Enqueue(etaBenchRequest(clk, names, i+r*n)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if len(*ring) != capacity {
		b.Fatalf("in flight %d, want %d", len(*ring), capacity)
	}
	return q, clk, names
}

// workAheadWalkLocked4 is workAheadWalkLocked with others, as the
// walkAhead hook takes it.
func (q *Queue) workAheadWalkLocked4(now time.Time, t *tenant, cq *classQ, ownAhead, cost int64) float64 {
	return q.workAheadWalkLocked(now, t, cq, ownAhead, cost, true)
}

func etaBenchRequest(clk *ManualClock, names []string, i int) Request {
	clk.Advance(time.Microsecond)
	return Request{Tenant: names[i%len(names)], Cost: int64(50 + (i*7919)%2000),
		Deadline: clk.Now().Add(time.Hour)}
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
				name := fmt.Sprintf("undeclared/tenants=%d/tree", n)
				if declared {
					name = fmt.Sprintf("declared/tenants=%d/tree", n)
				}
				if walk {
					name = name[:len(name)-len("tree")] + "walk"
				}
				b.Run(name, func(b *testing.B) { benchAdmissionETA(b, n, declared, walk) })
			}
		}
	}
}

func benchAdmissionETA(b *testing.B, n int, declared, walk bool) {
	var ring []*Ticket
	q, clk, names := etaBenchQueue(b, n, declared, walk, &ring)
	capacity := len(ring)
	head := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
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
		if _, err := q.Enqueue(etaBenchRequest(clk, names, i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if !walk && !q.adm.ahead.active {
		b.Fatal("the work-ahead index was not used")
	}
}
