package fairqueue

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// The upstream provider account's quota: a request goes only when a slot
// is free and the account has room for its estimate, drawn at dispatch and
// corrected at completion to what the provider counts. The meters are drawn
// so that no 60 s window of the provider's holds more than the limits
// (drawShare, provider.go). A tenant with TenantConfig.Reserve draws on a
// meter of its own, so its request goes at once even while shared traffic
// holds the account at its limit; shared traffic keeps a headroom
// (ReserveBurst) below the burst for it. The provider's own word
// (AccountExhausted, ProviderLevel) stops or caps dispatch until the time
// it gave.

// UpstreamQuota is a provider account's limits.
type UpstreamQuota struct {
	// RPM and TPM are the account's requests and tokens per minute; 0
	// meters nothing in that dimension (at least one must be set).
	RPM, TPM float64
	// Burst is how far ahead of its rates the shared traffic may draw the
	// account, inside the minute (see drawShare). Default
	// DefaultUpstreamBurst.
	Burst time.Duration
	// ReserveBurst is how much of its reservation's rate a reserved tenant
	// may draw at once, whatever the shared traffic does. Default
	// DefaultReserveBurst.
	ReserveBurst time.Duration
}

// DefaultUpstreamBurst is UpstreamQuota.Burst when unset: short, so that
// the gateway never front-loads a minute's quota the provider may enforce
// over shorter windows.
const DefaultUpstreamBurst = 2 * time.Second

// DefaultReserveBurst is UpstreamQuota.ReserveBurst when unset: a
// reservation holds a few of its tenant's requests at once.
const DefaultReserveBurst = 6 * time.Second

// providerWindow is the window providers count limits per minute over;
// providerGuard is how much later than the gateway sent it a provider may
// see a request.
const (
	providerWindow = time.Minute
	providerGuard  = time.Second
)

// burst is Burst, defaulted.
func (u UpstreamQuota) burst() time.Duration {
	if u.Burst == 0 {
		return DefaultUpstreamBurst
	}
	return u.Burst
}

// reserveBurst is ReserveBurst, defaulted.
func (u UpstreamQuota) reserveBurst() time.Duration {
	if u.ReserveBurst == 0 {
		return DefaultReserveBurst
	}
	return u.ReserveBurst
}

// drawShare is the share of the account's limits its meter is drawn at
// with a burst tolerance of tau. A meter at rate r with tolerance tau
// sends at most r x (D + tau) over any D, so with r = limit / (window +
// guard + tau) no window of the provider's, seen up to the guard late,
// holds more than the limit.
func drawShare(tau time.Duration) float64 {
	return providerWindow.Seconds() / (providerWindow + providerGuard + tau).Seconds()
}

// Store keys of the account's meters, apart from any tenant's name (a
// tenant name cannot contain a NUL: the handler refuses control bytes).
const (
	upstreamPoolKey    = "\x00upstream"
	upstreamReservePfx = "\x00reserve\x00"
)

// upstream is the account as the queue applies it.
type upstream struct {
	// acct is the account's meter, which every request sent is charged
	// to; shared draws leave it headroom.
	acct     *quota.Limits
	headroom time.Duration
	// reserved tenants, sorted, with their reservations: meters at their
	// share of the account's rates, with ReserveBurst.
	names []string
	res   map[string]*quota.Limits
	// until: the provider said the account is exhausted until then;
	// poolUntil: the shared part cannot take the request at the head of
	// tag order until then.
	until, poolUntil time.Time
	// tokensPerSec and requestsPerSec are the rates the account is drawn
	// at.
	tokensPerSec, requestsPerSec float64
	// tpm and rpm are the account's limits per minute.
	tpm, rpm float64
	// sent logs what was sent to the account over the last window; level
	// is what the provider last reported remaining (provider.go).
	sent  sendLog
	level providerLevel
	// heldAt is the latest time the account held dispatch back
	// (accountBindsLocked).
	heldAt time.Time
	// resRate is the tokens per second drawn on reservations, decayed
	// over resRateTau from resAt (Unix ns).
	resRate float64
	resAt   int64
}

// resRateTau is the time constant of upstream.resRate.
const resRateTau = 10 * time.Second

// noteReserved adds a draw of tokens on a reservation at now to resRate.
func (u *upstream) noteReserved(now time.Time, tokens int64) {
	u.resRate = u.reservedRate(now) + float64(tokens)/resRateTau.Seconds()
	u.resAt = now.UnixNano()
}

// reservedRate is resRate decayed to now.
func (u *upstream) reservedRate(now time.Time) float64 {
	if u.resAt == 0 {
		return 0
	}
	return u.resRate * math.Exp(-float64(max(now.UnixNano()-u.resAt, 0))/float64(resRateTau))
}

// limits compiles a meter for share of the account's limits drawn at
// drawShare(paced) of them, with burst tolerance burst.
func (u UpstreamQuota) limits(share float64, paced, burst time.Duration) (*quota.Limits, error) {
	f := share * drawShare(paced)
	return quota.Config{QPS: f * u.RPM / 60, TokensPerMin: f * u.TPM,
		BurstWindow: burst, BurstAllow: 1}.Compile()
}

// newUpstream compiles cfg's account and reservations, keeping what old
// knew of the provider (a reload does not make the provider forget).
func newUpstream(cfg *Config, old *upstream) (*upstream, error) {
	uq := cfg.UpstreamQuota
	if uq == nil {
		return nil, nil
	}
	if uq.RPM < 0 || uq.TPM < 0 || uq.Burst < 0 || (uq.RPM == 0 && uq.TPM == 0) {
		return nil, fmt.Errorf("upstream_quota: want rpm and/or tpm > 0 and a burst >= 0, got rpm %v tpm %v burst %v", uq.RPM, uq.TPM, uq.Burst)
	}
	if uq.ReserveBurst < 0 {
		return nil, fmt.Errorf("upstream_quota: reserve_burst %v must not be negative", uq.ReserveBurst)
	}
	names, reserved, err := upstreamReserves(cfg)
	if err != nil {
		return nil, err
	}
	u := &upstream{res: map[string]*quota.Limits{}, tpm: uq.TPM, rpm: uq.RPM, names: names}
	u.headroom = time.Duration(reserved * float64(uq.reserveBurst()))
	tau := uq.burst() + u.headroom
	acct, err := uq.limits(1, tau, tau)
	if err != nil {
		return nil, fmt.Errorf("upstream_quota: %w", err)
	}
	u.acct = acct
	for _, name := range u.names {
		res, err := uq.limits(cfg.Tenants[name].Reserve, tau, uq.reserveBurst())
		if err != nil {
			return nil, fmt.Errorf("tenant %q: reserve: %w", name, err)
		}
		u.res[name] = res
	}
	u.tokensPerSec, u.requestsPerSec = drawShare(tau)*uq.TPM/60, drawShare(tau)*uq.RPM/60
	if old != nil {
		u.until, u.poolUntil = old.until, old.poolUntil
		u.sent, u.level = old.sent, old.level
		u.resRate, u.resAt, u.heldAt = old.resRate, old.resAt, old.heldAt
	}
	return u, nil
}

// upstreamReserves returns the tenants that reserve a share of the upstream
// quota, sorted, and the shares' sum, refusing shares out of bounds.
func upstreamReserves(cfg *Config) (names []string, sum float64, err error) {
	for name, tc := range cfg.Tenants {
		if tc.Reserve == 0 {
			continue
		}
		if !(tc.Reserve > 0 && tc.Reserve < 1) {
			return nil, 0, fmt.Errorf("tenant %q: reserve %v must be a fraction of the upstream quota in (0, 1)", name, tc.Reserve)
		}
		sum += tc.Reserve
		names = append(names, name)
	}
	if cfg.Default.Reserve != 0 {
		return nil, 0, fmt.Errorf("default_tenant: reserve is for declared tenants (a reservation shared by unknown callers reserves nothing)")
	}
	if sum >= 0.95 {
		return nil, 0, fmt.Errorf("tenants reserve %.0f%% of the upstream quota together; leave at least 5%% shared", 100*sum)
	}
	slices.Sort(names)
	return names, sum, nil
}

// fitsLocked asks the store whether a request of tokens fits meter key
// now with its debt up to tol: one read of the meters' standing, and debt
// + the request's own increment tested against tol on each (not a Peek
// behind a backlog, which a cluster store scales by the gateway count).
// Store errors let it go. A request larger than the burst fits a meter at
// rest, or it never would.
func (q *Queue) fitsLocked(key string, l *quota.Limits, tokens int64, tol time.Duration) (quota.Decision, bool) {
	store := q.accountStoreLocked()
	st, err := store.Status(context.Background(), key, l)
	if err != nil {
		return quota.Decision{Allowed: true}, true
	}
	d := quota.Decision{Status: st, Allowed: true}
	inc := l
	sc, scaled := store.(quota.Scaled)
	if scaled {
		inc = sc.DecidesOn(l) // what the store charges it (a Mirror: this gateway's share)
	}
	for _, dim := range []quota.Dimension{quota.DimQPS, quota.DimTokens, quota.DimJoint} {
		m := st.Meter(dim)
		if !m.Enabled {
			continue
		}
		if over := m.Reset + inc.Increment(dim, tokens) - tol; over > 0 {
			d.Allowed = false
			if over > d.RetryAfter {
				d.RetryAfter, d.Reason = over, dim
			}
		}
	}
	if d.Allowed || restedStatus(d.Status) {
		return d, true
	}
	if scaled {
		// It fits at rest at the latest; on a gateway's share of a
		// cluster's account such requests are common. (The in-process
		// store keeps the longer wait, and a single gateway's schedule.)
		rest := max(d.Status.Requests.Reset, d.Status.Tokens.Reset, d.Status.Joint.Reset)
		d.RetryAfter = min(d.RetryAfter, rest)
	}
	return d, false
}

// reservedFitsLocked is whether tk fits its tenant's reservation and the
// account with the headroom.
func (q *Queue) reservedFitsLocked(tk *Ticket) bool {
	u := q.up
	l := u.res[tk.t.name]
	if l == nil || !tk.t.known {
		return false
	}
	if _, ok := q.fitsLocked(upstreamReservePfx+tk.t.name, l, tk.tokens, l.Tolerance()); !ok {
		return false
	}
	_, ok := q.fitsLocked(upstreamPoolKey, u.acct, tk.tokens, u.acct.Tolerance())
	return ok
}

// drawLocked charges tk's estimate to meter key and records it on the
// ticket for reconciliation.
func (q *Queue) drawLocked(tk *Ticket, key string, l *quota.Limits) bool {
	d, err := q.accountStoreLocked().Charge(context.Background(), key, l, tk.tokens)
	switch {
	case err != nil:
		return true // a store that fails lets the request go, uncharged
	case !d.Allowed && !restedStatus(d.Status):
		return false // another gateway drew on the account since the look
	}
	c := tk.chargeRecordLocked()
	c.upKey, c.upLimits = key, l
	if key != fallbackAccountKey && q.up != nil {
		q.up.sent.add(q.clock.Now(), tk.tokens, 1)
	}
	return true
}

// restedStatus reports whether a meter's status shows it at rest: a
// request larger than the burst may then go (fitsLocked).
func restedStatus(st quota.Status) bool {
	return st.Requests.Reset == 0 && st.Tokens.Reset == 0 && st.Joint.Reset == 0
}

// refundUpstreamLocked takes tk's whole draw back from the account (and
// its reservation): a request drawn for but never sent.
func (q *Queue) refundUpstreamLocked(tk *Ticket) {
	if tk.upLimits() == nil {
		return
	}
	s := q.accountStoreLocked()
	_, _ = s.Refund(context.Background(), tk.ch.upKey, tk.ch.upLimits, tk.tokens)
	if tk.ch.resLimits != nil {
		_, _ = s.Refund(context.Background(), tk.ch.resKey, tk.ch.resLimits, tk.tokens)
		tk.ch.resLimits = nil
	}
	q.unlogUpstreamLocked(tk, tk.tokens, 1)
	tk.ch.upLimits = nil
}

// unlogUpstreamLocked takes tokens and requests of tk's draw off the
// log of what was sent to the primary account.
func (q *Queue) unlogUpstreamLocked(tk *Ticket, tokens, requests int64) {
	if tk.ch.upKey != fallbackAccountKey && q.up != nil {
		q.up.sent.add(q.clock.Now(), -tokens, -requests)
	}
}

// upstreamChargeLocked finds room for tk in the account: on its tenant's
// reservation, else as shared traffic. It reports false, charging
// nothing, when there is none; the shared part is then exhausted until
// the time it could take tk.
func (q *Queue) upstreamChargeLocked(now time.Time, tk *Ticket) bool {
	u := q.up
	if q.reservedFitsLocked(tk) && q.drawReservedLocked(tk) {
		return true
	}
	if now.Before(u.poolUntil) {
		return false
	}
	// As shared traffic: leaving the reservations' headroom free.
	d, ok := q.fitsLocked(upstreamPoolKey, u.acct, tk.tokens, u.acct.Tolerance()-u.headroom)
	if ok && q.drawLocked(tk, upstreamPoolKey, u.acct) {
		return true
	}
	// The store's time may be another clock (Redis): only the wait counts.
	u.poolUntil = now.Add(max(d.RetryAfter, time.Millisecond))
	u.heldAt = now
	return false
}

// accountBindsHold is how long after the account last held dispatch back
// it still counts as what binds.
const accountBindsHold = 5 * time.Second

// accountBindsLocked reports whether the provider account, rather than the
// slots, holds dispatch back: it did within accountBindsHold. A boost then
// makes no room, and a tenant's requests go at its share of the account.
func (q *Queue) accountBindsLocked(now time.Time) bool {
	u := q.up
	return u != nil && !u.heldAt.IsZero() && now.Sub(u.heldAt) < accountBindsHold
}

// drawReservedLocked charges tk to the account and its tenant's
// reservation.
func (q *Queue) drawReservedLocked(tk *Ticket) bool {
	key, l := upstreamReservePfx+tk.t.name, q.up.res[tk.t.name]
	if !q.drawLocked(tk, upstreamPoolKey, q.up.acct) {
		return false
	}
	d, err := q.accountStoreLocked().Charge(context.Background(), key, l, tk.tokens)
	switch {
	case err != nil:
		return true // a store that fails lets the request go
	case !d.Allowed && !restedStatus(d.Status):
		q.refundUpstreamLocked(tk) // used elsewhere since the look
		return false
	}
	tk.ch.resKey, tk.ch.resLimits = key, l
	q.up.noteReserved(q.clock.Now(), tk.tokens)
	return true
}

// reservedInTimeLocked reports whether t's reservation takes a request of
// t before deadline (less the margins), behind the backlog b, whatever the
// shared traffic queued. A store error answers no.
func (q *Queue) reservedInTimeLocked(now time.Time, t *tenant, b quota.Backlog, deadline time.Time) bool {
	l := q.up.res[t.name]
	if l == nil || !t.known || deadline.IsZero() {
		return false
	}
	d, err := q.accountStoreLocked().Peek(context.Background(), upstreamReservePfx+t.name, l, b)
	if err != nil {
		return false
	}
	return now.Add(d.RetryAfter).Before(deadline.Add(-q.quotaMarginLocked()))
}

// reservedNextLocked is what may go while the shared part is exhausted:
// among the reserved tenants eligible for dispatch, the head request with
// the smallest finish tag that its reservation can take, charged to it.
// nil when none can go. O(reserved tenants x their classes).
func (q *Queue) reservedNextLocked(now time.Time) *Ticket {
	u := q.up
	best := q.bestHeadLocked(now, u.names, q.reservedFitsLocked)
	if best != nil && !q.drawReservedLocked(best) {
		return nil
	}
	return best
}

// bestHeadLocked is, among the named tenants eligible for dispatch, the
// flow head with the smallest finish tag that ok accepts, passing over
// heads whose deadline has come. ok is asked only of a head that would be
// the best so far. O(names x classes): the lists are a few VIPs.
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

// reconcileUpstreamLocked corrects tk's draw on the account (and its
// reservation) to counted, what the provider counts of it (0 after a 429:
// the attempt, not its tokens). A request that failed is left charged.
func (q *Queue) reconcileUpstreamLocked(tk *Ticket, counted int64) {
	if tk.upLimits() == nil {
		return
	}
	if counted != tk.tokens {
		s := q.accountStoreLocked()
		_, _ = s.Reconcile(context.Background(), tk.ch.upKey, tk.ch.upLimits, tk.tokens, counted)
		if tk.ch.resLimits != nil {
			_, _ = s.Reconcile(context.Background(), tk.ch.resKey, tk.ch.resLimits, tk.tokens, counted)
		}
		q.unlogUpstreamLocked(tk, tk.tokens-counted, 0)
	}
	tk.ch.upLimits, tk.ch.resLimits = nil, nil
}

// providerCount is what a provider counts of tk: the prompt it reported
// (prompt >= 0) plus tk's output cap; tk's estimate when it reported none.
func providerCount(tk *Ticket, prompt int64) int64 {
	if prompt < 0 {
		return tk.tokens
	}
	return max(tk.tokens-tk.prompt, 0) + prompt
}

// AccountExhausted records that the provider declared the account out of
// quota until the given time (its 429's Retry-After, or a reset time with
// nothing remaining): nothing is dispatched to it before then.
func (q *Queue) AccountExhausted(until time.Time) {
	q.mu.Lock()
	defer q.unlock()
	if q.up != nil {
		q.up.until = maxTime(q.up.until, until)
	}
}

// UpstreamStatus is the account's state for metrics and reports.
type UpstreamStatus struct {
	Configured bool
	// Pool is the account's meter's standing; Reserved each
	// reservation's.
	Pool     quota.Status
	Reserved map[string]quota.Status
	// ExhaustedFor is how long the provider still declares the account
	// out of quota (0 when it does not).
	ExhaustedFor time.Duration
	// TPM and RPM are the account's limits (0: not metered);
	// WindowTokens and WindowRequests what this gateway sent to it in the
	// last 60 s, as the provider counts.
	TPM, RPM                     float64
	WindowTokens, WindowRequests int64
	// ProviderTokens and ProviderRequests are the provider's last report
	// of what is left (ProviderLevel), brought to now; NaN: no report in
	// force.
	ProviderTokens, ProviderRequests float64
}

// Upstream returns the account's state.
func (q *Queue) Upstream() UpstreamStatus {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.up
	if u == nil {
		return UpstreamStatus{}
	}
	s := q.accountStoreLocked()
	now := q.clock.Now()
	u.sent.prune(now)
	st := UpstreamStatus{Configured: true, Reserved: make(map[string]quota.Status, len(u.names)),
		ExhaustedFor: max(u.until.Sub(now), 0), TPM: u.tpm, RPM: u.rpm}
	st.WindowTokens, st.WindowRequests = u.sent.inWindow(now)
	st.ProviderTokens, st.ProviderRequests = u.levelAt(now)
	st.Pool, _ = s.Status(context.Background(), upstreamPoolKey, u.acct)
	for _, name := range u.names {
		st.Reserved[name], _ = s.Status(context.Background(), upstreamReservePfx+name, u.res[name])
	}
	return st
}

// Requeue puts a dispatched ticket whose upstream refused it for want of
// quota (a provider 429) back at the head of its tenant's queue: it frees
// its slot, is not charged to its tenant, and is dispatched again when the
// account has room, or ends by its deadline. Its owner calls Wait again.
// It reports false when the ticket is not in flight.
func (tk *Ticket) Requeue() bool {
	q := tk.q
	q.mu.Lock()
	defer q.unlock()
	if tk.state != stateInflight || q.closed != "" {
		return false // nobody ticks or dispatches a closed queue
	}
	now := q.clock.Now()
	t := tk.t
	// Not charged to its tenant; on a shared store it keeps its booking,
	// used again at once (gate.go).
	switch {
	case tk.quotaLimits() != nil && q.remoteStore:
		tk.ch.booked = true
		t.addBookingLocked(q.since(now))
	case tk.quotaLimits() != nil:
		_, _ = q.accountStoreLocked().Refund(context.Background(), t.name, tk.ch.quota, tk.tokens)
		tk.ch.quota = nil
	}
	q.reconcileUpstreamLocked(tk, 0)
	if !tk.fallback {
		q.adm.cold.Abandon(tk.dispatchedLocked(), float64(tk.cost))
	}
	q.leaveSlotLocked(tk)
	tk.fallback, tk.boosted = false, false
	q.correctChargeLocked(t, -float64(tk.cost)) // refunded as credit
	q.capLocked(t)
	tk.state, tk.ready, tk.dispatched = stateQueued, nil, 0
	f := tk.f
	f.out -= tk.cost
	f.tokens += tk.tokens
	tk.mark = f.out
	f.q.insertAfter(tk, nil)
	if !t.out {
		q.linkFlowLocked(f)
	}
	q.countLocked(tk, 1)
	if !tk.deadline.IsZero() {
		heap.Push(&q.deadlines, tk)
	}
	q.dispatchLocked(now)
	return true
}
