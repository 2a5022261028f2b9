package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

var bg = context.Background()

func miniClient(t *testing.T) (*redis.Client, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	return c, mr
}

// realClient is a client on the redis-server at $REDIS_ADDR, which the
// test script starts.
func realClient(t *testing.T) *redis.Client {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		t.Skip("REDIS_ADDR not set: no redis-server to test against")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(bg).Err(); err != nil {
		t.Fatalf("REDIS_ADDR=%s: %v", addr, err)
	}
	return c
}

func swap(t *testing.T, x *Exchange, mine ...fairqueue.Served) []fairqueue.Served {
	t.Helper()
	got, err := x.Swap(bg, mine, nil)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b fairqueue.Served) int {
		if a.Tenant < b.Tenant {
			return -1
		}
		if a.Tenant > b.Tenant {
			return 1
		}
		return 0
	})
	return got
}

func testSwap(t *testing.T, c redis.UniversalClient, key string) {
	a := NewExchange(c, key, "gw-a", time.Minute)
	b := NewExchange(c, key, "gw-b", time.Minute)
	// a's first call writes, reads nothing; b joins after: a's first
	// entry is history to it.
	if got := swap(t, a, fairqueue.Served{Tenant: "t1", Cost: 100}); len(got) != 0 {
		t.Fatalf("a's first swap read %v, want nothing", got)
	}
	if got := swap(t, b); len(got) != 0 {
		t.Fatalf("b's first swap read %v, want nothing (service before it joined)", got)
	}
	if got := swap(t, a, fairqueue.Served{Tenant: "t1", Cost: 50}, fairqueue.Served{Tenant: "g", Cost: -20.5}, fairqueue.Served{Tenant: "t:x", Cost: 1}); len(got) != 0 {
		t.Fatalf("a read %v, want nothing: its own entries are skipped", got)
	}
	// Tenants named like the entry's own fields are tenants all the same.
	got := swap(t, b, fairqueue.Served{Tenant: "t2", Cost: 7})
	if want := []fairqueue.Served{{Tenant: "g", Cost: -20.5}, {Tenant: "t1", Cost: 50}, {Tenant: "t:x", Cost: 1}}; !slices.Equal(got, want) {
		t.Fatalf("b read %v, want %v", got, want)
	}
	got = swap(t, b, fairqueue.Served{Tenant: "t2", Cost: 1})
	if want := []fairqueue.Served{}; !slices.Equal(got, want) {
		t.Fatalf("b read %v on its second swap, want nothing new", got)
	}
	got = swap(t, a)
	if want := []fairqueue.Served{{Tenant: "t2", Cost: 7}, {Tenant: "t2", Cost: 1}}; len(got) != 2 || got[0].Cost+got[1].Cost != 8 {
		t.Fatalf("a read %v, want b's two entries %v", got, want)
	}
	// Entries between b's previous read and now: a's second.
	c2 := NewExchange(c, key, "gw-c", time.Minute)
	swap(t, c2)
	swap(t, a, fairqueue.Served{Tenant: "t3", Cost: 3})
	got = swap(t, b)
	if want := []fairqueue.Served{{Tenant: "t3", Cost: 3}}; !slices.Equal(got, want) {
		t.Fatalf("b read %v, want %v", got, want)
	}
	if got := swap(t, c2); !slices.Equal(got, []fairqueue.Served{{Tenant: "t3", Cost: 3}}) {
		t.Fatalf("c read %v, want a's last entry only", got)
	}
	// A tenant named like nothing special, and many in one interval:
	// split into entries, every one read.
	var many []fairqueue.Served
	for i := range 2*entryMax + 5 {
		many = append(many, fairqueue.Served{Tenant: fmt.Sprintf("m%05d", i), Cost: 1})
	}
	swap(t, a, many...)
	got = swap(t, b)
	if len(got) != len(many) {
		t.Fatalf("b read %d tenants, want %d", len(got), len(many))
	}
	if ttl := c.PTTL(bg, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("stream TTL %v, want within the exchange's minute", ttl)
	}
}

func TestSwapMiniredis(t *testing.T) {
	c, _ := miniClient(t)
	testSwap(t, c, "fq:shares:{q}")
}

func TestSwapRealRedis(t *testing.T) {
	c := realClient(t)
	key := fmt.Sprintf("fq:test:shares:{%d}", time.Now().UnixNano())
	t.Cleanup(func() { c.Del(bg, key) })
	testSwap(t, c, key)
}

// joinedPair is two gateways' ends of stream "k" on miniredis, both past
// their first call.
func joinedPair(t *testing.T) (c *redis.Client, mr *miniredis.Miniredis, a, b *Exchange) {
	t.Helper()
	c, mr = miniClient(t)
	a, b = NewExchange(c, "k", "a", time.Minute), NewExchange(c, "k", "b", time.Minute)
	swap(t, a)
	swap(t, b)
	return c, mr, a, b
}

// The stream is capped: a gateway that lags more than MaxLen entries
// loses the oldest, never reads one twice, and catches up.
func TestSwapLagged(t *testing.T) {
	c, _, _, b := joinedPair(t)
	pipe := c.Pipeline()
	for range MaxLen + 50 {
		pipe.XAdd(bg, &redis.XAddArgs{Stream: "k", MaxLen: MaxLen, Approx: true, Values: []any{gatewayField, "a", tenantPrefix + "t", "1"}})
	}
	if _, err := pipe.Exec(bg); err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for range 20 {
		for _, s := range swap(t, b) {
			total += s.Cost
		}
	}
	if total > MaxLen+50 || total < ReadMax {
		t.Fatalf("b read %v of %d entries, want at most all and at least one read's worth", total, MaxLen+50)
	}
	if got := swap(t, b); len(got) != 0 {
		t.Fatalf("caught up, b read %v more", got)
	}
}

// Redis down: an error, nothing read, and the next call after it returns
// works.
func TestSwapRedisDown(t *testing.T) {
	_, mr, a, b := joinedPair(t)
	mr.SetError("LOADING")
	if _, err := b.Swap(bg, []fairqueue.Served{{Tenant: "t", Cost: 1}}, nil); err == nil {
		t.Fatal("Swap with Redis failing: no error")
	}
	mr.SetError("")
	swap(t, a, fairqueue.Served{Tenant: "t", Cost: 2})
	if got := swap(t, b); !slices.Equal(got, []fairqueue.Served{{Tenant: "t", Cost: 2}}) {
		t.Fatalf("after the outage b read %v, want a's entry", got)
	}
}

// BenchmarkSwap: one sync of a gateway that charged 64 tenants, reading
// the entry of one other gateway, against miniredis (the round trip on
// a real Redis is what the e2e measures).
func BenchmarkSwap(b *testing.B) {
	mr := miniredis.RunT(b)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	x := NewExchange(c, "k", "a", time.Minute)
	y := NewExchange(c, "k", "b", time.Minute)
	var mine []fairqueue.Served
	for i := range 64 {
		mine = append(mine, fairqueue.Served{Tenant: fmt.Sprintf("tenant-%d", i), Cost: 100})
	}
	var buf []fairqueue.Served
	b.ReportAllocs()
	for b.Loop() {
		if _, err := y.Swap(bg, mine, nil); err != nil {
			b.Fatal(err)
		}
		var err error
		if buf, err = x.Swap(bg, nil, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// The undeclared tenants' group travels as its own field (no caller's
// name in the stream), and the stream holds no entry older than the TTL
// by Redis's clock once a gateway has read one: it is bounded by time,
// whatever the names.
func TestSwapGroupAndTrimByTime(t *testing.T) {
	c := realClient(t)
	key := fmt.Sprintf("fq:test:%d:stream{shares}", time.Now().UnixNano())
	t.Cleanup(func() { c.Del(bg, key) })
	const ttl = 300 * time.Millisecond
	a, b := NewExchange(c, key, "a", ttl), NewExchange(c, key, "b", ttl)
	swap(t, a)
	swap(t, b)
	swap(t, a, fairqueue.Served{Tenant: "vip", Cost: 2}, fairqueue.Served{Group: true, Cost: 5})
	got := swap(t, b)
	if len(got) != 2 || got[0] != (fairqueue.Served{Group: true, Cost: 5}) || got[1] != (fairqueue.Served{Tenant: "vip", Cost: 2}) {
		t.Fatalf("b read %v, want the group's 5 and vip's 2", got)
	}
	for _, m := range c.XRange(bg, key, "-", "+").Val() {
		for f := range m.Values {
			if f != gatewayField && f != groupField && f != tenantPrefix+"vip" {
				t.Errorf("the stream holds field %q", f)
			}
		}
	}
	// Entries keep coming past the TTL: the old ones go.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		swap(t, a, fairqueue.Served{Tenant: "vip", Cost: 1})
		swap(t, b, fairqueue.Served{Tenant: "vip", Cost: 1})
		time.Sleep(20 * time.Millisecond)
	}
	msgs := c.XRange(bg, key, "-", "+").Val()
	first, _ := idMillis(msgs[0].ID)
	last, _ := idMillis(msgs[len(msgs)-1].ID)
	// MINID trims approximately (whole macro nodes): allow a node's worth.
	if age := time.Duration(last-first) * time.Millisecond; age > 2*ttl+time.Second && len(msgs) > 100 {
		t.Errorf("the stream spans %v (%d entries), want about the TTL %v", age, len(msgs), ttl)
	}
}
