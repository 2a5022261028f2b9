package cluster

import (
	"fmt"
	"math/rand/v2"
	"os"
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

// backend is a Redis the tests run sync.lua on: miniredis (gopher-lua, a
// clock the test sets) always, and the redis-server at $REDIS_ADDR (its
// own Lua 5.1 and TIME; scripts/test.sh starts one) when that is set, as
// quota's tests do.
type backend struct {
	name string
	mr   *miniredis.Miniredis // nil: the real server
	c    *redis.Client
	// key is the pool's key: one of its own on the real server, which
	// other tests share.
	key string
	// start is the backend's time when the test began: miniredis's is
	// set to it, the real server's is read.
	start time.Time
}

// onBackends runs test on miniredis and, with $REDIS_ADDR, on the real
// server, each as a subtest.
func onBackends(t *testing.T, test func(*testing.T, *backend)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		start := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
		mr.SetTime(start)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { c.Close() })
		test(t, &backend{name: "miniredis", mr: mr, c: c, key: "fq:slots:{pool}", start: start})
	})
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		return
	}
	t.Run("redis-server", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		now, err := c.Time(bg).Result()
		if err != nil {
			t.Fatalf("REDIS_ADDR=%s: %v", addr, err)
		}
		be := &backend{name: "redis-server", c: c, key: fmt.Sprintf("fq:slots:{test-%d-%d}", now.UnixNano(), rand.Uint32()), start: now}
		t.Cleanup(be.flush)
		test(t, be)
	})
}

// advanceTo moves the backend's clock to at: miniredis's is set, the real
// server's is waited for (its TIME polled: the event is Redis's own clock
// passing at, however slow the machine).
func (be *backend) advanceTo(t *testing.T, at time.Time) {
	t.Helper()
	if be.mr != nil {
		be.mr.SetTime(at)
		return
	}
	for limit := time.Now().Add(time.Until(at) + 30*time.Second); ; time.Sleep(10 * time.Millisecond) {
		now, err := be.c.Time(bg).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !now.Before(at) {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("waited for the redis-server's TIME to reach %v: it reads %v", at, now)
		}
	}
}

// flush forgets the pool, as a restart without persistence does: every
// key on miniredis, the pool's keys on the real server.
func (be *backend) flush() {
	if be.mr != nil {
		be.mr.FlushAll()
		return
	}
	keys, _ := be.c.Keys(bg, be.key+"*").Result()
	if len(keys) > 0 {
		be.c.Del(bg, keys...)
	}
}

func (be *backend) hkeys(t *testing.T, key string) []string {
	t.Helper()
	fields, err := be.c.HKeys(bg, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return fields
}

func newBroker(t *testing.T, be *backend, slots int, ttl time.Duration) *testBroker {
	t.Helper()
	return &testBroker{NewBroker(be.c, be.key, ttl), slots}
}

func syncGrant(t *testing.T, b *testBroker, inst string, demand, inflight int) int {
	t.Helper()
	g, err := b.Sync(bg, Renewal{Instance: inst, Slots: b.slots, Demand: demand, Holding: inflight, Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	return g.Slots
}

// Two gateways both wanting the whole pool converge to half each, and at
// no step may their grants and requests in flight add up past the pool.
func TestConvergeToFairShares(t *testing.T) { onBackends(t, testConvergeToFairShares) }

func testConvergeToFairShares(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, 30*time.Second)
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
		if g := syncGrant(t, b, s.inst, s.demand, s.inflight); g != s.want {
			t.Fatalf("step %d (%s demand %d in flight %d): grant %d, want %d", i, s.inst, s.demand, s.inflight, g, s.want)
		}
	}
}

// A gateway that stops renewing (crashed) loses its slots after the TTL.
func TestCrashedGatewayExpires(t *testing.T) { onBackends(t, testCrashedGatewayExpires) }

func testCrashedGatewayExpires(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, 2*time.Second)
	syncGrant(t, b, "a", 8, 0)
	if g := syncGrant(t, b, "b", 8, 0); g != 0 {
		t.Fatalf("b got %d while a holds the pool", g)
	}
	be.advanceTo(t, be.start.Add(2*time.Second+time.Millisecond))
	if g := syncGrant(t, b, "b", 8, 0); g != 8 {
		t.Fatalf("b got %d after a's TTL, want the whole pool", g)
	}
	if err := b.Release(bg, "b"); err != nil {
		t.Fatal(err)
	}
	if g := syncGrant(t, b, "c", 8, 0); g != 8 {
		t.Fatalf("c got %d after b released, want 8", g)
	}
}

// Three gateways with random demand, each dispatching up to its grant and
// completing at random, syncing in random order: the requests in flight
// over all of them never exceed the pool, and with steady demand every
// gateway ends at its fair share.
func TestNeverOverPool(t *testing.T) { onBackends(t, testNeverOverPool) }

func testNeverOverPool(t *testing.T, be *backend) {
	const pool = 10
	b := newBroker(t, be, pool, time.Minute)
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
		grant[n] = syncGrant(t, b, n, inflight[n]+queued[n], inflight[n])
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
			grant[n] = syncGrant(t, b, n, 100, inflight[n])
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
func TestWeightedShares(t *testing.T) { onBackends(t, testWeightedShares) }

func testWeightedShares(t *testing.T, be *backend) {
	b := newBroker(t, be, 6, time.Minute)
	grant := map[string]int{}
	w := map[string]float64{"a": 2, "b": 1}
	for round := 0; round < 4; round++ {
		for _, n := range []string{"a", "b"} {
			g, err := b.Sync(bg, Renewal{Instance: n, Slots: 6, Demand: 100, Holding: grant[n], Weight: w[n]})
			if err != nil {
				t.Fatal(err)
			}
			grant[n] = g.Slots
		}
	}
	if grant["a"] != 4 || grant["b"] != 2 {
		t.Fatalf("grants %v, want a 4, b 2 (weights 2:1)", grant)
	}
	// b wants 1: a may have 5.
	g, _ := b.Sync(bg, Renewal{Instance: "b", Slots: 6, Demand: 1, Holding: 1, Weight: 1})
	if g.Slots != 1 {
		t.Fatalf("b wanting 1 got %d", g.Slots)
	}
	if g, _ = b.Sync(bg, Renewal{Instance: "a", Slots: 6, Demand: 100, Holding: 4, Weight: 2}); g.Slots != 5 {
		t.Fatalf("a got %d, want the 5 b leaves", g.Slots)
	}
}

// What nobody demands is shared out on top of each demand: a lone idle
// gateway holds the whole pool for its next request, two split the spare
// by weight, and the moment one has demand the other's next sync leaves
// it room.
func TestIdleSlotsSharedOut(t *testing.T) { onBackends(t, testIdleSlotsSharedOut) }

func testIdleSlotsSharedOut(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, time.Minute)
	if g := syncGrant(t, b, "a", 0, 0); g != 8 {
		t.Fatalf("a lone idle gateway got %d of an empty pool of 8", g)
	}
	if g := syncGrant(t, b, "b", 0, 0); g != 0 {
		t.Fatalf("b got %d while a holds the pool", g) // a still holds 8
	}
	if g := syncGrant(t, b, "a", 0, 0); g != 4 {
		t.Fatalf("a got %d, want half the spare", g)
	}
	if g := syncGrant(t, b, "b", 6, 0); g != 4 {
		t.Fatalf("b with demand 6 got %d while a holds 4", g)
	}
	if g := syncGrant(t, b, "a", 0, 0); g != 1 {
		t.Fatalf("a idle got %d, want 1: half of the 2 spare (8 - b's 6)", g)
	}
}

// A sync announces what others should act on at once: a weight that grew
// (their fair shares fell) and slots freed (a gateway owed some may take
// them); a sync that changes neither says nothing. Grant.Fair shows a
// gateway owed slots that the others still hold.
func TestMovesAnnounced(t *testing.T) { onBackends(t, testMovesAnnounced) }

func testMovesAnnounced(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, time.Minute)
	moves := b.Moves()
	t.Cleanup(func() { moves.Close() })
	listening, ch := make(chan struct{}), make(chan Move, 16)
	go moves.Follow(func() { close(listening) }, func(mv Move) { ch <- mv })
	select {
	case <-listening: // the subscription's confirmation
	case <-time.After(30 * time.Second):
		t.Fatal("no confirmation of the subscription")
	}
	// next is the next announcement. That none was made is shown by the
	// next one being the one made after it (a channel delivers in order),
	// not by a silence of so many milliseconds.
	next := func() (Move, bool) {
		select {
		case mv := <-ch:
			return mv, true
		case <-time.After(30 * time.Second):
			return Move{}, false
		}
	}
	sy := func(inst string, demand, holding int, w float64) Grant {
		t.Helper()
		g, err := b.Sync(bg, Renewal{Instance: inst, Slots: 8, Demand: demand, Holding: holding, Weight: w})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	sy("a", 20, 0, 1)
	sy("b", 20, 0, 1)
	sy("a", 20, 8, 1) // a holds the pool, b waits for it
	if g := sy("b", 20, 0, 1); g.Slots != 0 || g.Fair != 4 || g.Announced != "" {
		t.Fatalf("b: %+v, want 0 slots of a fair 4, and nothing announced (no weight up, nothing freed)", g)
	}
	// a completes one request: it holds 7, and says so; that is the
	// first announcement.
	if g := sy("a", 20, 7, 1); g.Announced != "freed" {
		t.Fatalf("a's sync announced %q, want freed", g.Announced)
	}
	if mv, ok := next(); !ok || mv.Kind != Freed || mv.Instance != "a" {
		t.Fatalf("the first announcement: %+v (%v), want a's freed slot (none before it: no weight up, nothing freed)", mv, ok)
	}
	if g := sy("b", 20, 0, 1); g.Slots != 1 {
		t.Fatalf("b took %d slots, want the 1 a freed", g.Slots)
	}
	// A heavy tenant queues on b: its claim goes out, and a's fair share
	// falls to what the weights give.
	if g := sy("b", 20, 1, 9); g.Announced != "claim" {
		t.Fatalf("b's sync announced %q, want claim", g.Announced)
	}
	if mv, ok := next(); !ok || mv.Kind != Claim || mv.Instance != "b" {
		t.Fatalf("after b's weight grew: %+v (%v), want b's claim", mv, ok)
	}
	if g := sy("a", 20, 7, 1); g.Fair != 1 || g.Slots != 1 {
		t.Fatalf("a after b's claim: %+v, want a fair and granted 1", g)
	}
	// A weight that grows where the grant covers the demand claims
	// nothing.
	if g := sy("a", 1, 1, 1); g.Announced != "freed" {
		t.Fatalf("a down to 1: announced %q, want freed", g.Announced)
	}
	next()
	if g := sy("a", 1, 1, 50); g.Announced != "" || g.Slots < 1 {
		t.Fatalf("a's weight up with its demand of 1 granted: %+v, want no announcement", g)
	}
	// a completes its request: the next announcement is that, not one
	// of the weight above.
	if g := sy("a", 0, 0, 50); g.Announced != "freed" {
		t.Fatalf("a done: announced %q, want freed", g.Announced)
	}
	if mv, ok := next(); !ok || mv.Kind != Freed || mv.Instance != "a" {
		t.Fatalf("after a's weight went up with no gateway owed, then a freed its slot: %+v (%v), want a's freed alone", mv, ok)
	}
	if _, ok := parseMove("moved a"); ok {
		t.Fatal("parseMove accepted an unknown kind")
	}
}

// The slot left over by rounding goes to the largest fraction, not to the
// first name: a gateway whose tenants outweigh the other's gets a pool of
// one, whatever the names.
func TestRemainderToLargestFraction(t *testing.T) { onBackends(t, testRemainderToLargestFraction) }

func testRemainderToLargestFraction(t *testing.T, be *backend) {
	b := newBroker(t, be, 1, time.Minute)
	if _, err := b.Sync(bg, Renewal{Instance: "a", Slots: 1, Demand: 1, Holding: 1, Weight: 1}); err != nil { // a holds the slot
		t.Fatal(err)
	}
	if g, _ := b.Sync(bg, Renewal{Instance: "z", Slots: 1, Demand: 1, Holding: 0, Weight: 9}); g.Fair != 1 || g.Slots != 0 {
		t.Fatalf("z, weight 9 against 1: %+v, want a fair share of 1, held by a", g)
	}
	if g, _ := b.Sync(bg, Renewal{Instance: "a", Slots: 1, Demand: 1, Holding: 1, Weight: 1}); g.Fair != 0 || g.Slots != 0 {
		t.Fatalf("a, weight 1 against 9: %+v, want nothing", g)
	}
}

// A sync with loads learns what the other live gateways have in flight on
// each upstream, so that a gateway spreads its requests by the cluster's
// load; a gateway whose entry lapsed or was released no longer counts.
func TestUpstreamLoadsShared(t *testing.T) { onBackends(t, testUpstreamLoadsShared) }

func testUpstreamLoadsShared(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, 2*time.Second)
	sy := func(inst string, loads ...Load) Grant {
		t.Helper()
		g, err := b.Sync(bg, Renewal{Instance: inst, Slots: 8, Demand: 8, Holding: 4, Weight: 1, Loads: loads})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	sy("a", Load{"u1:80", 3, 4}, Load{"u2:80", 1, 4})
	sy("c", Load{"u1:80", 1, 4}, Load{"u2:80", 0, 4})
	g := sy("b", Load{"u1:80", 0, 4}, Load{"u2:80", 2, 4}, Load{"u3:80", 0, 4})
	want := map[string]int{"u1:80": 4, "u2:80": 1, "u3:80": 0}
	if len(g.Others) != len(want) {
		t.Fatalf("others %v, want %v", g.Others, want)
	}
	for u, n := range want {
		if g.Others[u] != n {
			t.Fatalf("others %v, want %v", g.Others, want)
		}
	}
	if err := b.Release(bg, "c"); err != nil {
		t.Fatal(err)
	}
	if g = sy("b", Load{"u1:80", 0, 4}); g.Others["u1:80"] != 3 {
		t.Fatalf("after c released: others %v, want u1:80 3 (a's)", g.Others)
	}
	be.advanceTo(t, be.start.Add(3*time.Second)) // a's entry lapses
	if g = sy("b", Load{"u1:80", 0, 4}); g.Others["u1:80"] != 0 {
		t.Fatalf("after a lapsed: others %v, want none", g.Others)
	}
	if fields := be.hkeys(t, be.key+":up"); len(fields) != 1 || fields[0] != "b" {
		t.Fatalf("upstream loads kept for %v, want b's alone", fields)
	}
	if g = sy("b"); g.Others != nil {
		t.Fatalf("a sync without loads got others %v", g.Others)
	}
}

// Fresh tells a gateway that the pool held no entry of its own: its first
// call, and after Redis lost the pool (a restart without persistence).
func TestFresh(t *testing.T) { onBackends(t, testFresh) }

func testFresh(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, time.Minute)
	for i, want := range []bool{true, false} {
		if g, err := b.Sync(bg, Renewal{Instance: "a", Slots: 8, Demand: 1, Holding: 0, Weight: 1}); err != nil || g.Fresh != want {
			t.Fatalf("call %d: %+v %v, want Fresh %v", i, g, err, want)
		}
	}
	be.flush()
	if g, err := b.Sync(bg, Renewal{Instance: "a", Slots: 8, Demand: 1, Holding: 0, Weight: 1}); err != nil || !g.Fresh {
		t.Fatalf("after the pool was lost: %+v %v, want Fresh", g, err)
	}
}

// Renewed counts the other live gateways that renewed since a time of an
// earlier call (Grant.Now): how a gateway back from an outage, or finding
// the pool lost, learns that every other one has renewed and that Redis
// counts what they hold again. An entry of an earlier version, without
// its renewal time, holds its slots but never counts as renewed.
func TestRenewedSince(t *testing.T) { onBackends(t, testRenewedSince) }

func testRenewedSince(t *testing.T, be *backend) {
	b := newBroker(t, be, 8, time.Minute)
	at := be.start
	sy := func(inst string, since int64) Grant {
		t.Helper()
		g, err := b.Sync(bg, Renewal{Instance: inst, Slots: 8, Demand: 1, Holding: 1, Weight: 1, Since: since})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, inst := range []string{"a", "b", "c"} {
		sy(inst, 0)
	}
	be.advanceTo(t, at.Add(time.Second))
	since := sy("a", 0).Now
	// Redis's time: exactly on miniredis's set clock, at least it on a
	// real one.
	if want := at.Add(time.Second).UnixMilli(); since < want || (be.mr != nil && since != want) {
		t.Fatalf("Now = %d, want Redis's time %d", since, want)
	}
	if g := sy("a", since); g.Renewed != 0 {
		t.Fatalf("nobody else renewed since: Renewed = %d", g.Renewed)
	}
	sy("b", 0)
	if g := sy("a", since); g.Renewed != 1 {
		t.Fatalf("b renewed: Renewed = %d, want 1", g.Renewed)
	}
	sy("c", 0)
	if g := sy("a", since); g.Renewed != 2 {
		t.Fatalf("b and c renewed: Renewed = %d, want 2", g.Renewed)
	}
	if g := sy("a", 0); g.Renewed != 0 {
		t.Fatalf("not asked: Renewed = %d, want 0", g.Renewed)
	}
	exp := at.Add(time.Hour).UnixMilli()
	if err := be.c.HSet(bg, be.key, "old", fmt.Sprintf("5,5,5,1000,%d", exp)).Err(); err != nil {
		t.Fatal(err)
	}
	if g := sy("a", since); g.Renewed != 2 || g.Slots > 8-5-2 {
		t.Fatalf("with an entry of an earlier version holding 5: Renewed = %d, grant %d; want 2 and at most 1 (b and c hold 1 each at least)", g.Renewed, g.Slots)
	}
}

// Targets place each gateway's grant where the others leave room: over
// random renewals of three gateways, each keeping its requests in flight
// on each upstream within its last target (as fair_queue_least_conn
// places them), and dispatching during the renewal's round trip, by its
// last target, as many as it holds beyond its requests in flight, no
// upstream is ever held past its slots by all of them together, and a
// gateway with the pool to itself spreads it evenly. (Without the
// dispatches during the call counted, a renewal's new target could leave
// them where another gateway was just given room.)
func TestTargetsNeverOverUpstream(t *testing.T) { onBackends(t, testTargetsNeverOverUpstream) }

func testTargetsNeverOverUpstream(t *testing.T, be *backend) {
	const ups, per = 3, 4 // three upstreams of 4 slots: a pool of 12
	b := newBroker(t, be, ups*per, time.Minute)
	names := []string{"a", "b", "c"}
	target := map[string][]int{}
	inflight := map[string][]int{}
	capacity := map[string]int{}
	for _, n := range names {
		target[n], inflight[n] = make([]int, ups), make([]int, ups)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	during := 0 // requests dispatched during a renewal's round trip
	for step := range 3000 {
		n := names[rng.IntN(len(names))]
		loads := make([]Load, ups)
		total := 0
		for u := range ups {
			// Requests complete, and new ones go within the target.
			inflight[n][u] = rng.IntN(max(target[n][u], inflight[n][u]) + 1)
			total += inflight[n][u]
			loads[u] = Load{Upstream: fmt.Sprintf("u%d", u), Inflight: inflight[n][u], Slots: per}
		}
		holding := max(total, capacity[n])
		g, err := b.Sync(bg, Renewal{Instance: n, Slots: ups * per, Demand: 20, Holding: holding, Weight: float64(1 + rng.IntN(3)), Loads: loads})
		if err != nil {
			t.Fatal(err)
		}
		// Meanwhile it dispatched by its last targets, within what it
		// held (the others' renewals may come before it applies the new
		// ones: checked below as if they all did).
		spare := holding - total
		for _, u := range rng.Perm(ups) {
			k := rng.IntN(min(max(target[n][u]-inflight[n][u], 0), spare) + 1)
			inflight[n][u] += k
			spare -= k
			during += k
		}
		free := 0 // placements beyond the requests in flight when it called
		for u := range ups {
			target[n][u] = g.Targets[fmt.Sprintf("u%d", u)]
			free += max(target[n][u]-loads[u].Inflight, 0)
		}
		if free > max(g.Slots-total, 0) {
			t.Fatalf("step %d: %s's targets %v leave %d places beside %d in flight, past its grant %d", step, n, target[n], free, total, g.Slots)
		}
		capacity[n] = min(g.Slots, target[n][0]+target[n][1]+target[n][2])
		// Every upstream: the gateways' holds (target or in flight) within its slots.
		for u := range ups {
			held := 0
			for _, m := range names {
				held += max(target[m][u], inflight[m][u])
			}
			if held > per {
				t.Fatalf("step %d: upstream u%d held %d > %d slots (targets %v, in flight %v)", step, u, held, per, target, inflight)
			}
		}
	}
	if during == 0 {
		t.Fatal("no request was dispatched during a renewal: the case is not exercised")
	}
	// Alone with the pool: its grant spread over the three upstreams.
	be.flush()
	g, err := b.Sync(bg, Renewal{Instance: "z", Slots: ups * per, Demand: 6, Holding: 0, Weight: 1, Loads: []Load{{"u0", 0, per}, {"u1", 0, per}, {"u2", 0, per}}})
	if err != nil {
		t.Fatal(err)
	}
	for u, n := range g.Targets {
		if n < 2 {
			t.Fatalf("targets %v for a grant of %d over 3 empty upstreams, want at least 2 each (%s)", g.Targets, g.Slots, u)
		}
	}
}
