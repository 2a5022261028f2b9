package fairqueue

import (
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// The fallback channel: a second upstream pool that the tenants it lists
// use when the primary cannot serve them (account out of quota, no healthy
// upstream, or half the wait budget gone), with its own slots and account.
// After the primary's dispatch loop it takes the listed tenants' head
// request with the smallest finish tag that the primary cannot take.

// FallbackConfig is the fallback channel.
type FallbackConfig struct {
	// Tenants lists the tenants that may use the fallback.
	Tenants []string
	// MaxInflight is the fallback's concurrent requests per healthy
	// fallback upstream; 0 means Config.MaxInflight.
	MaxInflight int
	// UpstreamQuota is the fallback account's limits; nil: none.
	UpstreamQuota *UpstreamQuota
}

// fallbackAccountKey is the fallback account's meter in the account
// store (accountStoreLocked).
const fallbackAccountKey = "\x00fallback"

type fallback struct {
	tenants []string // sorted
	slots   int      // per healthy fallback upstream
	pool    *quota.Limits
	healthy int
	// until: the fallback provider said its account is exhausted until
	// then; poolUntil: its account cannot take the next request until then.
	until, poolUntil time.Time
}

func (f *fallback) capacity() int { return f.slots * f.healthy }

func newFallback(cfg *Config, old *fallback) (*fallback, error) {
	fc := cfg.Fallback
	if fc == nil {
		return nil, nil
	}
	f := &fallback{tenants: slices.Sorted(slices.Values(fc.Tenants)), slots: fc.MaxInflight}
	if f.slots <= 0 {
		f.slots = cfg.MaxInflight
	}
	if fc.UpstreamQuota != nil {
		l, err := fc.UpstreamQuota.limits(1, fc.UpstreamQuota.burst(), fc.UpstreamQuota.burst())
		if err != nil {
			return nil, err
		}
		f.pool = l
	}
	if old != nil {
		f.healthy, f.until, f.poolUntil = old.healthy, old.until, old.poolUntil
	}
	return f, nil
}

// fallbackListed reports whether tenant may use the fallback.
func (q *Queue) fallbackListed(tenant string) bool {
	_, ok := slices.BinarySearch(q.fb.tenants, tenant)
	return ok
}

// fallbackServesLocked reports whether the fallback may serve tenant's
// requests when the primary cannot: it lists tenant and has slots.
func (q *Queue) fallbackServesLocked(tenant string) bool {
	return q.fb != nil && q.fb.capacity() > 0 && q.fallbackListed(tenant)
}

// fallbackOpenLocked reports whether the fallback could take a request of
// a listed tenant now: a slot free and its account not declared exhausted.
func (q *Queue) fallbackOpenLocked(now time.Time) bool {
	f := q.fb
	return f != nil && q.fbInflight < f.capacity() && !now.Before(f.until) && !now.Before(f.poolUntil)
}

// primaryBlockedLocked reports whether the primary cannot serve tk now.
func (q *Queue) primaryBlockedLocked(now time.Time, tk *Ticket) bool {
	enq, u := q.at(tk.enqueued), q.up
	switch {
	case q.healthy == 0:
		return true
	case !tk.deadline.IsZero() && 2*now.Sub(enq) >= tk.deadline.Sub(enq):
		return true // half its budget gone: its primary ETA misses
	case u == nil:
		return false
	case now.Before(u.until) || !q.levelAllowsLocked(now, tk):
		return true
	}
	return now.Before(u.poolUntil) && !q.reservedFitsLocked(tk)
}

// dispatchFallbackLocked starts what the fallback should serve now.
func (q *Queue) dispatchFallbackLocked(now time.Time) {
	f := q.fb
	if f == nil {
		return
	}
	if !f.until.IsZero() && !now.Before(f.until) {
		f.until = time.Time{}
	}
	for q.fallbackOpenLocked(now) {
		tk := q.fallbackNextLocked(now)
		if tk == nil {
			return
		}
		if f.pool != nil {
			d, ok := q.fitsLocked(fallbackAccountKey, f.pool, tk.tokens, f.pool.Tolerance())
			if !ok || !q.drawLocked(tk, fallbackAccountKey, f.pool) {
				f.poolUntil = now.Add(max(d.RetryAfter, time.Millisecond))
				return
			}
		}
		if !q.quotaPassLocked(now, tk, true) {
			q.refundUpstreamLocked(tk)
			continue // its tenant is held now
		}
		q.takeLocked(tk, false)
		tk.fallback = true
		q.startLocked(tk, now, q.since(now), false)
	}
}

// fallbackNextLocked is the listed tenants' head request with the
// smallest finish tag that the primary cannot serve now; one of theirs in
// the boost lane goes first.
func (q *Queue) fallbackNextLocked(now time.Time) *Ticket {
	for tk := q.boost.head; tk != nil; tk = tk.next {
		if !tk.t.out && q.fallbackListed(tk.t.name) && now.Before(tk.deadline) && q.primaryBlockedLocked(now, tk) {
			return tk
		}
	}
	return q.bestHeadLocked(now, q.fb.tenants, func(tk *Ticket) bool { return q.primaryBlockedLocked(now, tk) })
}

// SetFallbackHealthy sets the number of healthy fallback upstreams.
func (q *Queue) SetFallbackHealthy(n int) {
	q.mu.Lock()
	defer q.unlock()
	if q.fb != nil && n != q.fb.healthy {
		q.fb.healthy = max(n, 0)
		q.dispatchLocked(q.clock.Now())
	}
}

// Fallback reports whether the ticket was dispatched to the fallback
// channel (valid once Wait returned nil).
func (tk *Ticket) Fallback() bool {
	tk.q.mu.Lock()
	defer tk.q.mu.Unlock()
	return tk.fallback
}

// AccountExhausted records that the provider behind the channel tk was
// dispatched to declared its account out of quota until the given time:
// nothing goes to that channel before then.
func (tk *Ticket) AccountExhausted(until time.Time) {
	q := tk.q
	q.mu.Lock()
	defer q.unlock()
	switch {
	case tk.fallback && q.fb != nil:
		q.fb.until = maxTime(q.fb.until, until)
	case !tk.fallback && q.up != nil:
		q.up.until = maxTime(q.up.until, until)
	}
}

// AccountWait is how long the provider behind a channel (the fallback's
// or, with fallback false, the primary's) still declares its account out
// of quota; 0 when it does not, or when the channel has no account.
func (q *Queue) AccountWait(fallback bool) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	var until time.Time
	switch {
	case fallback && q.fb != nil:
		until = q.fb.until
	case !fallback && q.up != nil:
		until = q.up.until
	}
	return max(until.Sub(q.clock.Now()), 0)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
