package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// localRig is a Local over Redis on miniredis, both on one virtual
// clock, with its outage reports and the primary's round trips counted.
type localRig struct {
	clk *manualclock.Clock
	mr  interface {
		Close()
		Restart() error
	}
	r      *QuotaStore
	rt     *roundTrips
	f      *quota.Local
	mu     sync.Mutex
	events []bool // OnChange's degraded values, in order
	errs   []error
}

func newLocalRig(t *testing.T, instances int) *localRig {
	mr, c := newMiniredis(t)
	clk := manualclock.New(manualclock.Epoch)
	rig := &localRig{clk: clk, mr: mr, rt: &roundTrips{}}
	c.AddHook(rig.rt)
	rig.r = NewQuotaStore(c, DefaultPrefix, time.Second)
	opts := quota.LocalOptions{Instances: instances, Clock: clk.Now,
		OnChange: func(degraded bool, err error) {
			rig.mu.Lock()
			defer rig.mu.Unlock()
			rig.events = append(rig.events, degraded)
			rig.errs = append(rig.errs, err)
		}}
	rig.f = quota.NewLocal(rig.r, quota.NewMemory(clk.Now), opts)
	return rig
}

func (rig *localRig) changes() []bool {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return append([]bool(nil), rig.events...)
}

func (rig *localRig) charge(t *testing.T, tenant string, l *quota.Limits, tokens int64) quota.Decision {
	t.Helper()
	d, err := rig.f.Charge(bg, tenant, l, tokens)
	if err != nil {
		t.Fatalf("Charge: %v (a Local never fails a call for its primary)", err)
	}
	return d
}

// TestLocalOutage: a primary that goes away is noticed by one call,
// reported once, and costs no round trip per call afterwards; local
// decisions run at 1/instances of the limits; a retry per Retry period
// tries the primary, and the first that succeeds ends the outage, reported
// once.
func TestLocalOutage(t *testing.T) {
	// 1000 tokens/s, no burst: a 1000-token request is one second of debt
	// on the shared store, three on an instance's share.
	l := quota.MustCompile(quota.Config{TokensPerMin: 60000})
	rig := newLocalRig(t, 3)
	f := rig.f

	d := rig.charge(t, "a", l, 1000)
	if !d.Allowed || d.Status.Tokens.Reset != time.Second {
		t.Fatalf("healthy charge: %+v, want allowed with 1s of debt on the shared store", d)
	}
	if f.Degraded() || f.LocalCalls() != 0 || len(rig.changes()) != 0 {
		t.Fatalf("healthy: degraded %v, locals %d, changes %v", f.Degraded(), f.LocalCalls(), rig.changes())
	}

	rig.mr.Close()
	d = rig.charge(t, "b", l, 1000)
	if !d.Allowed || d.Status.Tokens.Reset != 3*time.Second {
		t.Errorf("first charge in the outage: %+v, want allowed locally with 3s of debt (a third of the rate)", d)
	}
	if !f.Degraded() || f.LocalCalls() != 1 {
		t.Errorf("after the failure: degraded %v, locals %d; want true, 1", f.Degraded(), f.LocalCalls())
	}
	if got := rig.changes(); len(got) != 1 || !got[0] || rig.errs[0] == nil {
		t.Fatalf("OnChange calls %v (errors %v), want one, degraded with the error", got, rig.errs)
	}
	// Until Retry has passed: every call local, none to the primary.
	before := rig.rt.n.Load()
	if d := rig.charge(t, "b", l, 1000); d.Allowed || d.RetryAfter != 3*time.Second {
		t.Errorf("second local charge: %+v, want refused for 3s (the local share's debt)", d)
	}
	if _, err := f.Peek(bg, "b", l, quota.Backlog{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Reconcile(bg, "b", l, 1000, 500); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Status(bg, "b", l); err != nil || st.Tokens.Reset != 1500*time.Millisecond {
		t.Errorf("local status after a refund of half: %+v, %v; want 1.5s of debt", st, err)
	}
	if n := rig.rt.n.Load() - before; n != 0 {
		t.Errorf("%d round trips to the primary within Retry of the failure, want 0", n)
	}
	if f.LocalCalls() != 5 {
		t.Errorf("locals %d, want 5 (every call since the failure)", f.LocalCalls())
	}

	// Retry passed, primary still down: one call tries it, the others of
	// the next period do not; nothing is reported again.
	rig.clk.Advance(quota.DefaultLocalRetry)
	before = rig.rt.n.Load()
	for range 3 {
		rig.charge(t, "c", l, 1)
	}
	if n := rig.rt.n.Load() - before; n != 1 {
		t.Errorf("%d round trips after Retry with the primary down, want 1 (one retry)", n)
	}
	if !f.Degraded() || len(rig.changes()) != 1 {
		t.Errorf("failed retry: degraded %v, changes %v; want still degraded, nothing reported", f.Degraded(), rig.changes())
	}

	// Back: the retry after the next period succeeds and ends the outage.
	if err := rig.mr.Restart(); err != nil {
		t.Fatal(err)
	}
	rig.clk.Advance(quota.DefaultLocalRetry / 2)
	before = rig.rt.n.Load()
	rig.charge(t, "c", l, 1)
	if n := rig.rt.n.Load() - before; n != 0 || !f.Degraded() {
		t.Errorf("half a period after a failed retry: %d round trips, degraded %v; want 0, true", n, f.Degraded())
	}
	rig.clk.Advance(quota.DefaultLocalRetry / 2)
	locals := f.LocalCalls()
	rig.charge(t, "d", l, 1000)
	if f.Degraded() || f.LocalCalls() != locals {
		t.Errorf("retry against the restarted primary: degraded %v, locals +%d; want false, +0", f.Degraded(), f.LocalCalls()-locals)
	}
	if got := rig.changes(); len(got) != 2 || got[1] || rig.errs[1] != nil {
		t.Errorf("OnChange calls %v, want [true false]: the outage's end reported once", got)
	}
	// The shared store again: a's second of debt (miniredis kept it across
	// the restart, on its clock, which has not moved).
	if d := rig.charge(t, "a", l, 1000); d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("after the outage: %+v, want refused by the shared store's 1s of debt", d)
	}
}

// TestLocalCallerContext: the caller's own context ending is its error,
// not an outage.
func TestLocalCallerContext(t *testing.T) {
	rig := newLocalRig(t, 3)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err := rig.f.Charge(ctx, "a", quota.MustCompile(quota.Config{QPS: 1}), 0)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v, want context.Canceled", err)
	}
	if rig.f.Degraded() || rig.f.LocalCalls() != 0 || len(rig.changes()) != 0 {
		t.Error("a cancelled caller started an outage")
	}
}

// TestLocalClusterShare: three instances whose shared store is down
// from the start, each deciding alone on its third, hold a tenant that
// sends three times its rate round-robin over them to its quota: over a
// minute of virtual time the tokens allowed are rate x time + the burst
// allowance, within 1% (the instances' shares of the burst add up to one
// burst), not three times it.
func TestLocalClusterShare(t *testing.T) {
	cfg := quota.Config{TokensPerMin: 60000, BurstWindow: 10 * time.Second, BurstAllow: 0.2}
	l := quota.MustCompile(cfg)
	mr, c := newMiniredis(t)
	mr.Close()
	clk := manualclock.New(manualclock.Epoch)
	var fs []*quota.Local
	for range 3 {
		fs = append(fs, quota.NewLocal(NewQuotaStore(c, DefaultPrefix, 0), quota.NewMemory(clk.Now),
			quota.LocalOptions{Instances: 3, Clock: clk.Now, Retry: time.Hour}))
	}
	const (
		tokens = 100
		dur    = time.Minute
	)
	// Three times 1000 tokens/s: one request of 100 every 1/30 s.
	step := time.Second / 30
	var allowed int64
	for i := 0; time.Duration(i)*step < dur; i++ {
		d, err := fs[i%3].Charge(bg, "t", l, tokens)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed += tokens
		}
		clk.Advance(step)
	}
	want := cfg.TokensPerMin/60*dur.Seconds() + cfg.TokensPerMin/60*cfg.BurstAllow*cfg.BurstWindow.Seconds()
	if ratio := float64(allowed) / want; ratio < 0.99 || ratio > 1.01 {
		t.Errorf("three local instances allowed %d tokens in %v, want %.0f within 1%% (ratio %.3f)", allowed, dur, want, ratio)
	}
	for i, f := range fs {
		if !f.Degraded() {
			t.Errorf("instance %d not degraded", i)
		}
	}
}

// TestLocalConcurrent runs calls from several goroutines while the
// primary goes down and comes back twice (with -race): no call fails, the
// outages are reported alternately (down, up, down, up), and it ends
// deciding on the primary.
func TestLocalConcurrent(t *testing.T) {
	l := quota.MustCompile(quotatest.SeedCfg)
	mr, c := newMiniredis(t)
	clk := manualclock.New(manualclock.Epoch)
	var mu sync.Mutex
	var events []bool
	f := quota.NewLocal(NewQuotaStore(c, DefaultPrefix, time.Second), quota.NewMemory(clk.Now), quota.LocalOptions{
		Instances: 2, Clock: clk.Now,
		OnChange: func(d bool, _ error) { mu.Lock(); events = append(events, d); mu.Unlock() },
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 6 {
		wg.Go(func() {
			tenant := string(rune('a' + g))
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := f.Charge(bg, tenant, l, 100)
				if err == nil && d.Allowed {
					_, err = f.Reconcile(bg, tenant, l, 100, 50)
				}
				if err == nil {
					_, err = f.Peek(bg, tenant, l, quota.Backlog{Requests: 1})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Bounded waits: a hang (every caller stopped on an error) is a
	// failure with its cause, not a timeout of the whole run.
	wait := func(what string, done func() bool) {
		for i := 0; !done(); i++ {
			if i == 10000 {
				close(stop)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Errorf("a call failed: %v", err)
				}
				t.Fatalf("waiting for %s: not reached", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitLocalCalls := func(min uint64) {
		wait("local decisions", func() bool { return f.LocalCalls() >= min })
	}
	waitPrimary := func() {
		wait("the primary", func() bool {
			clk.Advance(quota.DefaultLocalRetry)
			return !f.Degraded()
		})
	}
	for range 2 {
		mr.Close()
		waitLocalCalls(f.LocalCalls() + 100)
		if err := mr.Restart(); err != nil {
			t.Fatal(err)
		}
		waitPrimary()
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a call failed: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Each outage is reported as it starts and as it ends, never twice
	// in a row. A connection the client pooled before a restart (or a dial
	// it started during the outage) may fail once after the retry
	// succeeded: a second, brief outage, reported as such.
	ok := len(events) >= 4 && len(events)%2 == 0
	for i, d := range events {
		ok = ok && d == (i%2 == 0)
	}
	if !ok {
		t.Errorf("OnChange calls %v, want [true false] per outage, at least two outages", events)
	}
	if f.Degraded() {
		t.Error("degraded at the end, with the primary up")
	}
}

var _ redis.Hook = (*roundTrips)(nil)

// TestLocalPeekBacklog: on the shared store a Peek counts the local
// backlog once per instance (the cluster's backlog under an even load
// balancer); locally, once against the instance's share: the same wait.
func TestLocalPeekBacklog(t *testing.T) {
	l := quota.MustCompile(quota.Config{TokensPerMin: 60000}) // 1000 tokens/s, no burst
	rig := newLocalRig(t, 3)
	ahead := quota.Backlog{Requests: 2, Tokens: 1000}
	d, err := rig.f.Peek(bg, "a", l, ahead)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.RetryAfter != 3*time.Second {
		t.Errorf("shared store: %+v, want a wait of 3s (1000 tokens ahead here, 3000 in the cluster)", d)
	}
	rig.mr.Close()
	rig.charge(t, "b", l, 0) // starts the outage
	d, err = rig.f.Peek(bg, "a", l, ahead)
	if err != nil {
		t.Fatal(err)
	}
	if !rig.f.Degraded() || d.Allowed || d.RetryAfter != 3*time.Second {
		t.Errorf("local: degraded %v, %+v; want a wait of 3s (1000 tokens at a third of the rate)", rig.f.Degraded(), d)
	}
}

// TestLocalPeekAtRest: a Peek with nothing ahead, for a tenant the
// primary last said would be at rest by now, costs no round trip and is
// allowed; otherwise it asks the primary. A charge another instance made
// since is found by the Charge, which always asks.
func TestLocalPeekAtRest(t *testing.T) {
	l := quota.MustCompile(quota.Config{QPS: 1}) // one request a second, no burst
	mr, c := newMiniredis(t)
	var rt roundTrips
	c.AddHook(&rt)
	clk := manualclock.New(manualclock.Epoch)
	advance := func(d time.Duration) {
		clk.Advance(d)
		mr.SetTime(clk.Now())
	}
	r := NewQuotaStore(c, DefaultPrefix, 0)
	if err := r.Load(bg); err != nil {
		t.Fatal(err)
	}
	f := quota.NewLocal(r, quota.NewMemory(clk.Now), quota.LocalOptions{Instances: 2, Clock: clk.Now})
	other := quota.NewLocal(NewQuotaStore(c, DefaultPrefix, 0), quota.NewMemory(clk.Now), quota.LocalOptions{Instances: 2, Clock: clk.Now})
	trips := func(what string, want int64, call func()) {
		t.Helper()
		before := rt.n.Load()
		call()
		if got := rt.n.Load() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	peek := func(ahead quota.Backlog) quota.Decision {
		t.Helper()
		d, err := f.Peek(bg, "a", l, ahead)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	trips("Peek, tenant never seen", 1, func() { peek(quota.Backlog{}) })
	trips("Peek, seen at rest", 0, func() {
		if d := peek(quota.Backlog{}); !d.Allowed || d.Status.Requests.Remaining != 1 {
			t.Errorf("at rest: %+v, want allowed with the full allowance", d)
		}
	})
	trips("Peek with a backlog", 1, func() { peek(quota.Backlog{Requests: 1}) })
	trips("Charge", 1, func() {
		if d, _ := f.Charge(bg, "a", l, 0); !d.Allowed {
			t.Error("first charge refused")
		}
	})
	trips("Peek, in debt", 1, func() {
		if d := peek(quota.Backlog{}); d.Allowed {
			t.Error("Peek right after a charge of a second: allowed")
		}
	})
	advance(time.Second)
	trips("Peek, a second later: at rest again", 0, func() {
		if !peek(quota.Backlog{}).Allowed {
			t.Error("refused at rest")
		}
	})
	// Another instance charges: this one's record is stale, its Peek
	// allows, its Charge does not.
	if d, _ := other.Charge(bg, "a", l, 0); !d.Allowed {
		t.Fatal("other instance's charge refused")
	}
	trips("Peek after another instance's charge", 0, func() {
		if !peek(quota.Backlog{}).Allowed {
			t.Error("the record said at rest: want allowed without asking")
		}
	})
	trips("Charge after another instance's charge", 1, func() {
		if d, _ := f.Charge(bg, "a", l, 0); d.Allowed || d.RetryAfter != time.Second {
			t.Errorf("Charge: %+v, want refused for the other instance's second", d)
		}
	})
	trips("Peek after that refusal", 1, func() { peek(quota.Backlog{}) })
}

// TestLocalTenantError: an error Outage says concerns one tenant (here
// a key of another type at its name) is decided locally without starting
// an outage: the other tenants stay on the primary, nothing is reported.
func TestLocalTenantError(t *testing.T) {
	l := quota.MustCompile(quota.Config{QPS: 1})
	mr, c := newMiniredis(t)
	clk := manualclock.New(manualclock.Epoch)
	var changes int
	f := quota.NewLocal(NewQuotaStore(c, DefaultPrefix, 0), quota.NewMemory(clk.Now), quota.LocalOptions{
		Instances: 2, Clock: clk.Now,
		OnChange: func(bool, error) { changes++ },
		Outage:   outage,
	})
	if err := mr.Set(DefaultPrefix+"t{bad}", "not a hash"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewQuotaStore(c, DefaultPrefix, 0).Charge(bg, "bad", l, 0); err == nil || outage(err) {
		t.Fatalf("the store's error for a string key: %v, want a WRONGTYPE that is no outage", err)
	}
	if !outage(errors.New("dial tcp: connection refused")) || !outage(context.DeadlineExceeded) {
		t.Error("outage: network errors must be outages")
	}
	d, err := f.Charge(bg, "bad", l, 0)
	if err != nil || !d.Allowed || f.LocalCalls() != 1 {
		t.Errorf("tenant with a bad key: %+v %v, locals %d; want allowed locally", d, err, f.LocalCalls())
	}
	if f.Degraded() || changes != 0 {
		t.Errorf("one tenant's bad key: degraded %v, %d reports; want no outage", f.Degraded(), changes)
	}
	if _, err := f.Charge(bg, "good", l, 0); err != nil || !mr.Exists(DefaultPrefix+"t{good}") || f.LocalCalls() != 1 {
		t.Errorf("another tenant: %v, locals %d; want it charged in redis", err, f.LocalCalls())
	}
}

// TestLocalBook: a booking is the shared store's while it answers
// (first come, first served over the instances) and the local share's
// during an outage: with three instances, a request books three times as
// far ahead of the same debt.
func TestLocalBook(t *testing.T) {
	l := quota.MustCompile(quota.Config{TokensPerMin: 60000}) // 1000 tokens/s, no burst
	rig := newLocalRig(t, 3)
	f := rig.f
	for i, want := range []time.Duration{0, time.Second} {
		d, err := f.Book(bg, "a", l, 1000, 5*time.Second, 0)
		if err != nil || !d.Allowed || d.RetryAfter != want {
			t.Fatalf("shared booking %d: %+v, %v; want booked %v ahead", i, d, err, want)
		}
	}
	rig.mr.Close()
	for i, want := range []time.Duration{0, 3 * time.Second} {
		d, err := f.Book(bg, "b", l, 1000, 5*time.Second, 0)
		if err != nil || !d.Allowed || d.RetryAfter != want {
			t.Fatalf("local booking %d: %+v, %v; want booked %v ahead (a third of the rate)", i, d, err, want)
		}
	}
	if d, err := f.Book(bg, "b", l, 1000, 5*time.Second, 0); err != nil || d.Allowed || d.RetryAfter != 6*time.Second {
		t.Fatalf("local booking past maxWait: %+v, %v; want refused, 6s", d, err)
	}
	if !f.Degraded() || f.LocalCalls() != 3 {
		t.Errorf("degraded %v, locals %d; want true, 3", f.Degraded(), f.LocalCalls())
	}
}
