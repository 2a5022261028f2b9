package fairqueue

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// benchQueue returns a queue with capacity slots in one upstream, no token
// cap and no queue caps, on a virtual clock.
func benchQueue(b *testing.B, capacity int) (*Queue, *ManualClock) {
	b.Helper()
	cfg := Config{
		MaxInflight: capacity,
		Classes:     []ClassConfig{{Name: "batch"}},
		Default:     TenantConfig{Weight: 1, Class: "batch"},
	}
	clk := NewManualClock(time.Unix(0, 0))
	q, err := New(cfg, clk)
	if err != nil {
		b.Fatal(err)
	}
	q.SetHealthy(1)
	return q, clk
}

// cycleOpts varies what a cycle carries beyond the bare scheduling work.
type cycleOpts struct {
	deadlines bool // every request has a deadline (the deadline heap works)
	backfill  bool // actual cost differs from the estimate (back-fill re-keys)
}

// BenchmarkCycle measures one steady-state scheduling cycle with n
// backlogged tenants and the capacity full: release the oldest in-flight
// ticket (which dispatches the next request by tag) and enqueue a new
// request for a tenant, so the backlog stays constant. The observer is set,
// as the handler's metrics set it.
func BenchmarkCycle(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) { benchCycle(b, n, cycleOpts{}) })
	}
}

// BenchmarkCycleFull is BenchmarkCycle as production runs it: every request
// carries a deadline and completes with an actual cost other than its
// estimate.
func BenchmarkCycleFull(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true})
		})
	}
}

func benchCycle(b *testing.B, n int, o cycleOpts) {
	const capacity = 64
	q, clk := benchQueue(b, capacity)
	names := make([]string, n)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	// ring holds the in-flight tickets, oldest first from head; the
	// observer appends each dispatched ticket after the ring's end.
	ring := make([]*Ticket, 0, 2*capacity)
	q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventDispatched {
			ring = append(ring, tk)
		}
	})
	costOf := func(i int) int64 { return int64(50 + (i*7919)%2000) }
	request := func(i int) Request {
		r := Request{Tenant: names[i%n], Cost: costOf(i)}
		if o.deadlines {
			// Deadlines follow arrival order while dispatch follows tag
			// order, so dispatch removes tickets from anywhere in the
			// deadline heap.
			clk.Advance(time.Microsecond)
			r.Deadline = clk.Now().Add(time.Hour)
		}
		return r
	}
	// Enough queued requests per tenant to fill the capacity and keep every
	// tenant backlogged while some of its requests are in flight.
	depth := 2 + 2*capacity/n
	for r := 0; r < depth; r++ {
		for i := 0; i < n; i++ {
			if _, err := q.Enqueue(request(i + r*n)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if len(ring) != capacity {
		b.Fatalf("in flight %d, want %d", len(ring), capacity)
	}
	head := 0
	b.ReportAllocs()
	stop := startCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Release the oldest in-flight ticket; the one it dispatches is
		// appended by the observer and takes the freed ring slot.
		tk := ring[head]
		ring = ring[:capacity]
		actual := tk.cost
		if o.backfill {
			actual = actual * 3 / 4
		}
		tk.Release(actual)
		if len(ring) != capacity+1 {
			b.Fatalf("release dispatched %d tickets, want 1", len(ring)-capacity)
		}
		ring[head] = ring[capacity]
		if head++; head == capacity {
			head = 0
		}
		if _, err := q.Enqueue(request(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	stop()
}

// BenchmarkEnqueueIdle measures the fast path: a slot is free and nothing is
// queued, so Enqueue dispatches at once; Release frees the slot again.
func BenchmarkEnqueueIdle(b *testing.B) {
	q, _ := benchQueue(b, 64)
	names := make([]string, 100)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	stop := startCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tk, err := q.Enqueue(Request{Tenant: names[i%len(names)], Cost: 500})
		if err != nil {
			b.Fatal(err)
		}
		if tk.state != stateInflight {
			b.Fatal("not dispatched at once")
		}
		tk.Release(400)
	}
	b.StopTimer()
	stop()
}
