package fairqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// quotaConfig gives tenant "a" the quota c; "b" has none.
func quotaConfig(c quota.Config) Config {
	cfg := testConfig(10, map[string]float64{"a": 1, "b": 1})
	a := cfg.Tenants["a"]
	a.Quota = quota.MustCompile(c)
	cfg.Tenants["a"] = a
	return cfg
}

func dispatchedCount(h *harness, tenant string) int {
	n := 0
	for tk := range h.dispatched {
		if tk.Tenant() == tenant {
			n++
		}
	}
	return n
}

// A tenant over its quota waits in its queue without holding a slot: the
// others take the capacity, and its next request goes exactly when its
// quota allows (at the first event or Tick at or after that time).
func TestQuotaHoldsTenantNotSlot(t *testing.T) {
	h := newHarness(t, quotaConfig(quota.Config{QPS: 1}), 1, 1)
	for i := 0; i < 3; i++ {
		h.enqueue(Request{Tenant: "a", Cost: 10})
	}
	if got := dispatchedCount(h, "a"); got != 1 {
		t.Fatalf("a: %d dispatched at t0, want 1 (qps 1, no burst)", got)
	}
	for i := 0; i < 20; i++ {
		h.enqueue(Request{Tenant: "b", Cost: 10})
	}
	if got := dispatchedCount(h, "b"); got != 9 {
		t.Fatalf("b: %d dispatched, want the 9 slots a does not use", got)
	}
	h.completeOldest() // frees a slot: a is held, so b takes it
	if got := dispatchedCount(h, "b"); got != 10 {
		t.Fatalf("b: %d dispatched after a completion, want 10", got)
	}
	h.clk.Set(t0.Add(time.Second - time.Nanosecond))
	h.completeOldest()
	h.q.Tick()
	if got := dispatchedCount(h, "a"); got != 1 {
		t.Fatalf("a: dispatched 1 ns before its quota allows (%d)", got)
	}
	h.clk.Set(t0.Add(time.Second))
	h.completeOldest()
	if got := dispatchedCount(h, "a"); got != 2 {
		t.Fatalf("a: %d dispatched at 1 s, want 2", got)
	}
	h.checkConservation()
}

// At admission the quota's earliest time behind the tenant's own queue is
// part of the ETA; a request it cannot allow before its deadline is refused
// at once, with the exact time as RetryAfter (not capped at
// budget.MaxRetryAfter) and the binding meter named.
func TestQuotaAdmission(t *testing.T) {
	h := newHarness(t, quotaConfig(quota.Config{QPS: 1}), 1, 1)
	dl := t0.Add(2600 * time.Millisecond) // less ExpiryMargin: 2.1 s
	var tks []*Ticket
	for i := 0; i < 3; i++ {
		tks = append(tks, h.enqueue(Request{Tenant: "a", Cost: 10, Deadline: dl}))
	}
	for i, want := range []time.Duration{0, time.Second, 2 * time.Second} {
		if tks[i].QuotaWait() != want || tks[i].ETA() < want {
			t.Fatalf("request %d: quota wait %v, ETA %v; want %v", i, tks[i].QuotaWait(), tks[i].ETA(), want)
		}
	}
	for i := 0; i < 2; i++ {
		_, err := h.tryEnqueue(Request{Tenant: "a", Cost: 10, Deadline: dl})
		var rej *Rejection
		if !errors.As(err, &rej) || rej.Reason != ReasonQuotaExceeded || rej.Quota != quota.DimQPS ||
			rej.RetryAfter != 3*time.Second || rej.QuotaStatus == nil {
			t.Fatalf("4th request behind 2 queued: %#v, want quota_exceeded on qps, RetryAfter exactly 3s", err)
		}
	}
	// Without a deadline a request waits however long its quota holds it.
	long := h.enqueue(Request{Tenant: "a", Cost: 10})
	if long.QuotaWait() != 3*time.Second {
		t.Fatalf("no deadline: quota wait %v, want 3s", long.QuotaWait())
	}
	// The refusal's RetryAfter is exact: at 3 s, with the queue served as
	// the quota allows, that request goes.
	for _, at := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		h.clk.Set(t0.Add(at))
		h.q.Tick()
	}
	if got := dispatchedCount(h, "a"); got != 4 {
		t.Fatalf("a: %d dispatched by 3 s, want 4", got)
	}
	h.checkConservation()
}

// The charge at dispatch is the estimate; completion reconciles it with the
// actual tokens, so an over-estimate's refund lets the next request go
// earlier, and the status each dispatched ticket carries shows the charge.
func TestQuotaReconcileAndStatus(t *testing.T) {
	h := newHarness(t, quotaConfig(quota.Config{TokensPerMin: 60000}), 1, 1) // 1000 tokens/s
	tk := h.enqueue(Request{Tenant: "a", Cost: 2000})
	st, ok := tk.QuotaStatus()
	if !ok || !st.Tokens.Enabled || st.Tokens.Limit != 60000 || st.Tokens.Reset != 2*time.Second {
		t.Fatalf("status after a 2000-token charge: %+v ok %v; want TPM 60000, reset 2s", st, ok)
	}
	next := h.enqueue(Request{Tenant: "a", Cost: 100})
	if next.QuotaWait() != 2*time.Second {
		t.Fatalf("next request: quota wait %v, want 2s", next.QuotaWait())
	}
	h.actual = func(*Ticket) int64 { return 500 }
	h.completeOldest() // 1500 tokens refunded: the debt is 0.5 s
	h.clk.Set(t0.Add(500 * time.Millisecond))
	h.q.Tick()
	if got := dispatchedCount(h, "a"); got != 2 {
		t.Fatalf("a: %d dispatched at 0.5 s after the refund, want 2", got)
	}
	if _, ok := h.q.QuotaStatus("b"); ok {
		t.Fatal("b has no quota but QuotaStatus says it has")
	}
}

// A reload that lifts a tenant's quota ends its hold at once; a held
// tenant whose queue is cancelled is forgotten like any idle tenant.
func TestQuotaReloadAndForget(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 0.1})
	cfg.IdleForget = time.Second
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 1})
	held := h.enqueue(Request{Tenant: "a", Cost: 1})
	if held.Dispatched() != (time.Time{}) {
		t.Fatal("second request dispatched within a 0.1 qps quota")
	}
	free := testConfig(10, map[string]float64{"a": 1, "b": 1})
	if err := h.q.Reconfigure(free); err != nil {
		t.Fatal(err)
	}
	if got := dispatchedCount(h, "a"); got != 2 {
		t.Fatalf("after the reload lifted the quota: %d dispatched, want 2", got)
	}
	if err := h.q.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	h.completeOldest()
	h.completeOldest()
	c := h.enqueue(Request{Tenant: "a", Cost: 1}) // held: 2 charges at 0.1 qps
	c.Release(UnknownCost)
	h.clk.Set(t0.Add(5 * time.Second))
	h.q.Tick()
	if n := h.q.Stats(false).Remembered; n != 0 {
		t.Fatalf("%d tenants remembered after idle_forget, want 0", n)
	}
	if len(h.q.held) != 0 {
		t.Fatalf("%d tenants still held after being forgotten", len(h.q.held))
	}
}

// A quota whose weight follows the learned cost model is recompiled with
// the new weight; one with its own weight is not; stored meters are kept.
func TestSetQuotaWeight(t *testing.T) {
	cfg := quotaConfig(quota.Config{QPS: 10, JointCap: 1, TokenToQPSWeight: 0.0008})
	a := cfg.Tenants["a"]
	a.QuotaAutoWeight = true
	cfg.Tenants["a"] = a
	b := cfg.Tenants["b"]
	b.Quota = quota.MustCompile(quota.Config{QPS: 10, JointCap: 1, TokenToQPSWeight: 0.0008})
	cfg.Tenants["b"] = b
	h := newHarness(t, cfg, 1, 1)
	h.enqueue(Request{Tenant: "a", Cost: 1000})
	h.q.SetQuotaWeight(0.01)
	got := h.q.Config().Tenants["a"].Quota.Config().TokenToQPSWeight
	if got != 0.01 {
		t.Fatalf("a's weight %v after SetQuotaWeight(0.01), want 0.01", got)
	}
	if w := h.q.Config().Tenants["b"].Quota.Config().TokenToQPSWeight; w != 0.0008 {
		t.Fatalf("b's own weight changed to %v", w)
	}
	// The remembered tenant uses the new limits: a 1000-token request now
	// costs 11 request-equivalents on a 10/s joint meter.
	if inc := h.q.tenants["a"].cfg.Quota.Increment(quota.DimJoint, 1000); inc != 1100*time.Millisecond {
		t.Fatalf("joint increment %v, want 1.1s", inc)
	}
	st, _ := h.q.QuotaStatus("a")
	if st.Joint.Reset <= 0 {
		t.Fatalf("the stored meter was lost: %+v", st.Joint)
	}
}

// twoGatewaysOneQuota is two queues with fast-fail (gateways a and b)
// whose tenant "a" has a quota of 1 request a second kept in one store
// they share, as the cluster's Redis would be; set moves all their clocks.
func twoGatewaysOneQuota(t *testing.T) (a, b *harness, set func(time.Duration)) {
	t.Helper()
	cfg := quotaConfig(quota.Config{QPS: 1})
	cfg.Admission.FastFail = true
	clk := NewManualClock(t0)
	cfg.QuotaStore = quota.NewMemory(clk.Now)
	a, b = newHarness(t, cfg, 1, 1), newHarness(t, cfg, 1, 2)
	return a, b, func(d time.Duration) {
		clk.Set(t0.Add(d))
		a.clk.Set(t0.Add(d))
		b.clk.Set(t0.Add(d))
	}
}

// A request admitted to wait for its quota whose quota is then spent
// elsewhere (another gateway charging the same meters in a shared store)
// is refused at once when its tenant is held past its deadline, with the
// quota's 429 and the hold's end as Retry-After, not left to wait out its
// budget for a queue_timeout.
func TestQuotaHeldPastDeadlineRefusedAtOnce(t *testing.T) {
	a, b, set := twoGatewaysOneQuota(t)
	b.enqueue(Request{Tenant: "a", Cost: 10}) // dispatched at 0: next at 1 s
	// Fits at admission: allowed at 1 s, before its deadline less the 0.5 s
	// expiry margin (1.1 s).
	late := b.enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(1600 * time.Millisecond)})
	keep := b.enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(5 * time.Second)})
	if late.Err() != nil || dispatchedCount(b, "a") != 1 {
		t.Fatalf("admission: err %v, %d dispatched; want queued behind the first", late.Err(), dispatchedCount(b, "a"))
	}
	// At 1 s the other gateway takes the quota first; b's next chance is 2 s.
	set(time.Second)
	a.enqueue(Request{Tenant: "a", Cost: 10})
	if dispatchedCount(a, "a") != 1 {
		t.Fatal("the other gateway did not dispatch at 1 s")
	}
	b.q.Tick()
	var rej *Rejection
	if !errors.As(late.Err(), &rej) || rej.Reason != ReasonQuotaExceeded || rej.RetryAfter != time.Second || rej.Quota != quota.DimQPS || !rej.WhileQueued {
		t.Fatalf("the request held past its deadline: err %v, want quota_exceeded (qps) with Retry-After 1s at once", late.Err())
	}
	if keep.Err() != nil {
		t.Fatalf("the request whose deadline the hold leaves time for was refused: %v", keep.Err())
	}
	set(2 * time.Second)
	b.q.Tick()
	if dispatchedCount(b, "a") != 2 {
		t.Fatalf("b dispatched %d of a at 2 s, want the kept request too", dispatchedCount(b, "a"))
	}
	a.drain(1)
	b.drain(1)
}

// lockProbeStore is a Memory that records whether the queue's lock was
// held when Reconcile was called.
type lockProbeStore struct {
	*quota.Memory
	q          *Queue
	reconciles int
	underLock  int
}

func (s *lockProbeStore) Reconcile(ctx context.Context, tenant string, l *quota.Limits, estimated, actual int64) (quota.Status, error) {
	s.reconciles++
	if s.q.mu.TryLock() {
		s.q.mu.Unlock()
	} else {
		s.underLock++
	}
	return s.Memory.Reconcile(ctx, tenant, l, estimated, actual)
}

// With a shared store (Redis), a completion reconciles after the queue's
// lock is released, and the refund still ends the tenant's hold: its next
// request, held on the estimate, goes as soon as the refund lands.
func TestSharedStoreReconcilesOffLock(t *testing.T) {
	cfg := quotaConfig(quota.Config{TokensPerMin: 600}) // 10 tokens a second
	var clk *ManualClock                                // the harness's, once it exists
	store := &lockProbeStore{Memory: quota.NewMemory(func() time.Time {
		if clk == nil {
			return t0
		}
		return clk.Now()
	})}
	cfg.QuotaStore = store
	h := newHarness(t, cfg, 1, 1)
	clk, store.q = h.clk, h.q
	h.enqueue(Request{Tenant: "a", Cost: 600}) // the minute's tokens
	held := h.enqueue(Request{Tenant: "a", Cost: 10})
	if dispatchedCount(h, "a") != 1 {
		t.Fatalf("%d of a dispatched, want the first only (the second waits a minute for tokens)", dispatchedCount(h, "a"))
	}
	// It used 10 of its 600: with 590 back, the next 10 may go 1 s after
	// the first, not a minute.
	h.clk.Set(t0.Add(time.Second))
	h.actual = func(*Ticket) int64 { return 10 }
	h.completeOldest()
	if store.reconciles != 1 || store.underLock != 0 {
		t.Errorf("%d reconciles, %d of them under the queue's lock; want 1, none", store.reconciles, store.underLock)
	}
	if held.Dispatched().IsZero() {
		t.Fatal("the refund did not end the hold: the second request still waits")
	}
	h.drain(1)
}

// Review: a held tenant's request waiting in the boost lane (promoted
// near its deadline) is refused at once too, not left to expire.
func TestQuotaHeldRefusesBoosted(t *testing.T) {
	a, b, set := twoGatewaysOneQuota(t)
	b.enqueue(Request{Tenant: "a", Cost: 10}) // dispatched at 0: next at 1 s
	late := b.enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(1600 * time.Millisecond)})
	if !b.q.Promote(late) {
		t.Fatal("Promote: the request was not queued")
	}
	set(time.Second)
	a.enqueue(Request{Tenant: "a", Cost: 10}) // the other gateway spends the quota
	b.q.Tick()
	var rej *Rejection
	if !errors.As(late.Err(), &rej) || rej.Reason != ReasonQuotaExceeded || !rej.WhileQueued {
		t.Fatalf("the boosted request held past its deadline: err %v, want quota_exceeded while queued at once", late.Err())
	}
	a.drain(1)
	b.drain(1)
}

// TestQuotaRefusesEarlyOnLowEstimates: a tenant whose requests each cost
// its quota three times their estimate (a low output cap assumed), sending
// twice what its quota allows at their real cost. Every request the
// quota cannot start in time is refused within a quarter of its budget
// (at admission once the tenant's ratio is known, or from the queue as
// the completions show it), none waits out its budget (queue_timeout),
// none is dispatched late, and the quota stays busy: the refusals do not
// leave it idle (at least 90% of its rate is used over the run).
func TestQuotaRefusesEarlyOnLowEstimates(t *testing.T) {
	cfg := quotaConfig(quota.Config{TokensPerMin: 60000}) // 1000 actual tokens/s: 3.3 requests of 300
	cfg.Admission = DefaultBudgetConfig()
	cfg.MaxInflight = 100
	h := newHarness(t, cfg, 1, 1)
	h.actual = func(tk *Ticket) int64 { return 3 * tk.Tokens() }
	var refusedAfter []time.Duration
	timeouts := 0
	observe := h.observe
	h.q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventExpired {
			refusedAfter = append(refusedAfter, h.clk.Now().Sub(tk.Enqueued()))
			var rej *Rejection
			if errors.As(tk.Err(), &rej) && rej.Reason == ReasonQueueTimeout {
				timeouts++
			}
		}
		observe(ev, tk)
	})
	const budget = 8 * time.Second
	atAdmission := 0
	var used int64
	end := 30 * time.Second
	for at := time.Duration(0); at <= end+budget; at += 50 * time.Millisecond {
		h.clk.Set(t0.Add(at))
		for len(h.inflight) > 0 {
			used += h.actual(h.inflight[0])
			h.completeOldest()
		}
		if at < end && at%(150*time.Millisecond) == 0 { // 6.7 a second of 300 actual tokens: 2x
			if _, err := h.tryEnqueue(Request{Tenant: "a", Cost: 100, Deadline: t0.Add(at + budget)}); err != nil {
				atAdmission++
			}
		}
		h.q.Tick()
	}
	late := 0
	for _, d := range refusedAfter {
		if d > budget/4 {
			late++
		}
	}
	refused := atAdmission + len(refusedAfter)
	t.Logf("refused %d: %d at admission, %d from the queue (%d after a quarter of the budget, %d queue_timeout); %d actual tokens served in %v",
		refused, atAdmission, len(refusedAfter), late, timeouts, used, end+budget)
	if refused == 0 {
		t.Fatal("nothing refused: the load does not exceed the quota")
	}
	if timeouts != 0 || late != 0 {
		t.Errorf("%d refusals after a quarter of the budget, %d queue_timeout; want none", late, timeouts)
	}
	if float64(used) < 0.9*1000*(end+budget).Seconds() {
		t.Errorf("the quota served %d actual tokens in %v, want >= 90%% of its 1000/s", used, end+budget)
	}
	h.checkConservation()
}

// A request held by its tenant's quota is promised the quota's delay, at
// admission and at every re-check near its deadline, counted like the wait
// it is compared with: from admission. A re-check that predicted only its
// place in tag order (a free slot: no wait) promised a request that waited
// a second for its quota nothing at all.
func TestQuotaHeldETAIncludesTheQuotaDelay(t *testing.T) {
	cfg := budgetConfig(100)
	cfg.Tenants["a"] = TenantConfig{Weight: 1, Class: "batch", Quota: quota.MustCompile(quota.Config{QPS: 1})}
	h := newHarness(t, cfg, 1, 1)
	warm(h)
	h.enqueue(Request{Tenant: "a", Cost: 10})
	h.completeOldest()
	tk := h.enqueue(Request{Tenant: "a", Cost: 10, Deadline: t0.Add(1600 * time.Millisecond)})
	if tk.QuotaWait() != time.Second || tk.ETA() != time.Second {
		t.Fatalf("admission: quota wait %v, ETA %v; want 1s and 1s", tk.QuotaWait(), tk.ETA())
	}
	// Tag order alone puts it 275 ms away at the 100 tokens/s measured (the
	// re-check predicted that and nothing more before it counted the
	// quota): at 600 ms the quota binds (1 s in all), at 800 ms tag order
	// does (800 + 275 ms).
	for _, c := range []struct{ at, want time.Duration }{
		{600 * time.Millisecond, time.Second},
		{800 * time.Millisecond, 1075 * time.Millisecond},
	} {
		h.clk.Set(t0.Add(c.at))
		h.q.Tick() // re-checks tk: its deadline is near
		if tk.ETA() != c.want {
			t.Fatalf("re-check at %v: ETA %v, want %v since admission", c.at, tk.ETA(), c.want)
		}
	}
	h.clk.Set(t0.Add(time.Second))
	h.q.Tick()
	if !h.dispatched[tk] || tk.Dispatched().Sub(tk.Enqueued()) != time.Second {
		t.Fatalf("dispatched %v after %v; want at 1s, when the quota allowed it", h.dispatched[tk], tk.Dispatched().Sub(tk.Enqueued()))
	}
}
