package history

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Minutes is how many per-minute aggregates each ring holds: 24 hours.
const Minutes = 24 * 60

// Seconds is how many per-second gateway samples are kept: the five
// minutes the shortest window shows at one-second resolution.
const Seconds = 5 * 60

// MaxTransitions bounds the remembered degrade and circuit transitions.
const MaxTransitions = 200

// UnknownTenant is the one name every undeclared tenant is counted under,
// as in the plugin's metrics.
const UnknownTenant = "_unknown"

// Outcomes lists the outcome codes counted per tenant: served, and every
// answer of the plugin's HTTP contract. A code not listed is counted as
// "other".
var Outcomes = [...]string{
	"served",
	"wait_budget_exceeded",
	"queue_timeout",
	"quota_exceeded",
	"circuit_open",
	"tenant_queue_full",
	"class_throttled",
	"server_busy",
	"context_length_exceeded",
	"invalid_request",
	"request_too_large",
	"request_timeout",
	"unknown_tenant",
	"proxy_error",
	"client_gone",
	"other",
}

const (
	numOutcomes = len(Outcomes)
	outServed   = 0
	outOther    = numOutcomes - 1
)

var outcomeIndex = func() map[string]int {
	m := make(map[string]int, numOutcomes)
	for i, o := range Outcomes {
		m[o] = i
	}
	return m
}()

// QuotaReasons are the quota meters a limit hit names.
var QuotaReasons = [...]string{"qps", "tokens", "joint"}

// Quota actions: a request its quota delayed, or refused.
const (
	actionDelayed = 0
	actionRefused = 1
)

// tenantMinute is one tenant's aggregates over one minute.
type tenantMinute struct {
	minute   int64 // unix minute this slot holds; a slot holding another is stale
	outcomes [numOutcomes]uint32
	wait     [NumBuckets]uint32 // served requests' waits
	boosts   uint32
	etaN     uint32
	chargedN uint32 // requests charged to the tenant's quota
	limited  [len(QuotaReasons)][2]uint32
	waitSum  float64 // seconds
	tokens   int64   // served tokens, actual usage (the estimate when none was reported)
	etaRatio float64 // sum of predicted/actual wait
	etaErr   float64 // sum of |ln(predicted/actual)|
	chargedT int64   // tokens charged to the quota, corrected to actual usage
	owed     float64 // served tokens WFQ owed the tenant (see Sample)
}

// gatewaySlot is the gateway over one minute or one second.
type gatewaySlot struct {
	at               int64 // unix minute or second; stale when another
	capacity         int32 // last sample
	healthy          int32 // last sample
	degrade, circuit int32 // last sample
	degradeMax       int32
	circuitMax       int32
	samples          int32
	water, waterMax  float64
}

// Memory cost on 64-bit platforms.
const (
	// TenantMinuteBytes is one tenant's aggregates over one minute.
	TenantMinuteBytes = 320
	// TenantBytes is one tenant's ring: 24 hours of minutes.
	TenantBytes = TenantMinuteBytes * Minutes
	// gatewaySlotBytes and transitionBytes are the fixed rings' entries.
	gatewaySlotBytes = 56
	transitionBytes  = 88
	// FixedBytes is what a History holds whatever its tenants: the
	// gateway's minutes and seconds and the transitions.
	FixedBytes = gatewaySlotBytes*(Minutes+Seconds) + transitionBytes*MaxTransitions
)

// MemoryBytes is what the history holds now: FixedBytes and one
// TenantBytes ring per tenant that has recorded anything.
func (h *History) MemoryBytes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return FixedBytes + len(h.tenants)*TenantBytes
}

// Transition is one degrade ladder step or circuit tier moving.
type Transition struct {
	At time.Time `json:"at"`
	// Kind is "degrade" or "circuit".
	Kind string `json:"kind"`
	// Name is the ladder step or the circuit tier.
	Name string `json:"name"`
	// Up: the step engaged or the tier was shed; else released/readmitted.
	Up bool `json:"up"`
	// From and To are the levels before and after (steps engaged, tiers
	// shed).
	From int `json:"from"`
	To   int `json:"to"`
	// Value is the water level (degrade) or the demand/capacity ratio
	// (circuit) that crossed the line.
	Value float64 `json:"value"`
}

// Sample is the gateway's state at one tick.
type Sample struct {
	Capacity     int
	Healthy      int
	Water        float64
	DegradeLevel int
	CircuitLevel int
	// Backlogged are the flow owners with a request waiting that
	// dispatch may take now (the undeclared group as UnknownTenant), each
	// with its weight.
	Backlogged []Backlogged
}

// Backlogged is one flow owner with work waiting, and its weight.
type Backlogged struct {
	Tenant string
	Weight float64
}

// History is the in-memory record of one queue. The zero value is not
// usable; call New.
type History struct {
	now   func() time.Time
	start time.Time

	mu       sync.Mutex
	declared map[string]bool
	tenants  map[string]*ring
	// samples counts Sample calls: a ring marked with the current count
	// is backlogged in the interval it closes.
	samples uint64
	minutes [Minutes]gatewaySlot
	seconds [Seconds]gatewaySlot
	trans   [MaxTransitions]Transition
	transN  int // transitions ever recorded; the ring holds the last MaxTransitions
}

// New returns an empty history on the given clock, counting declared
// under their own names and every other tenant under UnknownTenant.
func New(now func() time.Time, declared []string) *History {
	h := &History{now: now, start: now(), tenants: map[string]*ring{}}
	h.Declare(declared)
	return h
}

// Declare sets the tenants counted under their own names (a reload may
// change them): rings of tenants no longer declared are dropped, so memory
// follows the configuration in force.
func (h *History) Declare(names []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.declared = make(map[string]bool, len(names))
	for _, n := range names {
		h.declared[n] = true
	}
	for n := range h.tenants {
		if n != UnknownTenant && !h.declared[n] {
			delete(h.tenants, n)
		}
	}
}

// ring is one tenant's minutes, and what Sample needs of it.
type ring struct {
	minutes []tenantMinute
	// pending is the tokens served since the last sample, not yet owed.
	pending int64
	// backlogged is the sample count at which the tenant was last
	// backlogged, and weight its weight then.
	backlogged uint64
	weight     float64
}

// ringLocked returns the tenant's ring (UnknownTenant's for an undeclared
// one), made on first use. Rings exist for declared tenants and
// UnknownTenant only, so a ring found is the tenant's own.
func (h *History) ringLocked(tenant string) *ring {
	r := h.tenants[tenant]
	if r == nil {
		if !h.declared[tenant] {
			tenant = UnknownTenant
			r = h.tenants[tenant]
		}
		if r == nil {
			r = &ring{minutes: make([]tenantMinute, Minutes)}
			h.tenants[tenant] = r
		}
	}
	return r
}

// slotLocked returns the tenant's slot for the current minute, cleared
// if it held an older one.
func (h *History) slotLocked(tenant string) *tenantMinute {
	return h.ringLocked(tenant).slot(unixMinute(h.now()))
}

// slot returns r's slot for unix minute m, cleared if it held another.
func (r *ring) slot(m int64) *tenantMinute {
	s := &r.minutes[ringIndex(m, Minutes)]
	if s.minute != m {
		*s = tenantMinute{minute: m}
	}
	return s
}

// Answer is what one answered request records.
type Answer struct {
	// Code is the outcome code ("served", "queue_timeout", ...; others
	// count as "other").
	Code string
	// Wait is how long it waited in the queue (a served request's wait
	// goes into the wait histogram).
	Wait time.Duration
	// Tokens is what it really used (0 when none were served).
	Tokens int64
	// Boosted and ETA are whether the request was boosted at dispatch
	// and the wait it was promised; a zero ETA or Wait records no ETA
	// accuracy.
	Boosted bool
	ETA     time.Duration
}

// Outcome counts one answered request of tenant, dispatch and outcome
// together, so the request path takes the shared lock once.
func (h *History) Outcome(tenant string, a Answer) {
	if h == nil {
		return
	}
	i, ok := outcomeIndex[a.Code]
	if !ok {
		i = outOther
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.ringLocked(tenant)
	s := r.slot(unixMinute(h.now()))
	s.outcomes[i]++
	if i == outServed {
		w := max(a.Wait.Seconds(), 0)
		s.wait[bucketOf(w)]++
		s.waitSum += w
	}
	if a.Tokens > 0 {
		s.tokens += a.Tokens
		r.pending += a.Tokens
	}
	if a.Boosted {
		s.boosts++
	}
	if a.ETA > 0 && a.Wait > 0 {
		r := a.ETA.Seconds() / a.Wait.Seconds()
		s.etaN++
		s.etaRatio += r
		s.etaErr += math.Abs(math.Log(r))
	}
}

// QuotaLimited counts a request of tenant that its quota limited: by
// meter reason ("qps", "tokens", "joint"; others are ignored), delayed in
// its queue or refused.
func (h *History) QuotaLimited(tenant, reason string, refused bool) {
	if h == nil {
		return
	}
	r := slices.Index(QuotaReasons[:], reason)
	if r < 0 {
		return
	}
	a := actionDelayed
	if refused {
		a = actionRefused
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.slotLocked(tenant).limited[r][a]++
}

// QuotaCharged counts a completed request of tenant charged to its quota,
// with the tokens it used.
func (h *History) QuotaCharged(tenant string, tokens int64) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.slotLocked(tenant)
	s.chargedN++
	s.chargedT += max(tokens, 0)
}

// Sample records the gateway's state at a tick: each second and minute
// keeps its last state and its highest water, degrade and circuit levels.
//
// It also settles who was owed the tokens served since the previous
// sample, as weighted fair queuing defines a fair share: the tokens served
// to the tenants backlogged now are owed to them by weight, and a tenant
// not backlogged is owed what it was served, having asked for no more. A
// tenant that used capacity nobody else wanted is thus not counted as
// taking more than its share. Coarse over one tick, it converges over a
// window.
func (h *History) Sample(g Sample) {
	if h == nil {
		return
	}
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	sec := now.Unix()
	sampleInto(&h.seconds[ringIndex(sec, Seconds)], sec, g)
	m := unixMinute(now)
	sampleInto(&h.minutes[ringIndex(m, Minutes)], m, g)
	h.oweLocked(g.Backlogged, m)
}

// oweLocked settles the tokens pending since the last sample into minute
// m (see Sample).
func (h *History) oweLocked(backlogged []Backlogged, m int64) {
	h.samples++
	var weights float64
	for _, b := range backlogged {
		if b.Weight <= 0 {
			continue
		}
		r := h.ringLocked(b.Tenant)
		if r.backlogged != h.samples {
			r.backlogged, r.weight = h.samples, 0
		}
		r.weight += b.Weight
		weights += b.Weight
	}
	var shared int64 // served to the backlogged: theirs to share
	for _, r := range h.tenants {
		if r.pending == 0 {
			continue
		}
		if r.backlogged == h.samples {
			shared += r.pending
		} else {
			r.slot(m).owed += float64(r.pending)
		}
		r.pending = 0
	}
	if shared == 0 {
		return
	}
	for _, r := range h.tenants {
		if r.backlogged == h.samples {
			r.slot(m).owed += float64(shared) * r.weight / weights
		}
	}
}

func sampleInto(s *gatewaySlot, at int64, g Sample) {
	if s.at != at {
		*s = gatewaySlot{at: at}
	}
	s.capacity, s.healthy = int32(g.Capacity), int32(g.Healthy)
	s.degrade, s.circuit = int32(g.DegradeLevel), int32(g.CircuitLevel)
	s.water = g.Water
	if s.samples == 0 || g.Water > s.waterMax {
		s.waterMax = g.Water
	}
	s.degradeMax = max(s.degradeMax, s.degrade)
	s.circuitMax = max(s.circuitMax, s.circuit)
	s.samples++
}

// Degrade records a ladder transition.
func (h *History) Degrade(at time.Time, step string, up bool, from, to int, water float64) {
	h.transition(Transition{At: at, Kind: "degrade", Name: step, Up: up, From: from, To: to, Value: water})
}

// Circuit records a circuit transition.
func (h *History) Circuit(at time.Time, tier string, up bool, from, to int, ratio float64) {
	h.transition(Transition{At: at, Kind: "circuit", Name: tier, Up: up, From: from, To: to, Value: ratio})
}

func (h *History) transition(t Transition) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trans[h.transN%MaxTransitions] = t
	h.transN++
}

func unixMinute(t time.Time) int64 { return t.Unix() / 60 }

// ringIndex maps a unix minute or second to its slot, also before 1970.
func ringIndex(at int64, n int) int {
	i := at % int64(n)
	if i < 0 {
		i += int64(n)
	}
	return int(i)
}
