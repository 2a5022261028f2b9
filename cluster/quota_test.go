package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// newMiniredis starts a miniredis whose TIME and TTLs follow its SetTime
// clock, set to manualclock.Epoch, and a client on it without retries.
func newMiniredis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	mr := miniredis.RunT(t)
	mr.SetTime(manualclock.Epoch)
	mr.ClockTTL(true)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return mr, c
}

// newRedisHarness is a QuotaStore on miniredis for quotatest, its clock
// and miniredis's moved together.
func newRedisHarness(t *testing.T) *quotatest.Harness {
	mr, c := newMiniredis(t)
	clk := manualclock.New(manualclock.Epoch)
	set := func(at time.Time) {
		clk.Set(at)
		mr.SetTime(at)
	}
	held := func() int { return len(mr.Keys()) }
	return &quotatest.Harness{Store: NewQuotaStore(c, DefaultPrefix, 0), Res: time.Microsecond, Now: clk.Now, Set: set, Held: held, Remote: true}
}

// TestStoreSuite runs the store scenarios against quota.Memory, against a
// quota.Local whose primary (a Memory on the same clock) answers every call,
// and against the Redis store on miniredis, whose TIME follows SetTime and
// whose TTLs, with ClockTTL, run on the same clock: the Redis store must
// keep every guarantee the in-process ones do.
func TestStoreSuite(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		runStoreSuite(t, func(*testing.T) *quotatest.Harness { return quotatest.NewMemory() })
	})
	t.Run("local", func(t *testing.T) {
		runStoreSuite(t, func(*testing.T) *quotatest.Harness {
			h := quotatest.NewMemory()
			h.Store = quota.NewLocal(h.Store, quota.NewMemory(h.Now), quota.LocalOptions{Clock: h.Now})
			return h
		})
	})
	t.Run("redis", func(t *testing.T) { runStoreSuite(t, newRedisHarness) })
}

// diffLimits are the configurations of the differential tests: the seed's,
// each single meter, fractional intervals (3 qps: 333333333.3 ns per
// request), extreme rates, and last a slow one whose charges exceed 2^53 ns
// (104 days) or hit the cap of 2^60 ns, where float arithmetic on
// nanoseconds would not be exact.
func diffLimits() []*quota.Limits {
	ls := []*quota.Limits{
		quota.MustCompile(quotatest.SeedCfg),
		quota.MustCompile(quota.Config{QPS: 3, TokensPerMin: 7000, TokenToQPSWeight: 0.0013, JointCap: 0.7, BurstWindow: 3 * time.Second, BurstAllow: 0.37}),
		quota.MustCompile(quota.Config{TokensPerMin: 1e13}),
		quota.MustCompile(quota.Config{QPS: 1e9}),
		// Joint binds: a 1000-token request is 11 request-equivalents of
		// 100 per second, no burst.
		quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1}),
	}
	for _, mc := range quotatest.MeterCases() {
		ls = append(ls, mc.Lim)
	}
	return append(ls, quota.MustCompile(quota.Config{QPS: 1e-6, TokensPerMin: 6e-5, BurstWindow: 24 * time.Hour, BurstAllow: 100}))
}

// sameDecision compares two decisions field by field (At as an instant).
func sameDecision(a, b quota.Decision) bool {
	return a.Allowed == b.Allowed && a.At.Equal(b.At) && a.RetryAfter == b.RetryAfter && a.Reason == b.Reason && a.Status == b.Status
}

// randomOp is one step of a differential trace.
type randomOp struct {
	kind     int // 0 charge, 1 peek, 2 reconcile, 3 status, 4 book
	maxWait  time.Duration
	lead     time.Duration
	tenant   string
	lim      *quota.Limits
	tokens   int64 // charged, or actual when reconciling
	estimate int64
	ahead    quota.Backlog
}

// nextOp draws a call: each configuration has two tenants of its own, one
// call in 20 is made with another configuration (a reload; never the slow
// last one, whose debts would block a tenant for days), one in 40 charges
// 2^40 tokens to a tenant kept for such charges. Reconciles stay small, and
// refund only on the slow configuration: extra debt is not bounded by the
// conformance test, and Memory's int64 would overflow after centuries of
// it (the script clamps instead).
func nextOp(rng *rand.Rand, ls []*quota.Limits) randomOp {
	li := rng.IntN(len(ls))
	op := randomOp{
		kind:     rng.IntN(5),
		maxWait:  time.Duration(rng.IntN(5000)) * time.Millisecond,
		lead:     time.Duration(rng.IntN(3)*rng.IntN(1000)) * time.Millisecond,
		tenant:   "t" + strconv.Itoa(li) + "-" + strconv.Itoa(rng.IntN(2)),
		lim:      ls[li],
		tokens:   int64(rng.IntN(2000)),
		estimate: int64(rng.IntN(3000)),
	}
	if rng.IntN(20) == 0 {
		op.lim = ls[rng.IntN(len(ls)-1)]
	}
	switch {
	case op.kind == 0 && rng.IntN(40) == 0:
		op.tokens = 1 << 40
		op.tenant = "huge" + strconv.Itoa(li)
	case op.kind == 0 && rng.IntN(40) == 0:
		op.tokens = 20000
	case op.kind == 2 && li == len(ls)-1:
		op.tokens = min(op.tokens, op.estimate)
	}
	if rng.IntN(2) == 0 {
		op.ahead = quota.Backlog{Requests: int64(rng.IntN(50)), Tokens: int64(rng.IntN(50000))}
	}
	return op
}

// apply runs op on s and renders its result for comparison.
func apply(t testing.TB, s quota.Store, op randomOp) (quota.Decision, error) {
	switch op.kind {
	case 0:
		return s.Charge(bg, op.tenant, op.lim, op.tokens)
	case 1:
		return s.Peek(bg, op.tenant, op.lim, op.ahead)
	case 2:
		st, err := s.Reconcile(bg, op.tenant, op.lim, op.estimate, op.tokens)
		return quota.Decision{Status: st}, err
	case 4:
		return s.Book(bg, op.tenant, op.lim, op.tokens, op.maxWait, op.lead)
	}
	st, err := s.Status(bg, op.tenant, op.lim)
	return quota.Decision{Status: st}, err
}

// TestRedisMatchesMemory is the differential proof of exactness: 10000
// random calls (charges, peeks with backlogs, reconciles, status; three
// tenants; limits switched at random between the configurations of
// diffLimits, including charges beyond 2^53 ns) on Memory and on Redis,
// each at the same microsecond of a shared virtual clock, give identical
// results, field by field. Allowed, refused and every dimension binding
// are all seen.
func TestRedisMatchesMemory(t *testing.T) {
	mh := quotatest.NewMemory()
	rh := newRedisHarness(t)
	ls := diffLimits()
	rng := rand.New(rand.NewPCG(7, 8))
	seen := map[string]int{}
	for i := 0; i < 10000; i++ {
		if rng.IntN(3) == 0 {
			// Mostly small steps, sometimes long ones past a window.
			step := time.Duration(rng.IntN(20000)) * time.Microsecond
			if rng.IntN(100) == 0 {
				step = time.Duration(rng.IntN(600)) * time.Second
			}
			mh.Advance(step)
			rh.Advance(step)
		}
		op := nextOp(rng, ls)
		md, err := apply(t, mh.Store, op)
		if err != nil {
			t.Fatal(err)
		}
		rd, err := apply(t, rh.Store, op)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(md, rd) {
			t.Fatalf("call %d %+v at %v:\nmemory %+v\nredis  %+v", i, op, mh.Now(), md, rd)
		}
		if op.kind == 4 && md.Allowed && md.RetryAfter > 0 {
			seen["booked ahead"]++
		}
		if op.kind <= 1 || op.kind == 4 {
			if md.Allowed {
				seen["allowed"]++
			} else {
				seen[string(md.Reason)]++
			}
		}
	}
	for _, k := range []string{"allowed", "qps", "tokens", "joint", "booked ahead"} {
		if seen[k] < 100 {
			t.Errorf("only %d decisions %q in the trace, want at least 100 (%v)", seen[k], k, seen)
		}
	}
	t.Logf("decisions: %v", seen)
}

// TestRedisExpiry: a key's TTL is the time to rest rounded up to the
// millisecond plus the margin, exactly; the key is there 1 ms before and
// gone 1 ms after; a refund to rest deletes it; Peek and Status write
// nothing.
func TestRedisExpiry(t *testing.T) {
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, "p:", 0)
	r.margin = "250" // ms
	// 1500001 ns per request.
	l := quota.MustCompile(quota.Config{QPS: 1e9 / 1500001.0})
	if inc := l.Increment(quota.DimQPS, 0); inc != 1500001 {
		t.Fatalf("increment %v, want 1500001ns", inc)
	}
	if _, err := r.Peek(bg, "a", l, quota.Backlog{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Status(bg, "a", l); err != nil {
		t.Fatal(err)
	}
	if mr.Exists("p:t{a}") {
		t.Fatal("Peek or Status wrote a key")
	}
	if d, err := r.Charge(bg, "a", l, 0); err != nil || !d.Allowed {
		t.Fatalf("charge: %+v, %v", d, err)
	}
	if ttl := mr.TTL("p:t{a}"); ttl != 252*time.Millisecond {
		t.Errorf("TTL %v, want 1.500001 ms rounded up to 2 ms, plus 250 ms", ttl)
	}
	mr.SetTime(manualclock.Epoch.Add(251 * time.Millisecond))
	if !mr.Exists("p:t{a}") {
		t.Error("key gone 1 ms before its TTL")
	}
	mr.SetTime(manualclock.Epoch.Add(253 * time.Millisecond))
	if mr.Exists("p:t{a}") {
		t.Error("key still there 1 ms after its TTL")
	}
	tok := quota.MustCompile(quota.Config{TokensPerMin: 6000})
	if _, err := r.Charge(bg, "b", tok, 10); err != nil || !mr.Exists("p:t{b}") {
		t.Fatalf("charge of 10 tokens: key %v, %v", mr.Exists("p:t{b}"), err)
	}
	if _, err := r.Reconcile(bg, "b", tok, 10, 0); err != nil || mr.Exists("p:t{b}") {
		t.Errorf("refund to rest: key still there (%v)", err)
	}
}

// TestRedisKeyLayout: one hash per tenant, its name the prefix, "t" and the
// tenant in braces (its Cluster hash tag), fields q, t and j holding Unix
// nanoseconds; the default prefix; TIME read to the microsecond.
func TestRedisKeyLayout(t *testing.T) {
	mr, c := newMiniredis(t)
	mr.SetTime(manualclock.Epoch.Add(1234567891)) // 1.234567891 s: TIME shows 1.234567
	r := NewQuotaStore(c, DefaultPrefix, 0)
	if k := r.Key("acme"); k != "fq:quota:t{acme}" {
		t.Fatalf("key %q, want fq:quota:t{acme}", k)
	}
	// The caller's own meters, named with a NUL first, in a namespace of
	// their own; a tenant spelling one lands in the tenants'.
	if k := r.Key("\x00upstream"); k != "fq:quota:i{upstream}" {
		t.Errorf("internal meter's key %q, want fq:quota:i{upstream}", k)
	}
	if k := r.Key("i{upstream}"); k != "fq:quota:t{i{upstream}}" {
		t.Errorf("tenant i{upstream}'s key %q, want fq:quota:t{i{upstream}}", k)
	}
	if got, want := c.ClusterKeySlot(bg, r.Key("acme")).Val(), c.ClusterKeySlot(bg, "acme").Val(); got != want {
		t.Errorf("slot %d: the key's slot is not the tenant's, %d", got, want)
	}
	l := quota.MustCompile(quotatest.SeedCfg)
	d, err := r.Charge(bg, "acme", l, 1000)
	if err != nil {
		t.Fatal(err)
	}
	now := manualclock.Epoch.Add(1234567000)
	if !d.At.Equal(now) {
		t.Errorf("At %v, want Redis TIME %v (microseconds)", d.At, now)
	}
	h, err := c.HGetAll(bg, "fq:quota:t{acme}").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"q": strconv.FormatInt(now.UnixNano()+5_000_000, 10),
		"t": strconv.FormatInt(now.UnixNano()+300_000_000, 10),
		"j": strconv.FormatInt(now.UnixNano()+9_000_000, 10),
	}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("hash %v, want %v", h, want)
	}
}

// TestRedisGarbledState: a hash with missing, garbled, negative or
// out-of-range fields is read as a tenant at rest on those meters (no error,
// no panic) and the next charge writes it whole; a key of another type is an
// error.
func TestRedisGarbledState(t *testing.T) {
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, DefaultPrefix, 0)
	l := quota.MustCompile(quotatest.SeedCfg)
	fresh, err := r.Status(bg, "nobody", l)
	if err != nil {
		t.Fatal(err)
	}
	for _, vals := range [][]string{
		{"q", "garbage", "t", "", "j", "12abc"},
		{"q", "-5", "t", "99999999999999999999", "j", "9223372036854775807"},
		{"t", "1.5e18"},
		{"x", "1"},
	} {
		mr.Del("fq:quota:t{g}")
		mr.HSet("fq:quota:t{g}", vals...)
		st, err := r.Status(bg, "g", l)
		if err != nil || st != fresh {
			t.Errorf("hash %v: status %+v, %v; want the fresh %+v", vals, st, err, fresh)
		}
		d, err := r.Charge(bg, "g", l, 100)
		if err != nil || !d.Allowed {
			t.Errorf("hash %v: charge %+v, %v; want allowed", vals, d, err)
		}
		for _, f := range []string{"q", "t", "j"} {
			if _, err := strconv.ParseInt(mr.HGet("fq:quota:t{g}", f), 10, 64); err != nil {
				t.Errorf("hash %v: field %s after a charge: %v", vals, f, err)
			}
		}
	}
	mr.Del("fq:quota:t{g}")
	mr.Set("fq:quota:t{g}", "a string")
	if _, err := r.Charge(bg, "g", l, 1); err == nil {
		t.Error("a key of the wrong type: no error")
	}
	// The Go side of the reply.
	for _, res := range [][]any{
		nil,
		{"1", "2", "3", "4"},
		{"1", "2", "3", "4", "5", "6", int64(7)},
		{"1", "2", "3", "4", "5", "6", "x"},
		{"1", "2", "3", "4", "5", "6", "4"},
	} {
		if _, _, _, _, _, err := parseReply(res); !errors.Is(err, errReply) {
			t.Errorf("reply %v: error %v, want errReply", res, err)
		}
	}
}

// TestRedisErrors: a cancelled context, a server that never answers (with
// the call's Timeout and a client with ContextTimeoutEnabled) and a server
// gone are errors, returned, for the caller to fail open.
func TestRedisErrors(t *testing.T) {
	l := quota.MustCompile(quotatest.SeedCfg)
	mr, c := newMiniredis(t)
	r := NewQuotaStore(c, DefaultPrefix, 0)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := r.Charge(ctx, "a", l, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want context.Canceled", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns sync.WaitGroup
	conns.Go(func() {
		// Accept and never answer.
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	})
	silent := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true, Protocol: 2})
	defer silent.Close()
	rs := NewQuotaStore(silent, DefaultPrefix, 50*time.Millisecond)
	_, err = rs.Charge(bg, "a", l, 1)
	var ne net.Error
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("silent server: %v, want a timeout", err)
	}
	// The caller's own deadline, without the store's timeout.
	ctx, cancel = context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	_, err = NewQuotaStore(silent, DefaultPrefix, 0).Peek(ctx, "a", l, quota.Backlog{})
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("silent server, caller's deadline: %v, want a timeout", err)
	}
	ln.Close()
	conns.Wait()

	mr.Close()
	if _, err := r.Peek(bg, "a", l, quota.Backlog{}); err == nil {
		t.Error("server gone: Peek gave no error")
	}
	if _, err := r.Reconcile(bg, "a", l, 1, 2); err == nil {
		t.Error("server gone: Reconcile gave no error")
	}
	if _, err := r.Status(bg, "a", l); err == nil {
		t.Error("server gone: Status gave no error")
	}
}

// roundTrips counts the commands a client sends (a go-redis process hook
// sees each command once; a pipeline is one round trip), leaving out a new
// connection's handshake (HELLO, CLIENT SETINFO), which is no decision's.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "hello" && n != "client" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if n := cmd.Name(); n != "hello" && n != "client" {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestRedisOneRoundTrip: after Load, Peek, Charge (allowed or refused),
// Reconcile and Status each send exactly one command; without Load the
// first call on a server sends two (EVALSHA refused with NOSCRIPT, then
// EVAL) and every later one, one.
func TestRedisOneRoundTrip(t *testing.T) {
	l := quota.MustCompile(quota.Config{QPS: 1})
	for _, load := range []bool{true, false} {
		t.Run(fmt.Sprintf("load=%v", load), func(t *testing.T) {
			_, c := newMiniredis(t)
			var rt roundTrips
			c.AddHook(&rt)
			r := NewQuotaStore(c, DefaultPrefix, 0)
			if load {
				if err := r.Load(bg); err != nil {
					t.Fatal(err)
				}
				rt.n.Store(0)
			}
			calls := []struct {
				name string
				f    func() error
			}{
				{"Charge (allowed)", func() error { _, err := r.Charge(bg, "a", l, 1); return err }},
				{"Charge (refused)", func() error { _, err := r.Charge(bg, "a", l, 1); return err }},
				{"Peek", func() error { _, err := r.Peek(bg, "a", l, quota.Backlog{Requests: 3}); return err }},
				{"Reconcile", func() error { _, err := r.Reconcile(bg, "a", l, 1, 2); return err }},
				{"Status", func() error { _, err := r.Status(bg, "a", l); return err }},
			}
			for i, call := range calls {
				before := rt.n.Load()
				if err := call.f(); err != nil {
					t.Fatal(err)
				}
				want := int64(1)
				if i == 0 && !load {
					want = 2
				}
				if got := rt.n.Load() - before; got != want {
					t.Errorf("%s: %d round trips, want %d", call.name, got, want)
				}
			}
		})
	}
}

// TestRedisCluster: through a ClusterClient (miniredis answers CLUSTER
// SLOTS as a one-node cluster), Load reaches the node and decisions equal
// Memory's.
func TestRedisCluster(t *testing.T) {
	mr, _ := newMiniredis(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{mr.Addr()}, MaxRetries: -1})
	defer cc.Close()
	r := NewQuotaStore(cc, DefaultPrefix, 0)
	if err := r.Load(bg); err != nil {
		t.Fatal(err)
	}
	mh := quotatest.NewMemory()
	l := quota.MustCompile(quotatest.SeedCfg)
	for i := 0; i < 50; i++ {
		md := mh.Charge(t, "a", l, 3000)
		rd, err := r.Charge(bg, "a", l, 3000)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(md, rd) {
			t.Fatalf("charge %d: memory %+v, redis %+v", i, md, rd)
		}
	}
}

// realRedis returns a client on the redis-server at $REDIS_ADDR (which the
// CI script starts), or skips the test when it is unset.
func realRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		tb.Skip("REDIS_ADDR not set: no redis-server to test against")
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	if err := c.Ping(bg).Err(); err != nil {
		tb.Fatalf("REDIS_ADDR=%s: %v", addr, err)
	}
	return c
}

// testPrefix is a key prefix of its own for each run against a shared
// server; cleanup deletes its keys.
func testPrefix(tb testing.TB, c *redis.Client) string {
	p := fmt.Sprintf("fqtest:%d:%d:", time.Now().UnixNano(), rand.Uint32())
	tb.Cleanup(func() { deleteKeys(c, p) })
	return p
}

// TestRedisServer runs against a real redis-server (its Lua 5.1, TIME and
// expiry), when $REDIS_ADDR names one:
//
//   - matches-memory: 3000 random calls give the results Memory gives when
//     its clock reads the Redis time each call saw;
//   - concurrent: two clients (two gateways) with 4 goroutines each, 300
//     charges per goroutine for one tenant at 1000 qps with a 10 ms window:
//     the charges admitted over the window D between the first and the last
//     (on Redis's clock) never exceed the GCRA bound r x (D + tau) + 1, and
//     the tenant's TAT accounts for every one of them;
//   - layout: the key has the TTL of its debt plus the margin, and a refund
//     to rest deletes it; one round trip per call.
func TestRedisServer(t *testing.T) {
	c := realRedis(t)
	prefix := testPrefix(t, c)

	t.Run("matches-memory", func(t *testing.T) {
		r := NewQuotaStore(c, prefix+"m:", 0)
		var cur int64
		r.onNow = func(now int64) { cur = now }
		m := quota.NewMemory(func() time.Time { return time.Unix(0, cur) })
		// Rates low enough that real time refuses often.
		ls := []*quota.Limits{
			quota.MustCompile(quota.Config{QPS: 20, TokensPerMin: 6000, TokenToQPSWeight: 0.01, JointCap: 1, BurstWindow: time.Second, BurstAllow: 0.1}),
			quota.MustCompile(quota.Config{QPS: 3, TokensPerMin: 700, TokenToQPSWeight: 0.0013, JointCap: 0.7, BurstWindow: 3 * time.Second, BurstAllow: 0.37}),
			quota.MustCompile(quota.Config{QPS: 1000, TokensPerMin: 1e7, TokenToQPSWeight: 0.01, JointCap: 0.1}),         // joint binds
			quota.MustCompile(quota.Config{QPS: 1e-6, TokensPerMin: 6e-5, BurstWindow: 24 * time.Hour, BurstAllow: 100}), // slow: last
		}
		rng := rand.New(rand.NewPCG(9, 10))
		seen := map[string]int{}
		for i := 0; i < 3000; i++ {
			op := nextOp(rng, ls)
			rd, err := apply(t, r, op)
			if err != nil {
				t.Fatal(err)
			}
			md, _ := apply(t, m, op)
			if !sameDecision(md, rd) {
				t.Fatalf("call %d %+v at %d:\nmemory %+v\nredis  %+v", i, op, cur, md, rd)
			}
			if op.kind <= 1 {
				if md.Allowed {
					seen["allowed"]++
				} else {
					seen[string(md.Reason)]++
				}
			}
		}
		if seen["allowed"] == 0 || seen["qps"]+seen["tokens"]+seen["joint"] == 0 {
			t.Errorf("trace saw %v, want both allowed and refused decisions", seen)
		}
		t.Logf("decisions: %v", seen)
	})

	t.Run("concurrent", func(t *testing.T) {
		l := quota.MustCompile(quota.Config{QPS: 1000, BurstWindow: time.Second, BurstAllow: 0.01}) // T 1 ms, tau 10 ms
		c2 := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true})
		defer c2.Close()
		stores := []*QuotaStore{NewQuotaStore(c, prefix+"c:", 0), NewQuotaStore(c2, prefix+"c:", 0)}
		var (
			mu          sync.Mutex
			allowed     int64
			first, last int64 = math.MaxInt64, math.MinInt64
			wg          sync.WaitGroup
		)
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				s := stores[g%2]
				for i := 0; i < 300; i++ {
					d, err := s.Charge(bg, "hot", l, 0)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						at := d.At.UnixNano()
						mu.Lock()
						allowed++
						first, last = min(first, at), max(last, at)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if allowed == 0 {
			t.Fatal("no charge admitted")
		}
		D := last - first
		T := int64(l.Increment(quota.DimQPS, 0))
		tau := int64(l.Tolerance())
		// GCRA: the k-th charge after the first needs first + k T <= its
		// time + tau, so (allowed - 1) T <= D + tau.
		if (allowed-1)*T > D+tau {
			t.Errorf("%d charges admitted over %v: above the bound r x (D + tau) + 1 = %d", allowed, time.Duration(D), (D+tau)/T+1)
		}
		raw, err := c.HGet(bg, stores[0].Key("hot"), "q").Result()
		if err != nil {
			t.Fatal(err)
		}
		tat, _ := strconv.ParseInt(raw, 10, 64)
		if tat < first+allowed*T || tat > last+tau+T {
			t.Errorf("TAT %d not within [first + n T, last + tau + T] = [%d, %d]", tat, first+allowed*T, last+tau+T)
		}
		t.Logf("%d of 2400 charges admitted over %v (bound %d)", allowed, time.Duration(D), (D+tau)/T+1)
	})

	t.Run("layout", func(t *testing.T) {
		lc := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true})
		defer lc.Close()
		var rt roundTrips
		lc.AddHook(&rt)
		r := NewQuotaStore(lc, prefix+"l:", 0)
		r.margin = "3600000" // an hour, in ms
		if err := r.Load(bg); err != nil {
			t.Fatal(err)
		}
		l := quota.MustCompile(quota.Config{TokensPerMin: 60}) // a token per second
		rt.n.Store(0)
		if d, err := r.Charge(bg, "a", l, 600); err != nil || !d.Allowed {
			t.Fatalf("charge: %+v, %v", d, err)
		}
		if n := rt.n.Load(); n != 1 {
			t.Errorf("charge: %d round trips, want 1", n)
		}
		// 10 min of debt plus an hour of margin, counted down since.
		if ttl := lc.PTTL(bg, r.Key("a")).Val(); ttl > 70*time.Minute || ttl < 69*time.Minute {
			t.Errorf("TTL %v, want 70 min (10 min of debt + 1 h margin) less the time since", ttl)
		}
		rt.n.Store(0)
		if _, err := r.Reconcile(bg, "a", l, 600, 0); err != nil {
			t.Fatal(err)
		}
		if n := rt.n.Load(); n != 1 {
			t.Errorf("reconcile: %d round trips, want 1", n)
		}
		if n := lc.Exists(bg, r.Key("a")).Val(); n != 0 {
			t.Error("refund to rest: key still there")
		}
	})
}

// BenchmarkRedisCharge measures one Charge through the Redis store, the
// call at dispatch, against miniredis and, when $REDIS_ADDR is set, a real
// redis-server, with the seed's three meters at rates that admit
// everything: over 1 and 10k tenants from one goroutine (the latency of a
// decision), and over 10k tenants from GOMAXPROCS x 4 goroutines (the
// decisions per second one server sustains). It reports round trips per
// decision (a go-redis hook counts the commands sent; 1 after Load).
func BenchmarkRedisCharge(b *testing.B) {
	cfg := quotatest.SeedCfg
	cfg.QPS = 1e6
	cfg.TokensPerMin = 1e12
	l := quota.MustCompile(cfg)
	servers := []struct {
		name   string
		client func(b testing.TB) *redis.Client
	}{
		{"miniredis", func(b testing.TB) *redis.Client {
			mr := miniredis.RunT(b)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
			b.Cleanup(func() { c.Close() })
			return c
		}},
		{"redis-server", realRedis},
	}
	for _, srv := range servers {
		for _, bc := range []struct {
			tenants  int
			parallel bool
		}{{1, false}, {10000, false}, {10000, true}} {
			name := fmt.Sprintf("%s/tenants=%d", srv.name, bc.tenants)
			if bc.parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				c := srv.client(b)
				var rt roundTrips
				c.AddHook(&rt)
				r := NewQuotaStore(c, fmt.Sprintf("fqbench:%d:", time.Now().UnixNano()), 0)
				b.Cleanup(func() { deleteKeys(c, r.prefix) })
				if err := r.Load(bg); err != nil {
					b.Fatal(err)
				}
				names := make([]string, bc.tenants)
				for i := range names {
					names[i] = "tenant-" + strconv.Itoa(i)
				}
				var refused atomic.Int64
				charge := func(i int) {
					d, err := r.Charge(bg, names[i%len(names)], l, 100)
					if err != nil {
						b.Fatal(err)
					}
					if !d.Allowed {
						refused.Add(1)
					}
				}
				rt.n.Store(0)
				b.ReportAllocs()
				b.ResetTimer()
				if bc.parallel {
					b.SetParallelism(4)
					var next atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							charge(int(next.Add(1)))
						}
					})
				} else {
					for i := 0; b.Loop(); i++ {
						charge(i)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(rt.n.Load())/float64(b.N), "roundtrips/op")
				if refused.Load() > 0 {
					b.Fatalf("%d charges refused at rates meant to admit all", refused.Load())
				}
			})
		}
	}
}

// deleteKeys removes the keys under prefix (a benchmark's, on a shared
// server).
func deleteKeys(c *redis.Client, prefix string) {
	var cursor uint64
	for {
		keys, next, err := c.Scan(bg, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return
		}
		if len(keys) > 0 {
			c.Del(bg, keys...)
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}
