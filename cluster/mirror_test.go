package cluster

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// countingSyncer counts the calls that reach the shared store.
type countingSyncer struct {
	quota.Syncer
	calls atomic.Int64
}

func (c *countingSyncer) Add(ctx context.Context, tenant string, l *quota.Limits, requests, tokens int64) (quota.Status, error) {
	c.calls.Add(1)
	return c.Syncer.Add(ctx, tenant, l, requests, tokens)
}

// The account of the tests: 10 requests and 6000 tokens a second, a 1 s
// burst.
var mirrorCfg = quota.Config{QPS: 10, TokensPerMin: 360000, BurstWindow: time.Second, BurstAllow: 1}

// Every call of a Mirror is answered by its local meters, without a call
// to the shared store, on 1/Instances of the limits; only Sync calls it.
func TestMirrorAnswersLocally(t *testing.T) {
	_, c := newMiniredis(t)
	shared := &countingSyncer{Syncer: NewQuotaStore(c, DefaultPrefix, 0)}
	clk := manualclock.New(manualclock.Epoch)
	m := quota.NewMirror(shared, quota.MirrorOptions{Instances: 2, Clock: clk.Now})
	l := quota.MustCompile(mirrorCfg)
	// At 5 a second with a 1 s tolerance: six back to back (the debt
	// before each within 1 s), then the seventh waits 200 ms.
	for i := range 6 {
		if d, err := m.Charge(bg, "acct", l, 10); err != nil || !d.Allowed {
			t.Fatalf("charge %d: %+v, %v; want allowed", i, d, err)
		}
	}
	d, _ := m.Charge(bg, "acct", l, 10)
	if d.Allowed || d.RetryAfter != 200*time.Millisecond {
		t.Errorf("the 7th charge at 1/2 of 10 qps: %+v; want refused for 200ms", d)
	}
	if _, err := m.Peek(bg, "acct", l, quota.Backlog{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reconcile(bg, "acct", l, 10, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Refund(bg, "acct", l, 10); err != nil {
		t.Fatal(err)
	}
	st, _ := m.Status(bg, "acct", l)
	if st.Requests.Limit != 300 {
		t.Errorf("the local status's limit is %d requests/min; want 300 (half the account)", st.Requests.Limit)
	}
	if got := m.DecidesOn(l).Increment(quota.DimQPS, 1); got != 200*time.Millisecond {
		t.Errorf("DecidesOn: a request's increment is %v, want 200ms", got)
	}
	if n := shared.calls.Load(); n != 0 {
		t.Errorf("%d calls reached the shared store before any Sync; want none", n)
	}
	if err := m.Sync(bg); err != nil {
		t.Fatal(err)
	}
	if n := shared.calls.Load(); n != 1 {
		t.Errorf("Sync made %d calls for one meter; want 1", n)
	}
}

// mirrorRedis is a shared store for the Mirror tests: Redis on miniredis
// (its clock set with the test's), or on the real redis-server at
// $REDIS_ADDR.
type mirrorRedis struct {
	name  string
	store *QuotaStore
	// client reads the shared meter back.
	client *redis.Client
	real   bool
}

func mirrorStores(t *testing.T) []mirrorRedis {
	_, c := newMiniredis(t)
	stores := []mirrorRedis{{name: "miniredis", store: NewQuotaStore(c, DefaultPrefix, 0), client: c}}
	if os.Getenv("REDIS_ADDR") != "" {
		rc := realRedis(t)
		stores = append(stores, mirrorRedis{name: "redis-server", store: NewQuotaStore(rc, testPrefix(t, rc), 0), client: rc, real: true})
	}
	return stores
}

// Sync pushes the net of what was charged, reconciled and refunded since
// the last Sync to the shared meter, once: 3 requests of 100 tokens
// charged, one reconciled to 40, one refunded, is 2 requests and 140
// tokens.
func TestMirrorSyncPushesNetCharges(t *testing.T) {
	for _, s := range mirrorStores(t) {
		t.Run(s.name, func(t *testing.T) {
			l := quota.MustCompile(mirrorCfg)
			m := quota.NewMirror(s.store, quota.MirrorOptions{Instances: 2})
			for range 3 {
				if d, _ := m.Charge(bg, "acct", l, 100); !d.Allowed {
					t.Fatalf("charge refused: %+v", d)
				}
			}
			_, _ = m.Reconcile(bg, "acct", l, 100, 40)
			_, _ = m.Refund(bg, "acct", l, 100)
			start := time.Now()
			if err := m.Sync(bg); err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				st, err := s.store.Status(bg, "acct", l)
				elapsed := time.Since(start)
				if err != nil {
					t.Fatal(err)
				}
				// 2 requests at 10 qps: 200 ms; 140 tokens at 6000/s:
				// 23.3 ms. On the real server, less the time since the
				// push.
				for _, c := range []struct {
					got, want time.Duration
					meter     string
				}{{st.Requests.Reset, 200 * time.Millisecond, "requests"}, {st.Tokens.Reset, l.Increment(quota.DimTokens, 140), "tokens"}} {
					low := c.want
					if s.real {
						low -= elapsed
					}
					if c.got > c.want || c.got < low {
						t.Errorf("%s: the shared meter's %s debt is %v; want %v (less %v elapsed on the real server)", when, c.meter, c.got, c.want, elapsed)
					}
				}
			}
			check("after the first Sync")
			if err := m.Sync(bg); err != nil {
				t.Fatal(err)
			}
			check("after a second Sync with nothing new (nothing pushed twice)")
			if m.Holds() != 0 {
				t.Errorf("%d holds; want none (the shared meter is within its tolerance)", m.Holds())
			}
		})
	}
}

// mirrorRun drives gateways mirrors over one miniredis, every one drawing
// as fast as its local meter lets it, for d of virtual time in steps of
// 10 ms, syncing every 100 ms; it returns the requests each drew.
func mirrorRun(t *testing.T, gateways, instances int, d time.Duration) (drawn []int, mirrors []*quota.Mirror, l *quota.Limits, shared *QuotaStore) {
	t.Helper()
	mr, c := newMiniredis(t)
	shared = NewQuotaStore(c, DefaultPrefix, 0)
	clk := manualclock.New(manualclock.Epoch)
	l = quota.MustCompile(quota.Config{QPS: 10, BurstWindow: time.Second, BurstAllow: 1})
	for range gateways {
		mirrors = append(mirrors, quota.NewMirror(shared, quota.MirrorOptions{Instances: instances, Clock: clk.Now}))
	}
	drawn = make([]int, gateways)
	const step = 10 * time.Millisecond
	for at := time.Duration(0); at < d; at += step {
		for i, m := range mirrors {
			for {
				dec, err := m.Charge(bg, "acct", l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !dec.Allowed {
					break
				}
				drawn[i]++
			}
			if at%(100*time.Millisecond) == time.Duration(i)*step {
				// The gateways sync at different phases.
				if err := m.Sync(bg); err != nil {
					t.Fatal(err)
				}
			}
		}
		clk.Advance(step)
		mr.SetTime(clk.Now())
	}
	return drawn, mirrors, l, shared
}

// Two gateways with instances 2, both drawing all they may, draw together
// no more than the account allows over the run (10 a second plus the
// 1 s burst, plus one request each for the step's granularity), and the
// shared meter holds their total.
func TestMirrorTwoGatewaysWithinLimit(t *testing.T) {
	const run = 10 * time.Second
	drawn, mirrors, l, shared := mirrorRun(t, 2, 2, run)
	total := drawn[0] + drawn[1]
	allowed := 10*run.Seconds() + 10 + 2
	t.Logf("drawn %v, total %d; the account allows %.0f", drawn, total, allowed)
	if float64(total) > allowed || float64(total) < 0.95*10*run.Seconds() {
		t.Errorf("two gateways drew %d over %v; want at most %.0f (the account's rate x time + burst) and the account used", total, run, allowed)
	}
	for i, m := range mirrors {
		if err := m.Sync(bg); err != nil {
			t.Fatal(err)
		}
		if m.Holds() != 0 {
			t.Errorf("gateway %d held back %d times; want none (two gateways of instances 2 stay within the account)", i, m.Holds())
		}
	}
	// Every draw pushed: the shared meter's debt is what the run drew
	// beyond the rate (its burst), at most the tolerance.
	st, err := shared.Status(bg, "acct", l)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the shared meter's debt after the run: %v", st.Requests.Reset)
	if st.Requests.Reset > l.Tolerance()+200*time.Millisecond || st.Requests.Reset < l.Tolerance()-300*time.Millisecond {
		t.Errorf("the shared meter's debt after the run is %v; want about the tolerance %v (every draw pushed)", st.Requests.Reset, l.Tolerance())
	}
}

// Three gateways that think they are two (instances 2) would draw 1.5x the
// account on their local shares alone; the shared meter finds it past its
// tolerance and holds them back, so that the long-run draw stays near the
// account's rate.
func TestMirrorHoldsBackOverLimit(t *testing.T) {
	const run = 20 * time.Second
	drawn, mirrors, _, _ := mirrorRun(t, 3, 2, run)
	total := drawn[0] + drawn[1] + drawn[2]
	holds := mirrors[0].Holds() + mirrors[1].Holds() + mirrors[2].Holds()
	t.Logf("drawn %v, total %d (the account: %.0f plus its burst); %d holds", drawn, total, 10*run.Seconds(), holds)
	if holds == 0 {
		t.Error("no gateway held back")
	}
	// Without the holds: 1.5 x 200 + bursts = 315. Held, the shared debt
	// stays within twice the tolerance and a sync interval (the hold's
	// threshold), and each gateway draws its last request past it.
	if allowed := 10*(run.Seconds()+2+0.2) + 3; float64(total) > allowed {
		t.Errorf("three gateways of instances 2 drew %d over %v; want at most %.0f (held to about the account)", total, run, allowed)
	}
}

// With the shared store down, Sync fails (the caller counts it) and the
// local decisions go on, on the gateway's share.
func TestMirrorRedisDown(t *testing.T) {
	mr, c := newMiniredis(t)
	clk := manualclock.New(manualclock.Epoch)
	m := quota.NewMirror(NewQuotaStore(c, DefaultPrefix, 100*time.Millisecond), quota.MirrorOptions{Instances: 2, Clock: clk.Now})
	l := quota.MustCompile(quota.Config{QPS: 10, BurstWindow: time.Second, BurstAllow: 1})
	if d, _ := m.Charge(bg, "acct", l, 1); !d.Allowed {
		t.Fatal("first charge refused")
	}
	mr.Close()
	errs := 0
	served := 1
	for range 20 {
		if err := m.Sync(bg); err != nil {
			errs++
		}
		for {
			d, err := m.Charge(bg, "acct", l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			served++
		}
		clk.Advance(100 * time.Millisecond)
	}
	if errs != 20 {
		t.Errorf("%d of 20 syncs failed with Redis down; want all", errs)
	}
	// 2 s at 5 a second and the 1 s burst at that rate, plus the first.
	if served < 14 || served > 17 {
		t.Errorf("with Redis down the gateway drew %d in 2 s; want its local share, 5 a second plus its burst (about 16)", served)
	}
}
