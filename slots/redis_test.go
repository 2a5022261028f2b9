package slots

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// testBroker is a Broker on a pool of fixed size.
type testBroker struct {
	*Broker
	slots int
}

func newBroker(t *testing.T, slots int, ttl time.Duration) (*testBroker, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	return &testBroker{NewBroker(c, "fq:slots:{pool}", ttl), slots}, mr
}

var bg = context.Background()

func sync(t *testing.T, b *testBroker, inst string, demand, inflight int) int {
	t.Helper()
	g, err := b.Sync(bg, inst, b.slots, demand, inflight, 1)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Two gateways both wanting the whole pool converge to half each, and at
// no step may their grants and requests in flight add up past the pool.
func TestConvergeToFairShares(t *testing.T) {
	b, _ := newBroker(t, 8, 30*time.Second)
	steps := []struct {
		inst             string
		demand, inflight int
		want             int
	}{
		{"a", 20, 0, 8}, // alone: the whole pool
		{"b", 20, 0, 0}, // a holds it all
		{"a", 20, 8, 4}, // a's fair share; its 8 in flight stay
		{"b", 20, 0, 0}, // a still has 8 in flight
		{"a", 20, 4, 4}, // a completed down to its grant
		{"b", 20, 0, 4}, // b gets the rest
		{"b", 3, 3, 3},  // b wants less: a may have more
		{"a", 20, 4, 5}, // 8 less b's 3
	}
	for i, s := range steps {
		if g := sync(t, b, s.inst, s.demand, s.inflight); g != s.want {
			t.Fatalf("step %d (%s demand %d in flight %d): grant %d, want %d", i, s.inst, s.demand, s.inflight, g, s.want)
		}
	}
}

// A gateway that stops renewing (crashed) loses its slots after the TTL.
func TestCrashedGatewayExpires(t *testing.T) {
	b, mr := newBroker(t, 8, 2*time.Second)
	sync(t, b, "a", 8, 0)
	if g := sync(t, b, "b", 8, 0); g != 0 {
		t.Fatalf("b got %d while a holds the pool", g)
	}
	mr.SetTime(time.Date(2026, 11, 30, 0, 0, 2, 1e6, time.UTC))
	if g := sync(t, b, "b", 8, 0); g != 8 {
		t.Fatalf("b got %d after a's TTL, want the whole pool", g)
	}
	if err := b.Release(bg, "b"); err != nil {
		t.Fatal(err)
	}
	if g := sync(t, b, "c", 8, 0); g != 8 {
		t.Fatalf("c got %d after b released, want 8", g)
	}
}

// Three gateways with random demand, each dispatching up to its grant and
// completing at random, syncing in random order: the requests in flight
// over all of them never exceed the pool, and with steady demand every
// gateway ends at its fair share.
func TestNeverOverPool(t *testing.T) {
	const pool = 10
	b, _ := newBroker(t, pool, time.Minute)
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c"}
	inflight := map[string]int{}
	grant := map[string]int{}
	queued := map[string]int{}
	for step := 0; step < 3000; step++ {
		n := names[r.IntN(3)]
		queued[n] += r.IntN(4)
		// Complete some, dispatch up to the grant.
		done := r.IntN(inflight[n] + 1)
		inflight[n] -= done
		grant[n] = sync(t, b, n, inflight[n]+queued[n], inflight[n])
		for inflight[n] < grant[n] && queued[n] > 0 {
			inflight[n]++
			queued[n]--
		}
		total := 0
		for _, m := range names {
			total += inflight[m]
		}
		if total > pool {
			t.Fatalf("step %d: %d in flight over the gateways, pool %d (%v)", step, total, pool, inflight)
		}
	}
	// Steady demand well above the pool: the grants converge to 4/3/3, the
	// remainder slot to the first name.
	for round := 0; round < 4; round++ {
		for _, n := range names {
			inflight[n] = min(inflight[n], grant[n])
			grant[n] = sync(t, b, n, 100, inflight[n])
			inflight[n] = grant[n]
		}
	}
	sum := 0
	for _, n := range names {
		if want := map[string]int{"a": 4, "b": 3, "c": 3}[n]; grant[n] != want {
			t.Fatalf("grants %v, want a 4, b 3, c 3", grant)
		}
		sum += grant[n]
	}
	if sum != pool {
		t.Fatalf("grants %v add up to %d, want the pool %d", grant, sum, pool)
	}
}

// Weighted: gateways whose tenants weigh 2 and 1 share a pool of 6 as 4
// and 2 when both want it all, and a gateway wanting less than its part
// leaves the rest to the other.
func TestWeightedShares(t *testing.T) {
	b, _ := newBroker(t, 6, time.Minute)
	grant := map[string]int{}
	w := map[string]float64{"a": 2, "b": 1}
	for round := 0; round < 4; round++ {
		for _, n := range []string{"a", "b"} {
			g, err := b.Sync(bg, n, 6, 100, grant[n], w[n])
			if err != nil {
				t.Fatal(err)
			}
			grant[n] = g
		}
	}
	if grant["a"] != 4 || grant["b"] != 2 {
		t.Fatalf("grants %v, want a 4, b 2 (weights 2:1)", grant)
	}
	// b wants 1: a may have 5.
	g, _ := b.Sync(bg, "b", 6, 1, 1, 1)
	if g != 1 {
		t.Fatalf("b wanting 1 got %d", g)
	}
	if g, _ = b.Sync(bg, "a", 6, 100, 4, 2); g != 5 {
		t.Fatalf("a got %d, want the 5 b leaves", g)
	}
}

// What nobody demands is shared out on top of each demand: a lone idle
// gateway holds the whole pool for its next request, two split the spare
// by weight, and the moment one has demand the other's next sync leaves
// it room.
func TestIdleSlotsSharedOut(t *testing.T) {
	b, _ := newBroker(t, 8, time.Minute)
	if g := sync(t, b, "a", 0, 0); g != 8 {
		t.Fatalf("a lone idle gateway got %d of an empty pool of 8", g)
	}
	if g := sync(t, b, "b", 0, 0); g != 0 {
		t.Fatalf("b got %d while a holds the pool", g) // a still holds 8
	}
	if g := sync(t, b, "a", 0, 0); g != 4 {
		t.Fatalf("a got %d, want half the spare", g)
	}
	if g := sync(t, b, "b", 6, 0); g != 4 {
		t.Fatalf("b with demand 6 got %d while a holds 4", g)
	}
	if g := sync(t, b, "a", 0, 0); g != 1 {
		t.Fatalf("a idle got %d, want 1: half of the 2 spare (8 - b's 6)", g)
	}
}
