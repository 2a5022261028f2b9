package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
)

// primary is the shared store of the Local tests here: a Memory on a
// clock of its own that can be taken down, counting every call made to
// it, as a go-redis hook counts commands. The Local tests against Redis
// are in package cluster.
type primary struct {
	m    *Memory
	down atomic.Bool
	n    atomic.Int64
}

var (
	bg      = context.Background()
	errDown = errors.New("primary down")
)

func (p *primary) call() error {
	p.n.Add(1)
	if p.down.Load() {
		return errDown
	}
	return nil
}

// Load stands for the probe's round trip.
func (p *primary) Load(context.Context) error { return p.call() }

func (p *primary) Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	if err := p.call(); err != nil {
		return Decision{}, err
	}
	return p.m.Peek(ctx, tenant, l, ahead)
}

func (p *primary) Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	if err := p.call(); err != nil {
		return Decision{}, err
	}
	return p.m.Charge(ctx, tenant, l, tokens)
}

func (p *primary) Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error) {
	if err := p.call(); err != nil {
		return Decision{}, err
	}
	return p.m.Book(ctx, tenant, l, tokens, maxWait, lead)
}

func (p *primary) Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	if err := p.call(); err != nil {
		return Status{}, err
	}
	return p.m.Reconcile(ctx, tenant, l, estimated, actual)
}

func (p *primary) Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	if err := p.call(); err != nil {
		return Status{}, err
	}
	return p.m.Refund(ctx, tenant, l, tokens)
}

func (p *primary) Status(ctx context.Context, tenant string, l *Limits) (Status, error) {
	if err := p.call(); err != nil {
		return Status{}, err
	}
	return p.m.Status(ctx, tenant, l)
}

// localRig is a Local over a primary with the probe its Load, on a
// virtual clock, with its outage reports.
type localRig struct {
	clk    *manualclock.Clock
	p      *primary
	f      *Local
	mu     sync.Mutex
	events []bool // OnChange's degraded values, in order
}

func newLocalRig(instances int) *localRig {
	clk := manualclock.New(manualclock.Epoch)
	rig := &localRig{clk: clk, p: &primary{m: NewMemory(manualclock.New(manualclock.Epoch).Now)}}
	rig.f = NewLocal(rig.p, NewMemory(clk.Now), LocalOptions{Instances: instances, Clock: clk.Now, Probe: rig.p.Load,
		OnChange: func(degraded bool, err error) {
			rig.mu.Lock()
			defer rig.mu.Unlock()
			rig.events = append(rig.events, degraded)
		}})
	return rig
}

func (rig *localRig) changes() []bool {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return append([]bool(nil), rig.events...)
}

func (rig *localRig) charge(t *testing.T, tenant string, l *Limits, tokens int64) Decision {
	t.Helper()
	d, err := rig.f.Charge(bg, tenant, l, tokens)
	if err != nil {
		t.Fatalf("Charge: %v (a Local never fails a call for its primary)", err)
	}
	return d
}

// TestLocalProbe: with a Probe, no call waits on the primary while it
// is down: after Retry a call starts one probe in the background and is
// answered locally; the probe's success ends the outage.
func TestLocalProbe(t *testing.T) {
	l := MustCompile(Config{QPS: 10})
	rig := newLocalRig(2)
	f := rig.f
	probes := make(chan error, 10)
	recovered := make(chan bool)
	var once sync.Once
	f.probe = func(ctx context.Context) error {
		err := rig.p.Load(ctx)
		probes <- err
		return err
	}
	f.onChange = func(degraded bool, err error) {
		if !degraded {
			once.Do(func() { close(recovered) })
		}
	}

	rig.charge(t, "a", l, 0)
	rig.p.down.Store(true)
	rig.charge(t, "a", l, 0)
	if !f.Degraded() {
		t.Fatal("not degraded after a failed call")
	}
	rig.clk.Advance(DefaultLocalRetry)
	before := rig.p.n.Load()
	locals := f.LocalCalls()
	rig.charge(t, "a", l, 0) // starts the probe, answered locally
	if f.LocalCalls() != locals+1 {
		t.Error("the call that started a probe was not answered locally")
	}
	if err := recv(t, probes); err == nil {
		t.Fatal("probe of a closed server succeeded")
	}
	probeDone(t, f)
	for range 3 {
		rig.charge(t, "a", l, 0)
	}
	if n := rig.p.n.Load() - before; n != 1 {
		t.Errorf("%d commands sent since Retry passed, want 1 (the probe's; no call tries the primary)", n)
	}
	if len(probes) != 0 {
		t.Error("a second probe started within Retry of the failed one")
	}

	rig.p.down.Store(false)
	rig.clk.Advance(DefaultLocalRetry)
	rig.charge(t, "a", l, 0) // starts the probe
	if err := recv(t, probes); err != nil {
		t.Fatalf("probe of the restarted server: %v", err)
	}
	recv(t, recovered)
	if f.Degraded() {
		t.Fatal("degraded after a successful probe")
	}
	before = rig.p.n.Load()
	locals = f.LocalCalls()
	rig.charge(t, "a", l, 0)
	if rig.p.n.Load()-before != 1 || f.LocalCalls() != locals {
		t.Error("after the probe's success the call did not go to the primary")
	}
}

// recv waits for a value the code under test sends, bounded so that a bug
// fails the test instead of hanging it.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received in 30s")
		panic("unreachable")
	}
}

// probeDone waits until f's probe goroutine has recorded its outcome.
func probeDone(t *testing.T, f *Local) {
	t.Helper()
	for i := 0; f.probing.Load(); i++ {
		if i == 30000 {
			t.Fatal("the probe goroutine did not finish")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLocalPoll: with no calls at all, Poll starts the probe once the
// retry is due, and its success ends the outage.
func TestLocalPoll(t *testing.T) {
	rig := newLocalRig(1)
	f := rig.f
	rig.p.down.Store(true)
	rig.charge(t, "a", MustCompile(Config{QPS: 1}), 0)
	rig.p.down.Store(false)
	f.Poll()
	probeDone(t, f)
	if !f.Degraded() {
		t.Fatal("Poll probed before the retry was due")
	}
	rig.clk.Advance(DefaultLocalRetry)
	f.Poll()
	probeDone(t, f)
	if f.Degraded() {
		t.Fatal("Poll after Retry did not find the primary back")
	}
	if got := rig.changes(); len(got) != 2 || !got[0] || got[1] {
		t.Errorf("OnChange calls %v, want [true false]", got)
	}
}
