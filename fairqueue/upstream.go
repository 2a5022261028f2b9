package fairqueue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// The upstream provider account's quota (seed 003): when the gateway fronts
// a provider rather than its own GPUs, the bottleneck is the account's
// requests and tokens per minute. Dispatch is gated by it as by slots: a
// request goes only when a slot is free and the account has room for its
// estimate, which is pre-deducted at dispatch and reconciled with the
// actual usage at completion. Unlike a tenant quota, the request's own
// size counts before it starts (quota.Decide behind a backlog of itself):
// a request is never sent beyond what the account allows, or the provider
// would answer 429.
//
// Reservations. A tenant with TenantConfig.Reserve r draws from a meter
// of its own at r times the account's rates, first; the rest of the
// account, (1 - the sum of the reservations) times its rates, is the shared
// pool every tenant draws from. What is lent: when the pool cannot take a
// request, it may borrow from a reservation whose debt stays within half
// of its burst after the charge, so a reservation its tenant leaves unused
// lends its rate; what is held back: the other half of each reservation's
// burst (UpstreamQuota.Burst x r x the rates), which its tenant can always
// draw at once, so a reserved tenant's first request never waits for the
// pool to refill. While the pool is exhausted, dispatch goes on for
// reserved tenants on their reservations, in tag order among them.
//
// The account can also be exhausted by the provider's own word
// (AccountExhausted: its 429, or x-ratelimit-remaining-* at 0): then
// nothing is dispatched to it until the time the provider gave.

// UpstreamQuota is a provider account's limits.
type UpstreamQuota struct {
	// RPM and TPM are the account's requests and tokens per minute; 0
	// meters nothing in that dimension (at least one must be set).
	RPM, TPM float64
	// Burst is how far ahead of its rates the account may be drawn: a
	// full Burst of its rates may go at once after an idle period. Default
	// DefaultUpstreamBurst.
	Burst time.Duration
}

// DefaultUpstreamBurst is UpstreamQuota.Burst when unset: a tenth of the
// minute providers count in, so the gateway never front-loads a minute's
// quota the provider may enforce over shorter windows.
const DefaultUpstreamBurst = 6 * time.Second

// Store keys of the account's meters, apart from any tenant's name (a
// tenant name cannot contain a NUL: the handler refuses control bytes).
const (
	upstreamPoolKey    = "\x00upstream"
	upstreamReservePfx = "\x00reserve\x00"
)

// upstream is the account as the queue applies it.
type upstream struct {
	pool *quota.Limits
	// reserved tenants, sorted, with their meters: res at the reserved
	// rates and burst, lend at the same rates with half the burst (what
	// others may borrow).
	names []string
	res   map[string]*quota.Limits
	lend  map[string]*quota.Limits
	// until: the provider said the account is exhausted until then;
	// poolUntil: the pool cannot take the request at the head of tag order
	// until then.
	until, poolUntil time.Time
}

func (u UpstreamQuota) limits(share float64) (*quota.Limits, error) {
	burst := u.Burst
	if burst == 0 {
		burst = DefaultUpstreamBurst
	}
	return quota.Config{QPS: share * u.RPM / 60, TokensPerMin: share * u.TPM,
		BurstWindow: burst, BurstAllow: 1}.Compile()
}

// newUpstream compiles cfg's account and reservations, keeping old's
// exhaustion times (a reload does not make the provider forget).
func newUpstream(cfg *Config, old *upstream) (*upstream, error) {
	uq := cfg.UpstreamQuota
	if uq == nil {
		return nil, nil
	}
	if uq.RPM < 0 || uq.TPM < 0 || uq.Burst < 0 || (uq.RPM == 0 && uq.TPM == 0) {
		return nil, fmt.Errorf("upstream_quota: want rpm and/or tpm > 0 and a burst >= 0, got rpm %v tpm %v burst %v", uq.RPM, uq.TPM, uq.Burst)
	}
	u := &upstream{res: map[string]*quota.Limits{}, lend: map[string]*quota.Limits{}}
	reserved := 0.0
	for name, tc := range cfg.Tenants {
		if tc.Reserve == 0 {
			continue
		}
		if !(tc.Reserve > 0 && tc.Reserve < 1) {
			return nil, fmt.Errorf("tenant %q: reserve %v must be a fraction of the upstream quota in (0, 1)", name, tc.Reserve)
		}
		reserved += tc.Reserve
		res, err := uq.limits(tc.Reserve)
		if err != nil {
			return nil, fmt.Errorf("tenant %q: reserve: %w", name, err)
		}
		half := *uq
		half.Burst = max((half.Burst+1)/2, 1)
		if uq.Burst == 0 {
			half.Burst = DefaultUpstreamBurst / 2
		}
		lend, err := half.limits(tc.Reserve)
		if err != nil {
			return nil, fmt.Errorf("tenant %q: reserve: %w", name, err)
		}
		u.names = append(u.names, name)
		u.res[name], u.lend[name] = res, lend
	}
	if cfg.Default.Reserve != 0 {
		return nil, fmt.Errorf("default_tenant: reserve is for declared tenants (a reservation shared by unknown callers reserves nothing)")
	}
	if reserved >= 0.95 {
		return nil, fmt.Errorf("tenants reserve %.0f%% of the upstream quota together; leave at least 5%% shared", 100*reserved)
	}
	pool, err := uq.limits(1 - reserved)
	if err != nil {
		return nil, fmt.Errorf("upstream_quota: %w", err)
	}
	u.pool = pool
	slices.Sort(u.names)
	if old != nil {
		u.until, u.poolUntil = old.until, old.poolUntil
	}
	return u, nil
}

// fits asks the store whether a request of tokens fits meter key now,
// counting its own size (see the file comment); store errors let it go. A
// request larger than the burst fits a meter at rest, or it never would.
func (q *Queue) fitsLocked(key string, l *quota.Limits, tokens int64) (quota.Decision, bool) {
	d, ok := q.fitsStrictLocked(key, l, tokens)
	if ok {
		return d, true
	}
	return d, restedStatus(d.Status)
}

// fitsStrictLocked is fitsLocked without the exception for a meter at
// rest: what a reservation lends must leave half its burst, whatever the
// request's size.
//
// It reads the meters' standing (one read) and tests debt + the request's
// own increment against the tolerance on each, rather than a Peek behind
// a backlog of the request itself: a cluster store scales a backlog by
// the gateway count (it stands for the others' queues), which the request
// itself is not. The Decision carries the Status, and RetryAfter is how
// long until the request fits.
func (q *Queue) fitsStrictLocked(key string, l *quota.Limits, tokens int64) (quota.Decision, bool) {
	st, err := q.quotaStoreLocked().Status(context.Background(), key, l)
	if err != nil {
		return quota.Decision{Allowed: true}, true
	}
	d := quota.Decision{Status: st, Allowed: true}
	for _, dim := range []quota.Dimension{quota.DimQPS, quota.DimTokens, quota.DimJoint} {
		m := st.Meter(dim)
		if !m.Enabled {
			continue
		}
		if over := m.Reset + l.Increment(dim, tokens) - l.Tolerance(); over > 0 {
			d.Allowed = false
			if over > d.RetryAfter {
				d.RetryAfter, d.Reason = over, dim
			}
		}
	}
	return d, d.Allowed
}

// drawLocked charges tk's estimate to meter key and records it on the
// ticket for reconciliation.
func (q *Queue) drawLocked(tk *Ticket, key string, l *quota.Limits) bool {
	d, err := q.quotaStoreLocked().Charge(context.Background(), key, l, tk.tokens)
	switch {
	case err != nil:
		return true // a store that fails lets the request go, uncharged
	case !d.Allowed && !restedStatus(d.Status):
		// A shared store: another gateway drew on the account since the
		// Peek. No room after all.
		return false
	}
	c := tk.chargeRecordLocked()
	c.upKey, c.upLimits = key, l
	return true
}

// restedStatus reports whether a meter's status shows it at rest: a
// request larger than the burst may then go (fitsLocked).
func restedStatus(st quota.Status) bool {
	return st.Requests.Reset == 0 && st.Tokens.Reset == 0 && st.Joint.Reset == 0
}

// refundUpstreamLocked takes tk's whole draw back from the account: a
// request drawn for but never sent.
func (q *Queue) refundUpstreamLocked(tk *Ticket) {
	if tk.upLimits() == nil {
		return
	}
	_, _ = q.quotaStoreLocked().Refund(context.Background(), tk.ch.upKey, tk.ch.upLimits, tk.tokens)
	tk.ch.upLimits = nil
}

// upstreamChargeLocked finds room for tk in the account: the tenant's
// reservation, then the shared pool, then what a reservation lends. It
// reports false, charging nothing, when there is none; the pool is then
// exhausted until the time it could take tk.
func (q *Queue) upstreamChargeLocked(now time.Time, tk *Ticket) bool {
	u := q.up
	name := tk.t.name
	if l := u.res[name]; l != nil && tk.t.known {
		if _, ok := q.fitsLocked(upstreamReservePfx+name, l, tk.tokens); ok && q.drawLocked(tk, upstreamReservePfx+name, l) {
			return true
		}
	}
	if now.Before(u.poolUntil) {
		return false
	}
	d, ok := q.fitsLocked(upstreamPoolKey, u.pool, tk.tokens)
	if ok && q.drawLocked(tk, upstreamPoolKey, u.pool) {
		return true
	}
	for _, r := range u.names {
		if r == name {
			continue
		}
		if _, ok := q.fitsStrictLocked(upstreamReservePfx+r, u.lend[r], tk.tokens); ok && q.drawLocked(tk, upstreamReservePfx+r, u.res[r]) {
			return true
		}
	}
	// The store's time may be another clock (Redis): only the wait counts.
	u.poolUntil = now.Add(max(d.RetryAfter, time.Millisecond))
	return false
}

// reservedNextLocked is what may go while the pool is exhausted: among the
// reserved tenants eligible for dispatch, the head request with the
// smallest finish tag that its reservation can take, charged to it. nil
// when none can go. O(reserved tenants x their classes).
func (q *Queue) reservedNextLocked(now time.Time) *Ticket {
	u := q.up
	best := q.bestHeadLocked(now, u.names, func(tk *Ticket) bool {
		_, ok := q.fitsLocked(upstreamReservePfx+tk.t.name, u.res[tk.t.name], tk.tokens)
		return ok
	})
	if best != nil && !q.drawLocked(best, upstreamReservePfx+best.t.name, u.res[best.t.name]) {
		return nil
	}
	return best
}

// bestHeadLocked is, among the named tenants eligible for dispatch, the
// flow head with the smallest finish tag that ok accepts, passing over
// heads whose deadline has come (Tick expires them). ok is asked only of
// a head that would be the best so far. O(names x classes): the lists it
// serves (reserved tenants, the fallback's) are a few VIPs.
func (q *Queue) bestHeadLocked(now time.Time, names []string, ok func(*Ticket) bool) *Ticket {
	var best *Ticket
	var bestKey flowEntry
	for _, name := range names {
		t := q.tenants[name]
		if t == nil || t.queued == 0 || t.out {
			continue
		}
		for _, f := range t.flows {
			tk := f.q.head
			if tk == nil || !tk.deadline.IsZero() && !now.Before(tk.deadline) {
				continue
			}
			e := flowEntry{start: t.vt, finish: t.vt + float64(tk.cost)/t.weight, seq: f.seq}
			if (best == nil || e.before(&bestKey)) && ok(tk) {
				best, bestKey = tk, e
			}
		}
	}
	return best
}

// reconcileUpstreamLocked corrects tk's draw on the account with its
// actual tokens (0 for a request the provider refused).
func (q *Queue) reconcileUpstreamLocked(tk *Ticket, actual int64) {
	if tk.upLimits() == nil || actual < 0 {
		return
	}
	_, _ = q.quotaStoreLocked().Reconcile(context.Background(), tk.ch.upKey, tk.ch.upLimits, tk.tokens, actual)
	tk.ch.upLimits = nil
}

// AccountExhausted records that the provider declared the account out of
// quota until the given time (its 429's Retry-After, or a reset time with
// nothing remaining): nothing is dispatched to it before then.
func (q *Queue) AccountExhausted(until time.Time) {
	q.mu.Lock()
	if q.up != nil && until.After(q.up.until) {
		q.up.until = until
	}
	q.unlock()
}

// UpstreamStatus is the account's state for metrics and reports.
type UpstreamStatus struct {
	Configured bool
	// Pool is the shared pool's standing; Reserved each reservation's.
	Pool     quota.Status
	Reserved map[string]quota.Status
	// ExhaustedFor is how long the provider still declares the account
	// out of quota (0 when it does not).
	ExhaustedFor time.Duration
}

// Upstream returns the account's state.
func (q *Queue) Upstream() UpstreamStatus {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.up
	if u == nil {
		return UpstreamStatus{}
	}
	s := q.quotaStoreLocked()
	st := UpstreamStatus{Configured: true, Reserved: make(map[string]quota.Status, len(u.names)),
		ExhaustedFor: max(u.until.Sub(q.clock.Now()), 0)}
	st.Pool, _ = s.Status(context.Background(), upstreamPoolKey, u.pool)
	for _, name := range u.names {
		st.Reserved[name], _ = s.Status(context.Background(), upstreamReservePfx+name, u.res[name])
	}
	return st
}

// Requeue puts a dispatched ticket whose upstream refused it for want of
// quota (a provider 429) back at the head of its tenant's queue: it frees
// its slot, is not charged to its tenant (its tenant quota and the account
// are refunded its tokens), and is dispatched again when the account has
// room, or ends by its deadline like any queued request. Its owner calls
// Wait again. It reports false when the ticket is not in flight.
func (tk *Ticket) Requeue() bool {
	q := tk.q
	q.mu.Lock()
	if tk.state != stateInflight {
		q.mu.Unlock()
		return false
	}
	if q.closed != "" {
		// Nobody ticks or dispatches a closed queue: the owner answers.
		q.mu.Unlock()
		return false
	}
	now := q.clock.Now()
	t := tk.t
	// Not charged to its tenant, the request itself included; the
	// provider counted the request it refused, not its tokens.
	if tk.quotaLimits() != nil {
		_, _ = q.quotaStoreLocked().Refund(context.Background(), t.name, tk.ch.quota, tk.tokens)
		tk.ch.quota = nil
	}
	q.reconcileUpstreamLocked(tk, 0)
	if !tk.fallback {
		q.adm.cold.Abandon(tk.dispatchedLocked(), float64(tk.cost))
	}
	q.leaveSlotLocked(tk)
	tk.fallback, tk.boosted = false, false
	// Not charged: the service it was charged at dispatch is refunded as
	// credit, as an over-estimate's would be.
	d := -float64(tk.cost)
	t.served += d
	q.noteServedLocked(t, d)
	t.backfillLocked(d)
	if g := t.group; g != nil {
		g.backfillLocked(d)
	}
	q.capLocked(t)
	tk.state, tk.ready, tk.dispatched = stateQueued, nil, 0
	f := tk.f
	f.out -= tk.cost
	tk.mark = f.out
	f.q.pushFront(tk)
	if !t.out {
		q.linkFlowLocked(f)
	}
	q.countLocked(tk, 1)
	if !tk.deadline.IsZero() {
		q.deadlines.push(tk)
	}
	q.dispatchLocked(now)
	q.unlock()
	return true
}
