package quota

import (
	"context"
	"sync"
	"time"
)

// DefaultSweepEvery is how often, in clock time, Memory forgets tenants at
// rest.
const DefaultSweepEvery = time.Minute

// Memory is the in-process Store: one mutex over a map of tenants' TATs.
// Tenants at rest are forgotten by a sweep at most every DefaultSweepEvery,
// which changes no decision. Peek and Status never add a tenant.
type Memory struct {
	clock func() time.Time
	epoch time.Time // time line origin: now is clock().Sub(epoch)

	mu        sync.Mutex
	tenants   map[string]TATs // guarded by mu
	leads     map[string]lead // guarded by mu: Book's leads
	nextSweep int64           // guarded by mu
	sweepGap  int64
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory reading time from clock. Times are
// clock().Sub(first reading), so a wall-clock step does not move the meters.
func NewMemory(clock func() time.Time) *Memory {
	return &Memory{
		clock:    clock,
		epoch:    clock(),
		tenants:  make(map[string]TATs),
		leads:    make(map[string]lead),
		sweepGap: int64(DefaultSweepEvery),
	}
}

// nowLocked reads the clock and sweeps when a sweep is due. The clock is
// read under the lock so that decisions are ordered as their times are.
func (m *Memory) nowLocked() int64 {
	now := int64(m.clock().Sub(m.epoch))
	if now >= m.nextSweep {
		for k, t := range m.tenants {
			if t.Rested(now) {
				delete(m.tenants, k)
			}
		}
		for k, ld := range m.leads {
			if _, ok := m.tenants[k]; !ok || now-ld.at > int64(LeadMemory) {
				delete(m.leads, k)
			}
		}
		m.nextSweep = now + m.sweepGap
	}
	return now
}

// stateLocked reads the clock (nowLocked) and tenant's state.
func (m *Memory) stateLocked(tenant string) (int64, TATs) {
	now := m.nowLocked()
	if t, ok := m.tenants[tenant]; ok {
		return now, t
	}
	return now, Fresh(now)
}

// writeLocked is stateLocked for a call that writes: a tenant found at
// rest forgets its lead (see Store.Book).
func (m *Memory) writeLocked(tenant string) (int64, TATs) {
	now, t := m.stateLocked(tenant)
	if t.Rested(now) {
		delete(m.leads, tenant)
	}
	return now, t
}

func (m *Memory) decision(ok bool, at int64, reason Dimension, t *TATs, l *Limits, now int64) Decision {
	return Decision{
		Allowed:    ok,
		At:         m.epoch.Add(time.Duration(at)),
		RetryAfter: time.Duration(at - now),
		Reason:     reason,
		Status:     StatusOf(t, l, now),
	}
}

// Peek implements Store.
func (m *Memory) Peek(_ context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.stateLocked(tenant)
	ok, at, reason := Decide(&t, l, now, ahead)
	return m.decision(ok, at, reason, &t, l, now), nil
}

// Charge implements Store.
func (m *Memory) Charge(_ context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.writeLocked(tenant)
	ok, at, reason := Decide(&t, l, now, Backlog{})
	if ok {
		Charge(&t, l, now, tokens)
		m.tenants[tenant] = t
	}
	return m.decision(ok, at, reason, &t, l, now), nil
}

// Book implements Store.
func (m *Memory) Book(_ context.Context, tenant string, l *Limits, tokens int64, maxWait, given time.Duration) (Decision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.stateLocked(tenant)
	ld := bookLead(m.leads[tenant], int64(given), now, t.Rested(now))
	if ld.d > 0 {
		m.leads[tenant] = ld
	} else {
		delete(m.leads, tenant)
	}
	ok, at, reason := Book(&t, l, now, tokens, max(int64(min(maxWait, MaxBookWait))-ld.d, 0))
	if ok {
		m.tenants[tenant] = t
	}
	return m.decision(ok, at, reason, &t, l, now), nil
}

// Reconcile implements Store.
func (m *Memory) Reconcile(_ context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	return m.correct(tenant, l, func(t *TATs, now int64) { Reconcile(t, l, now, estimated, actual) })
}

// Refund implements Store.
func (m *Memory) Refund(_ context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	return m.correct(tenant, l, func(t *TATs, now int64) { Refund(t, l, now, tokens) })
}

// Status implements Store.
func (m *Memory) Status(_ context.Context, tenant string, l *Limits) (Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.stateLocked(tenant)
	return StatusOf(&t, l, now), nil
}

// Len is the number of tenants held (those not yet forgotten).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.tenants)
}

// Add implements Syncer: a batch of charges decided elsewhere, added
// without a test (see the package function Add).
func (m *Memory) Add(_ context.Context, tenant string, l *Limits, requests, tokens int64) (Status, error) {
	return m.correct(tenant, l, func(t *TATs, now int64) { Add(t, l, now, requests, tokens) })
}

// correct applies change, a correction without a test, to tenant's
// meters, forgetting them once at rest.
func (m *Memory) correct(tenant string, l *Limits, change func(t *TATs, now int64)) (Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.writeLocked(tenant)
	change(&t, now)
	if t.Rested(now) {
		delete(m.tenants, tenant)
	} else {
		m.tenants[tenant] = t
	}
	return StatusOf(&t, l, now), nil
}

// raise puts tenant's enabled meters at least debt[i] ahead of now,
// lowering none (Mirror.holdBack).
func (m *Memory) raise(tenant string, l *Limits, debt [numDims]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, t := m.stateLocked(tenant)
	changed := false
	for i := 0; i < numDims; i++ {
		if l.interval[i] != 0 && debt[i] > 0 && now+debt[i] > t[i] {
			t[i], changed = now+debt[i], true
		}
	}
	if changed {
		m.tenants[tenant] = t
	}
}
