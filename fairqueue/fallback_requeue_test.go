package fairqueue_test

// Regression tests of the quota, account, fallback and
// requeue paths: each once failed.

import (
	"context"
	"testing"
	"time"

	fq "github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

var rt0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func baseCfg() fq.Config {
	return fq.Config{
		MaxInflight:  4,
		Classes:      []fq.ClassConfig{{Name: "batch", WaitBudget: 300 * time.Second}},
		Tenants:      map[string]fq.TenantConfig{"a": {Weight: 1, Class: "batch"}, "vip": {Weight: 1, Class: "batch"}},
		Default:      fq.TenantConfig{Weight: 1, Class: "batch"},
		ExpiryMargin: 500 * time.Millisecond,
	}
}

// A reload that removes the fallback while a fallback ticket is in flight:
// its Release dereferences q.fb == nil with q.mu held.
func TestFallbackRemovedWhileInflight(t *testing.T) {
	clk := fq.NewManualClock(rt0)
	cfg := baseCfg()
	cfg.Fallback = &fq.FallbackConfig{Tenants: []string{"vip"}, MaxInflight: 2}
	q, err := fq.New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	q.SetHealthy(0) // no primary: vip goes to the fallback
	q.SetFallbackHealthy(1)
	tk, err := q.Enqueue(fq.Request{Tenant: "vip", Cost: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Wait(context.Background()); err != nil || !tk.Fallback() {
		t.Fatalf("not on fallback: %v %v", err, tk.Fallback())
	}
	cfg2 := baseCfg()
	if err := q.Reconfigure(cfg2); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("Release panicked after the fallback was removed: %v", v)
			}
		}()
		tk.Release(10)
	}()
	// Is the queue still usable (lock released)?
	done := make(chan struct{})
	go func() { q.SetHealthy(1); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("queue deadlocked: SetHealthy did not return within 30s: q.mu left locked by the panic")
	}
}

// Removing then re-adding the fallback forgets the in-flight count: the
// old fallback ticket's completion drives fb.inflight negative, so the
// fallback then runs more than its slots.
func TestFallbackReaddedOverCapacity(t *testing.T) {
	clk := fq.NewManualClock(rt0)
	cfg := baseCfg()
	cfg.Fallback = &fq.FallbackConfig{Tenants: []string{"vip"}, MaxInflight: 1}
	q, _ := fq.New(cfg, clk)
	q.SetHealthy(0)
	q.SetFallbackHealthy(1)
	tk, _ := q.Enqueue(fq.Request{Tenant: "vip", Cost: 10})
	if !tk.Fallback() {
		t.Fatal("setup")
	}
	_ = q.Reconfigure(baseCfg())
	_ = q.Reconfigure(cfg) // fallback back, inflight 0 though one is in flight
	q.SetFallbackHealthy(1)
	tk2, _ := q.Enqueue(fq.Request{Tenant: "vip", Cost: 10})
	if tk2.Fallback() {
		t.Errorf("fallback with 1 slot runs 2 requests")
	}
	tk.Release(10)
	tk2.Release(10)
}

// Requeue (provider 429) refunds the tenant's tokens but not its request:
// with a 1 rpm tenant quota, a request the provider refused once is
// then held a minute by the tenant's own quota.
func TestRequeueChargesTenantRequestTwice(t *testing.T) {
	clk := fq.NewManualClock(rt0)
	cfg := baseCfg()
	l, err := quota.Config{QPS: 2.0 / 60, BurstWindow: time.Millisecond, BurstAllow: 1}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Tenants["a"]
	a.Quota = l
	cfg.Tenants["a"] = a
	q, _ := fq.New(cfg, clk)
	q.SetHealthy(1)
	tk, _ := q.Enqueue(fq.Request{Tenant: "a", Cost: 10})
	if tk.Dispatched().IsZero() {
		t.Fatal("setup")
	}
	if !tk.Requeue() {
		t.Fatal("requeue")
	}
	if tk.Dispatched().IsZero() {
		st, _ := q.QuotaStatus("a")
		t.Errorf("requeued request held by its tenant's own quota after a provider 429 (status %+v)", st.Requests)
	}
	tk.Release(10)
}

// A request in flight when the queue is closed (a reload removed it; its
// ticker is stopped) gets a provider 429: Requeue must refuse, or the
// ticket would wait in a queue nothing dispatches or expires.
func TestRequeueAfterCloseHangs(t *testing.T) {
	clk := fq.NewManualClock(rt0)
	cfg := baseCfg()
	cfg.UpstreamQuota = &fq.UpstreamQuota{RPM: 600}
	q, _ := fq.New(cfg, clk)
	q.SetHealthy(1)
	tk, _ := q.Enqueue(fq.Request{Tenant: "a", Cost: 10, Deadline: rt0.Add(2 * time.Second)})
	if tk.Dispatched().IsZero() {
		t.Fatal("setup")
	}
	q.Close("removed by reload") // Destruct; the ticker stops
	tk.AccountExhausted(rt0.Add(time.Minute))
	if tk.Requeue() {
		t.Fatal("Requeue on a closed queue reported true: nobody would dispatch or expire the ticket")
	}
	// The ticket is still in flight: its owner answers and releases it.
	if err := tk.Wait(context.Background()); err != nil {
		t.Fatalf("Wait on the in-flight ticket: %v", err)
	}
	tk.Release(0)
}

// store: Peek allows, Charge refuses (another gateway charged the tenant
// in between, or Fallback's seen-at-rest shortcut answered the Peek).
type racyStore struct {
	*quota.Memory
	charges int
}

func (s *racyStore) Peek(ctx context.Context, tenant string, l *quota.Limits, b quota.Backlog) (quota.Decision, error) {
	if tenant == "a" {
		return quota.Decision{Allowed: true, At: rt0}, nil
	}
	return s.Memory.Peek(ctx, tenant, l, b)
}
func (s *racyStore) Charge(ctx context.Context, tenant string, l *quota.Limits, tok int64) (quota.Decision, error) {
	if tenant == "a" {
		s.charges++
		return quota.Decision{Allowed: false, At: rt0.Add(time.Minute), RetryAfter: time.Minute}, nil
	}
	return s.Memory.Charge(ctx, tenant, l, tok)
}

func TestUpstreamPathDispatchesWhenChargeRefuses(t *testing.T) {
	clk := fq.NewManualClock(rt0)
	cfg := baseCfg()
	cfg.UpstreamQuota = &fq.UpstreamQuota{RPM: 6000}
	st := &racyStore{Memory: quota.NewMemory(clk.Now)}
	cfg.QuotaStore = st
	l, _ := quota.Config{QPS: 1, BurstWindow: time.Second, BurstAllow: 1}.Compile()
	a := cfg.Tenants["a"]
	a.Quota = l
	cfg.Tenants["a"] = a
	q, _ := fq.New(cfg, clk)
	q.SetHealthy(1)
	tk, _ := q.Enqueue(fq.Request{Tenant: "a", Cost: 10})
	if !tk.Dispatched().IsZero() {
		_, charged := tk.QuotaStatus()
		t.Errorf("dispatched although the tenant's quota refused the charge (charged=%v, charges=%d)", charged, st.charges)
	}
}
