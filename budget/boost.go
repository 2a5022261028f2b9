package budget

import (
	"math"
	"time"
)

// BoostWindow is the rolling window of the per-tenant boost limit.
const BoostWindow = time.Hour

// Reasons returned by Boosts.Allow when it refuses.
const (
	ReasonDisabled     = "boost_disabled"            // shareMax is 0
	ReasonShare        = "boost_share_exhausted"     // Limit(capacity) boosts in flight
	ReasonTenantHourly = "tenant_boost_hourly_limit" // perTenantHourly boosts in the last hour
)

// sweepPerRecord is how many tenants Record checks for expiry per call.
const sweepPerRecord = 2

// Boosts is the boost budget: a bound on boosted requests in flight and a
// per-tenant rolling-hour count. See the package documentation.
type Boosts struct {
	share   float64
	perHour int

	tenants map[string]*tenantBoosts
	list    []*tenantBoosts // same entries, for the incremental sweep
	sweep   int

	originSet bool
	origin    time.Time
}

type tenantBoosts struct {
	key  string
	ts   []int64 // ring of boost times (ns since origin), len == perHour
	head int     // next write; the oldest entry once full
	n    int     // entries used
	pos  int     // index in Boosts.list
}

// NewBoosts returns a boost budget. shareMax is the largest share of the
// dispatch slots that boosted requests may hold (0 disables boost; clamped
// to [0, 1]); perTenantHourly is the most boosts per tenant in any rolling
// hour (0: unlimited).
func NewBoosts(shareMax float64, perTenantHourly int) *Boosts {
	b := &Boosts{tenants: make(map[string]*tenantBoosts)}
	b.Update(shareMax, perTenantHourly)
	return b
}

// PerTenantHourly returns the configured per-tenant hourly limit (0: none).
func (b *Boosts) PerTenantHourly() int { return b.perHour }

// Limit returns the most boosted requests that may be in flight with
// capacity dispatch slots: floor(shareMax·capacity), at least 1 when
// shareMax > 0, and 0 when shareMax or capacity is <= 0.
func (b *Boosts) Limit(capacity int) int {
	if b.share <= 0 || capacity <= 0 {
		return 0
	}
	l := int(math.Floor(b.share*float64(capacity) + 1e-9))
	return min(max(l, 1), capacity)
}

// Allow reports whether tenant may be boosted now, with boostedInflight
// boosted requests in flight out of capacity slots. It changes nothing:
// call Record when the boost happens. Allocation-free.
func (b *Boosts) Allow(now time.Time, tenant string, boostedInflight, capacity int) (ok bool, reason string) {
	if b.share <= 0 {
		return false, ReasonDisabled
	}
	if boostedInflight >= b.Limit(capacity) {
		return false, ReasonShare
	}
	if b.perHour > 0 {
		if e := b.tenants[tenant]; e != nil && e.n == len(e.ts) && e.ts[e.head] > b.cutoff(now) {
			return false, ReasonTenantHourly
		}
	}
	return true, ""
}

// Record counts a boost of tenant at now. Times must not go backwards. With
// perTenantHourly 0 nothing is stored. It also sweeps two tenants, so idle
// ones are dropped.
func (b *Boosts) Record(now time.Time, tenant string) {
	if b.perHour <= 0 {
		return
	}
	at := b.at(now)
	e := b.tenants[tenant]
	if e == nil {
		e = &tenantBoosts{key: tenant, ts: make([]int64, b.perHour), pos: len(b.list)}
		b.tenants[tenant] = e
		b.list = append(b.list, e)
	}
	e.ts[e.head] = at
	e.head = (e.head + 1) % len(e.ts)
	if e.n < len(e.ts) {
		e.n++
	}
	cut := b.cutoff(now)
	for i := 0; i < sweepPerRecord && len(b.list) > 0; i++ {
		if b.sweep >= len(b.list) {
			b.sweep = 0
		}
		if c := b.list[b.sweep]; c.newest() <= cut {
			b.remove(c)
		} else {
			b.sweep++
		}
	}
}

// Count returns how many boosts tenant had in the rolling hour ending at now
// (capped at perTenantHourly, which is all that is kept).
func (b *Boosts) Count(now time.Time, tenant string) int {
	e := b.tenants[tenant]
	if e == nil {
		return 0
	}
	cut := b.cutoff(now)
	c := 0
	for i := 0; i < e.n; i++ {
		if e.ts[i] > cut {
			c++
		}
	}
	return c
}

// Tenants returns how many tenants are tracked (boosted within about the last
// hour, until swept).
func (b *Boosts) Tenants() int { return len(b.tenants) }

// Forget drops tenant's boost history at once, as when the scheduler
// forgets an idle tenant, so boost memory follows the live tenants. A
// forgotten tenant's hourly count starts again from zero.
func (b *Boosts) Forget(tenant string) {
	if e := b.tenants[tenant]; e != nil {
		b.remove(e)
	}
}

// Update changes the configuration live, keeping the counts: each tenant's
// ring is resized to the new limit, keeping its newest boosts. Changing to
// unlimited (0) drops all counts; changing from unlimited starts from zero.
func (b *Boosts) Update(shareMax float64, perTenantHourly int) {
	switch {
	case !(shareMax > 0): // also NaN
		shareMax = 0
	case shareMax > 1:
		shareMax = 1
	}
	b.share = shareMax
	perTenantHourly = max(perTenantHourly, 0)
	if perTenantHourly == b.perHour {
		return
	}
	b.perHour = perTenantHourly
	if perTenantHourly == 0 {
		clear(b.tenants)
		clear(b.list)
		b.list = b.list[:0]
		b.sweep = 0
		return
	}
	for _, e := range b.list {
		keep := min(e.n, perTenantHourly)
		ts := make([]int64, perTenantHourly)
		// Oldest kept entry is keep positions before head.
		for i := 0; i < keep; i++ {
			ts[i] = e.ts[(e.head-keep+i+2*len(e.ts))%len(e.ts)]
		}
		e.ts, e.n, e.head = ts, keep, keep%perTenantHourly
	}
}

func (e *tenantBoosts) newest() int64 {
	return e.ts[(e.head-1+len(e.ts))%len(e.ts)]
}

func (b *Boosts) remove(e *tenantBoosts) {
	last := len(b.list) - 1
	moved := b.list[last]
	b.list[e.pos] = moved
	moved.pos = e.pos
	b.list[last] = nil
	b.list = b.list[:last]
	delete(b.tenants, e.key)
}

// at converts now to nanoseconds since the first time seen.
func (b *Boosts) at(now time.Time) int64 {
	if !b.originSet {
		b.originSet, b.origin = true, now
	}
	return int64(now.Sub(b.origin))
}

// cutoff returns the time (as at) at or before which a boost has aged out.
func (b *Boosts) cutoff(now time.Time) int64 {
	if !b.originSet {
		return math.MinInt64
	}
	return int64(now.Sub(b.origin)) - int64(BoostWindow)
}
