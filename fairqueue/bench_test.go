package fairqueue

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// benchQueue returns a queue with capacity slots in one upstream, no token
// cap and no queue caps, on a virtual clock.
func benchQueue(b testing.TB, capacity int) (*Queue, *ManualClock) {
	b.Helper()
	cfg := Config{
		MaxInflight: capacity,
		Classes:     []ClassConfig{{Name: "batch"}},
		Default:     TenantConfig{Weight: 1, Class: "batch"},
	}
	// The clock starts from time.Now, so its readings carry a monotonic
	// clock reading as RealClock's do: time arithmetic then takes the
	// path it takes in production (Time.Sub without a monotonic reading
	// is several times dearer).
	clk := NewManualClock(time.Now())
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
	declared  bool // the tenants are declared (top-level flows), not the undeclared group
	// account: a provider account (upstream_quota) that never binds;
	// tenantQuota: a tenant quota on every tenant that never binds.
	account, tenantQuota bool
	// mirror: the account on a quota.Mirror (Config.AccountStore).
	mirror bool
	// circuit: a circuit breaker that never trips (every arrival counted
	// on it, every completion's busy time learned, its saturation told).
	circuit bool
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

// BenchmarkCycleDeclared is BenchmarkCycleFull with declared tenants: the
// one-level path, where BenchmarkCycle and BenchmarkCycleFull schedule
// their (undeclared) tenants inside the group.
func BenchmarkCycleDeclared(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true})
		})
	}
}

// BenchmarkCycleAccount is BenchmarkCycleDeclared with quotas that never
// bind: a provider account every dispatch is charged to and reconciled
// with (upstream_quota), and a tenant quota on every tenant: what they add
// to a scheduling cycle.
func BenchmarkCycleAccount(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("tenants=%d/account", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, account: true})
		})
		b.Run(fmt.Sprintf("tenants=%d/account+tenant_quota", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, account: true, tenantQuota: true})
		})
	}
}

// BenchmarkCycleAccountStore is BenchmarkCycleAccount's account on the
// queue's in-process store (memory: a gateway alone) and on a
// quota.Mirror (mirror: the AccountStore a cluster sets, here over a
// Memory as its shared store): what the mirror's bookkeeping adds under
// the lock. Its Sync, made off the lock every sync interval, is not part
// of a cycle.
func BenchmarkCycleAccountStore(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("tenants=%d/memory", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, account: true})
		})
		b.Run(fmt.Sprintf("tenants=%d/mirror", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, account: true, mirror: true})
		})
	}
}

// BenchmarkCycleCircuit is BenchmarkCycleDeclared with a circuit
// breaker over the tenants' two tiers, and with it and a provider account
// (three resources): what the circuit adds to a scheduling cycle.
func BenchmarkCycleCircuit(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("tenants=%d/circuit", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, circuit: true})
		})
		b.Run(fmt.Sprintf("tenants=%d/circuit+account", n), func(b *testing.B) {
			benchCycle(b, n, cycleOpts{deadlines: true, backfill: true, declared: true, circuit: true, account: true})
		})
	}
}

func benchCycle(b *testing.B, n int, o cycleOpts) {
	const capacity = 64
	q, clk := benchQueue(b, capacity)
	if o.circuit {
		cfg := q.Config()
		cfg.Circuit = &degrade.CircuitConfig{Order: []string{"low", "high"}}
		cfg.Default.Tier = "low"
		if err := q.Reconfigure(cfg); err != nil {
			b.Fatal(err)
		}
	}
	if o.account || o.tenantQuota {
		cfg := q.Config()
		if o.account {
			cfg.UpstreamQuota = &UpstreamQuota{RPM: 6e10, TPM: 6e12}
		}
		if o.mirror {
			cfg.AccountStore = quota.NewMirror(quota.NewMemory(clk.Now), quota.MirrorOptions{Clock: clk.Now})
		}
		if o.tenantQuota {
			cfg.Default.Quota = quota.MustCompile(quota.Config{QPS: 1e8, TokensPerMin: 1e12})
		}
		if err := q.Reconfigure(cfg); err != nil {
			b.Fatal(err)
		}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	if o.declared {
		cfg := q.Config()
		cfg.Tenants = make(map[string]TenantConfig, n)
		for _, name := range names {
			cfg.Tenants[name] = cfg.Default
		}
		if err := q.Reconfigure(cfg); err != nil {
			b.Fatal(err)
		}
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

// BenchmarkIdleRequest is the queue's part of a request on a gateway with
// slots to spare, call for call as the handler makes them: PrecheckRequest
// before the body is read, Enqueue with the request's deadline (it starts
// at once), Wait, the ticket's accessors the handler reads, and Release
// with the actual cost, the observer set as the metrics set it.
func BenchmarkIdleRequest(b *testing.B) {
	q, clk := benchQueue(b, 64)
	events := 0
	q.SetObserver(func(ev Event, tk *Ticket) { events++ })
	names := make([]string, 100)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	deadline := clk.Now().Add(time.Minute) // the clock does not move
	ctx := context.Background()
	b.ReportAllocs()
	stop := startCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := names[i%len(names)]
		if rej := q.PrecheckRequest(Request{Tenant: name, Class: "batch", Bytes: 2000}); rej != nil {
			b.Fatal(rej)
		}
		tk, err := q.Enqueue(Request{Tenant: name, Class: "batch", Cost: 500, Prompt: 400,
			Deadline: deadline, Bytes: 2000})
		if err != nil {
			b.Fatal(err)
		}
		if err := tk.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		_ = tk.QuotaWait()
		if tk.Dispatched().Sub(tk.Enqueued()) != 0 || tk.Boosted() || tk.ETA() != 0 {
			b.Fatal("not dispatched at once")
		}
		if _, ok := tk.QuotaStatus(); ok {
			b.Fatal("charged to a quota")
		}
		tk.Release(450)
	}
	b.StopTimer()
	stop()
	if events != 2*b.N {
		b.Fatalf("%d events for %d requests", events, b.N)
	}
}

// BenchmarkMemory reports the heap bytes one queued request holds (its
// ticket and its share of the queue's structures, the body excluded:
// that is Request.Bytes) and one remembered idle tenant holds (undeclared,
// the one-shot case; its name included), each averaged over 100k.
func BenchmarkMemory(b *testing.B) {
	const n = 100000
	var perRequest, perTenant float64
	for range b.N {
		q, _ := benchQueue(b, 1)
		if _, err := q.Enqueue(Request{Tenant: "holder", Cost: 1}); err != nil { // takes the slot
			b.Fatal(err)
		}
		tks := make([]*Ticket, 0, n)
		names := make([]string, n)
		for i := range names {
			names[i] = "tenant-" + strconv.Itoa(i)
		}
		m0 := heapInUse()
		for range n {
			tk, err := q.Enqueue(Request{Tenant: "one", Cost: 100, Deadline: time.Unix(3600, 0)})
			if err != nil {
				b.Fatal(err)
			}
			tks = append(tks, tk)
		}
		m1 := heapInUse()
		for _, tk := range tks {
			tk.Release(0)
		}
		clear(tks)
		m2 := heapInUse()
		for _, name := range names {
			tk, err := q.Enqueue(Request{Tenant: name, Cost: 100})
			if err != nil {
				b.Fatal(err)
			}
			tk.Release(0) // cancelled: the tenant stays remembered, idle
		}
		m3 := heapInUse()
		if q.Stats(false).Remembered != n+2 {
			b.Fatalf("%d tenants remembered", q.Stats(false).Remembered)
		}
		perRequest = float64(int64(m1)-int64(m0)) / n
		perTenant = float64(int64(m3)-int64(m2)) / n
	}
	b.ReportMetric(perRequest, "B/queued-request")
	b.ReportMetric(perTenant, "B/tenant")
}
