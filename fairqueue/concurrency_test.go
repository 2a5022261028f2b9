package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Test 13: many goroutines enqueue, wait with real contexts (some time out,
// some are cancelled, some carry deadlines), get promoted, panic or release,
// while another goroutine ticks, flips capacity, pauses a class and
// reconfigures. Every ticket ends exactly once, nothing is left queued or in
// flight, and TestMain checks that no goroutine leaks.
func TestConcurrentEveryTicketEndsOnce(t *testing.T) {
	clk := NewManualClock(t0)
	cfg := testConfig(3, map[string]float64{"t0": 3, "t1": 2})
	cfg.MaxQueue = 150
	cfg.MaxInflightTokens = 4000
	cfg.ExpiryMargin = 20 * time.Millisecond
	cfg.Tenants["t2"] = TenantConfig{Weight: 1, Class: "interactive", MaxQueue: 10}
	q, err := New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(2)

	var (
		mu         sync.Mutex
		dispatched = map[*Ticket]int{}
		ended      = map[*Ticket]Event{}
		problems   []string
	)
	q.SetObserver(func(ev Event, tk *Ticket) {
		mu.Lock()
		defer mu.Unlock()
		if ev == EventDispatched {
			if dispatched[tk]++; dispatched[tk] > 1 {
				problems = append(problems, "dispatched twice")
			}
			return
		}
		if prev, ok := ended[tk]; ok {
			problems = append(problems, fmt.Sprintf("ended twice: %v then %v", prev, ev))
		}
		if ev == EventReleased && dispatched[tk] == 0 {
			problems = append(problems, "released without dispatch")
		}
		if ev != EventReleased && dispatched[tk] != 0 {
			problems = append(problems, fmt.Sprintf("%v after dispatch", ev))
		}
		ended[tk] = ev
	})

	const workers, perWorker = 16, 150
	var (
		admitted sync.Map // *Ticket -> struct{}
		nAdmit   atomic.Int64
		nReject  atomic.Int64
		reasons  sync.Map // Reason -> *atomic.Int64
		waitOK   atomic.Int64
	)
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { // the handler's ticker, upstream health and config reloads
		defer bg.Done()
		rng := rand.New(rand.NewPCG(99, 1))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			clk.Advance(5 * time.Millisecond)
			q.Tick()
			switch rng.IntN(20) {
			case 0:
				n := 1 + rng.IntN(3)
				if rng.IntN(8) == 0 {
					n = 0 // every upstream down for a moment
				}
				q.SetHealthy(n)
			case 1:
				q.SetPaused("batch", rng.IntN(2) == 0)
			case 2:
				c := cfg
				c.MaxInflight = 1 + rng.IntN(4)
				if err := q.Reconfigure(c); err != nil {
					panic(err)
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perWorker; i++ {
				r := Request{Tenant: fmt.Sprint("t", rng.IntN(5)), Cost: 1 + rng.Int64N(1500)}
				if rng.IntN(3) == 0 {
					r.Deadline = clk.Now().Add(time.Duration(rng.IntN(100)) * time.Millisecond)
				}
				tk, err := q.Enqueue(r)
				if err != nil {
					var rej *Rejection
					if !errors.As(err, &rej) {
						panic(err)
					}
					nReject.Add(1)
					c, _ := reasons.LoadOrStore(rej.Reason, new(atomic.Int64))
					c.(*atomic.Int64).Add(1)
					time.Sleep(200 * time.Microsecond) // the client backs off
					continue
				}
				admitted.Store(tk, struct{}{})
				nAdmit.Add(1)
				if rng.IntN(10) == 0 {
					q.Promote(tk)
				}
				ctx, cancel := context.WithTimeout(context.Background(),
					time.Duration(rng.IntN(3000))*time.Microsecond)
				if rng.IntN(8) == 0 {
					go cancel() // the client goes away concurrently
				}
				serve := func() {
					defer tk.Release(UnknownCost) // the handler's safety net
					if err := tk.Wait(ctx); err != nil {
						return
					}
					waitOK.Add(1)
					if rng.IntN(50) == 0 {
						panic("handler panic")
					}
					runtime.Gosched()
					tk.Release(rng.Int64N(2000))
				}
				func() {
					defer func() { _ = recover() }()
					serve()
				}()
				cancel()
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	q.SetHealthy(2)
	q.SetPaused("batch", false)

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	n := 0
	admitted.Range(func(k, _ any) bool {
		n++
		if _, ok := ended[k.(*Ticket)]; !ok {
			t.Errorf("ticket of %s never ended", k.(*Ticket).Tenant())
		}
		return true
	})
	if len(ended) != n {
		t.Errorf("%d tickets ended, %d admitted", len(ended), n)
	}
	if s := q.Stats(false); s.Queued != 0 || s.Inflight != 0 || s.QueuedCost != 0 || s.InflightCost != 0 || s.BoostedInflight != 0 {
		t.Errorf("queue not empty at the end: %+v", s)
	}
	byReason := map[string]int64{}
	reasons.Range(func(k, v any) bool { byReason[k.(Reason).String()] = v.(*atomic.Int64).Load(); return true })
	t.Logf("%d admitted, %d rejected %v, %d dispatched and served", nAdmit.Load(), nReject.Load(), byReason, waitOK.Load())
	if waitOK.Load() == 0 {
		t.Errorf("setup: nothing was ever dispatched")
	}
}
