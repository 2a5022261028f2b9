package degrade

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Defaults for CircuitConfig fields left zero, and the shortest window.
const (
	DefaultCircuitTrigger = 1.3
	DefaultCircuitRecover = 1.0
	DefaultCircuitHold    = 10 * time.Second
	DefaultCircuitWindow  = 10 * time.Second
	// DefaultCircuitSaturation: a tier is shed only when the upstreams
	// were saturated, with requests waiting, for 90% of the window.
	DefaultCircuitSaturation = 0.9
	// MinCircuitWindow is the shortest accepted window: below it a window
	// holds too few LLM requests to be a rate.
	MinCircuitWindow = 100 * time.Millisecond
)

// circuitBuckets is the number of complete buckets of the demand window;
// the ring holds one more, the current bucket.
const circuitBuckets = 10

// CircuitConfig is the circuit_break block as the operator writes it:
//
//	circuit_break { trigger 1.3 recover 1.0 hold 10s window 10s order low mid high }
//
// Zero fields take the defaults (DefaultCircuit*): a zero Hold means
// DefaultCircuitHold, not "no hold".
type CircuitConfig struct {
	// Trigger: tier k is shed when the demand of tier k, the tiers above
	// it and tier-less arrivals, over the window, exceeds Trigger ×
	// capacity.
	Trigger float64 `json:"trigger,omitempty"`
	// Recover: shed tier k is readmitted when that same demand (its own
	// included, as if readmitted) is below Recover × capacity. Must be
	// below Trigger.
	Recover float64 `json:"recover,omitempty"`
	// Hold is the minimum time between two transitions of one tier.
	Hold time.Duration `json:"hold,omitempty"`
	// Window is the length of the sliding window demand is averaged over;
	// it is what makes a trip require sustained demand.
	Window time.Duration `json:"window,omitempty"`
	// Order lists the tiers, lowest (shed first) to highest; the last is
	// never shed. At least two, non-empty and unique.
	Order []string `json:"order,omitempty"`
	// Saturation is the least share of the window during which the
	// upstreams must have been saturated with requests waiting (see
	// Circuit.Saturated) for a tier to be shed: demand over the line
	// while capacity idles is a wrong estimate, not overload. In (0, 1].
	Saturation float64 `json:"saturation,omitempty"`
}

// withDefaults returns c with zero fields set to their defaults.
func (c CircuitConfig) withDefaults() CircuitConfig {
	c.Trigger = cmp.Or(c.Trigger, DefaultCircuitTrigger)
	c.Recover = cmp.Or(c.Recover, DefaultCircuitRecover)
	c.Hold = cmp.Or(c.Hold, DefaultCircuitHold)
	c.Window = cmp.Or(c.Window, DefaultCircuitWindow)
	c.Saturation = cmp.Or(c.Saturation, DefaultCircuitSaturation)
	return c
}

// Validate reports every problem of c at once, each naming the field and
// the accepted range. Zero fields are checked as their defaults.
func (c CircuitConfig) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("circuit_break: "+format, args...))
	}
	d := c.withDefaults()
	triggerOK := finitePositive(d.Trigger)
	if !triggerOK {
		add("trigger %s must be a finite number > 0 (unset means %s)", fmtLine(c.Trigger), fmtLine(DefaultCircuitTrigger))
	}
	switch {
	case !finitePositive(d.Recover):
		add("recover %s must be a finite number > 0 and below trigger (unset means %s)", fmtLine(c.Recover), fmtLine(DefaultCircuitRecover))
	case triggerOK && d.Recover >= d.Trigger:
		add("recover %s%s must be below trigger %s%s", fmtLine(d.Recover), unset(c.Recover == 0), fmtLine(d.Trigger), unset(c.Trigger == 0))
	}
	if c.Hold < 0 {
		add("hold %s must not be negative (unset means %s)", c.Hold, DefaultCircuitHold)
	}
	if !(d.Saturation > 0 && d.Saturation <= 1) {
		add("saturation %s must be in (0, 1] (unset means %s)", fmtLine(c.Saturation), fmtLine(DefaultCircuitSaturation))
	}
	if d.Window < MinCircuitWindow {
		add("window %s must be at least %s (unset means %s)", c.Window, MinCircuitWindow, DefaultCircuitWindow)
	}
	if len(c.Order) < 2 {
		add("order needs at least 2 tiers, lowest first (the last is never shed), got %d", len(c.Order))
	}
	for i, name := range c.Order {
		if name == "" {
			add("order: tier #%d has an empty name", i+1)
			continue
		}
		if j := slices.Index(c.Order[:i], name); j >= 0 {
			add("order: tier %q appears twice (#%d and #%d); tier names must be unique", name, j+1, i+1)
		}
	}
	return errors.Join(errs...)
}

// unset marks a value in an error message that the operator did not write.
func unset(isDefault bool) string {
	if isDefault {
		return " (default)"
	}
	return ""
}

// Circuit is the tiered circuit breaker of the package doc. Feed it every
// arrival with Arrive, the upstreams' saturation with Saturated and their
// capacity with Observe; ask Shed at admission. Not safe for concurrent use.
type Circuit struct {
	cfg       CircuitConfig // defaults applied; Order owned
	resources []string      // what demand is measured in, one capacity each
	ladder    *Ladder       // step i sheds cfg.Order[i]; len(Order)-1 steps

	width     time.Duration // one bucket: Window / circuitBuckets
	windowSec float64       // circuitBuckets × width, in seconds

	started bool
	origin  time.Time // start of bucket 0: the first time seen
	cur     int64     // index of the current bucket since origin
	next    time.Time // start of bucket cur+1: earlier times need no index
	last    time.Time // latest time seen, where Carry reads the window

	// satOn says the upstreams are saturated since satAt, up to which
	// their saturated time is credited to the buckets.
	satOn bool
	satAt time.Time

	// ring holds circuitBuckets+1 buckets of cols sums, bucket k at slot
	// k mod (circuitBuckets+1): per resource r, len(Order)+1 sums of
	// units (column r×(len(Order)+1)+i for tier i, len(Order) being the
	// tier-less demand), then the seconds saturated (column satCol).
	// full is, per column, the sum of the complete buckets
	// cur-circuitBuckets .. cur-1.
	ring   []float64
	full   []float64
	satCol int

	rate   []float64 // scratch, per column: units/s over the window
	demand []float64 // scratch, per step: the step's demand signal on the binding resource, units/s
	waters []float64 // scratch, per step: the step's signal
	bind   []int     // scratch, per step: the binding resource
}

// NewCircuit validates cfg and returns a circuit with every tier admitted
// and an empty window. It measures demand in each of resources (names, for
// reports; none means one unnamed resource), each against its own capacity.
func NewCircuit(cfg CircuitConfig, resources ...string) (*Circuit, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(resources) == 0 {
		resources = []string{""}
	}
	d := cfg.withDefaults()
	d.Order = slices.Clone(d.Order)
	n := len(d.Order)
	steps := make([]Step, n-1)
	for i := range steps {
		steps[i] = Step{Name: d.Order[i], Trigger: d.Trigger, Recover: d.Recover}
	}
	width := d.Window / circuitBuckets
	cols := len(resources)*(n+1) + 1
	return &Circuit{
		cfg:       d,
		resources: slices.Clone(resources),
		ladder:    newLadder(steps, d.Hold),
		width:     width,
		windowSec: (width * circuitBuckets).Seconds(),
		ring:      make([]float64, (circuitBuckets+1)*cols),
		full:      make([]float64, cols),
		satCol:    cols - 1,
		rate:      make([]float64, cols),
		demand:    make([]float64, n-1),
		waters:    make([]float64, n-1),
		bind:      make([]int, n-1),
	}, nil
}

// CircuitTransition is one tier being shed (Up, From+1 == To) or readmitted
// (!Up, From-1 == To), as reported by Observe.
type CircuitTransition struct {
	Tier     string  // the tier that moved
	From, To int     // level before and after (tiers shed)
	Up       bool    // shed (true) or readmitted (false)
	Ratio    float64 // Demand / Capacity: the signal that crossed the line
	// Resource is the resource whose demand set the signal (the largest
	// ratio), Demand its demand in units/s (Tier, the tiers above it and
	// tier-less arrivals) and Capacity its capacity as passed to Observe.
	Resource string
	Demand   float64
	Capacity float64
	// Saturation is the share of the window the upstreams were saturated.
	Saturation float64
	At         time.Time // the now passed to Observe
}

// String renders t for logs. Three decimals, so a ratio just over a line
// does not print as the line itself.
func (t CircuitTransition) String() string {
	verb := "readmitted"
	if t.Up {
		verb = "shed"
	}
	on := ""
	if t.Resource != "" {
		on = " of " + t.Resource
	}
	return fmt.Sprintf("circuit %s tier %s (level %d -> %d, demand %.3fx capacity%s, saturated %.0f%% of the window)",
		verb, t.Tier, t.From, t.To, t.Ratio, on, 100*t.Saturation)
}

// Arrive records the demand of one arriving request at now: units[r] in
// resource r. Call it for every arrival, refused ones included. Units that
// are NaN, infinite or <= 0 are ignored.
func (c *Circuit) Arrive(now time.Time, tier string, units ...float64) {
	c.credit(now)
	b := c.bucket(c.cur)
	col := c.column(tier)
	for r, u := range units[:min(len(units), len(c.resources))] {
		if u > 0 && !math.IsInf(u, 1) {
			b[r*(len(c.cfg.Order)+1)+col] += u
		}
	}
}

// Saturated records whether the upstreams are saturated from now on:
// every slot busy or the account exhausted, with requests waiting.
func (c *Circuit) Saturated(now time.Time, on bool) {
	c.credit(now)
	c.satOn = on
}

// Saturation returns the share of the window ending at now during which
// the upstreams were saturated, in [0, 1]. It moves the window to now.
func (c *Circuit) Saturation(now time.Time) float64 {
	c.credit(now)
	c.rates(now, c.rate)
	return c.saturation()
}

func (c *Circuit) saturation() float64 { return min(c.rate[c.satCol], 1) }

// Observe measures the demand at now against capacity (units/s per
// resource), applies the lines, the saturation gate and the hold rule, and
// returns the transitions made (nil when none).
func (c *Circuit) Observe(now time.Time, capacity ...float64) []CircuitTransition {
	if !c.signals(now, capacity) {
		return nil
	}
	sat := c.saturation()
	if sat < c.cfg.Saturation {
		// Not saturated for long enough: nothing is shed.
		for i, w := range c.waters {
			c.waters[i] = min(w, c.cfg.Trigger)
		}
	}
	trs := c.ladder.observe(now, 0, c.waters)
	if trs == nil {
		return nil
	}
	out := make([]CircuitTransition, len(trs))
	for k, tr := range trs {
		i := min(tr.From, tr.To)
		out[k] = CircuitTransition{Tier: tr.Step, From: tr.From, To: tr.To, Up: tr.Up,
			Ratio: tr.Water, Resource: c.resources[c.bind[i]], Demand: c.demand[i],
			Capacity: capacity[c.bind[i]], Saturation: sat, At: now}
	}
	return out
}

// Signals returns, for each sheddable tier, the signal Observe would
// compare with the lines at now (nil when no capacity is data).
func (c *Circuit) Signals(now time.Time, capacity ...float64) []float64 {
	if !c.signals(now, capacity) {
		return nil
	}
	return slices.Clone(c.waters)
}

// signals fills c.waters, c.demand and c.bind at now and reports whether
// any capacity is data.
func (c *Circuit) signals(now time.Time, capacity []float64) bool {
	c.credit(now)
	c.rates(now, c.rate)
	n := len(c.cfg.Order)
	ok := false
	for r := range c.resources {
		if r >= len(capacity) || !finitePositive(capacity[r]) {
			continue
		}
		col := c.rate[r*(n+1) : (r+1)*(n+1)]
		// Suffix sums from the top down, so the signals never increase
		// from a lower tier to a higher one, bit for bit.
		s := col[n]
		for i := n - 1; i >= 0; i-- {
			s += col[i]
			if i == n-1 {
				continue
			}
			if w := s / capacity[r]; !ok || w > c.waters[i] {
				c.demand[i], c.waters[i], c.bind[i] = s, w, r
			}
		}
		ok = true
	}
	return ok
}

// Shed reports whether requests of tier are refused now. Tier-less and
// unknown tiers, and the top tier, are never shed.
func (c *Circuit) Shed(tier string) bool {
	i := c.column(tier)
	return i < c.ladder.Level() // the tier-less column is len(Order) > any level
}

// Level returns the number of tiers shed: Order[:Level()] are shed.
func (c *Circuit) Level() int { return c.ladder.Level() }

// Tiers returns a copy of Order, the order of Demand's perTier.
func (c *Circuit) Tiers() []string { return slices.Clone(c.cfg.Order) }

// Resources returns a copy of the resources demand is measured in.
func (c *Circuit) Resources() []string { return slices.Clone(c.resources) }

// Config returns the configuration in force, defaults applied.
func (c *Circuit) Config() CircuitConfig {
	d := c.cfg
	d.Order = slices.Clone(d.Order)
	return d
}

// Demand returns the demand on resource r over the window ending at now,
// in units/s: perTier[i] for Order[i], tierless, and their total.
func (c *Circuit) Demand(now time.Time, r int) (perTier []float64, tierless, total float64) {
	c.credit(now)
	n := len(c.cfg.Order)
	rate := make([]float64, len(c.rate))
	c.rates(now, rate)
	if r < 0 || r >= len(c.resources) {
		return make([]float64, n), 0, 0
	}
	col := rate[r*(n+1) : (r+1)*(n+1)]
	for _, v := range col {
		total += v
	}
	return col[:n:n], col[n], total
}

// ReadmitIn returns how long from now tier stays shed at least: until the
// holds of it and of every shed tier above it have elapsed. 0 when it is
// not shed or only demand keeps it out.
func (c *Circuit) ReadmitIn(now time.Time, tier string) time.Duration {
	var wait time.Duration
	for i := c.column(tier); i < c.ladder.Level(); i++ {
		if c.ladder.moved[i] {
			wait = max(wait, c.ladder.lastAt[i].Add(c.ladder.hold).Sub(now))
		}
	}
	return wait
}

// Carry makes c, a circuit just built from a reloaded configuration, adopt
// the state of old, and returns c's level. Shed state and hold timers
// follow Ladder.Carry. The window restarts from old's rate per resource and
// tier, by name, as if steady over a whole window (an unknown tier counts
// as tier-less), with old's saturation: a reload neither forgets an
// overload nor readmits tiers on an empty window.
func (c *Circuit) Carry(old *Circuit) int {
	if old == nil {
		return c.Level()
	}
	c.ladder.Carry(old.ladder)
	c.started, c.cur = false, 0
	clear(c.ring)
	clear(c.full)
	c.satOn, c.satAt = old.satOn, old.satAt
	if !old.started {
		return c.Level()
	}
	r := make([]float64, len(old.rate))
	old.rates(old.last, r)
	per := make([]float64, len(c.full))
	on, n := len(old.cfg.Order), len(c.cfg.Order)
	for or, res := range old.resources {
		nr := slices.Index(c.resources, res)
		if nr < 0 {
			continue
		}
		for t, v := range r[or*(on+1) : (or+1)*(on+1)] {
			col := n
			if t < on {
				col = c.column(old.cfg.Order[t])
			}
			per[nr*(n+1)+col] += v * c.width.Seconds()
		}
	}
	per[c.satCol] = min(r[old.satCol], 1) * c.width.Seconds()
	c.started, c.origin, c.last = true, old.last, old.last
	c.next = c.origin.Add(c.width)
	for k := int64(-circuitBuckets); k < 0; k++ {
		copy(c.bucket(k), per)
		for t, v := range per {
			c.full[t] += v
		}
	}
	if c.satOn && c.satAt.Before(c.origin) {
		c.satAt = c.origin // credited up to there by the carried window
	}
	return c.Level()
}

// column returns tier's index in Order, or len(Order) (tier-less).
func (c *Circuit) column(tier string) int {
	for i, name := range c.cfg.Order {
		if name == tier {
			return i
		}
	}
	return len(c.cfg.Order)
}

// bucket returns the sums of bucket k (any k, negative included).
func (c *Circuit) bucket(k int64) []float64 {
	const m = circuitBuckets + 1
	cols := len(c.full)
	s := int(((k % m) + m) % m)
	return c.ring[s*cols : (s+1)*cols]
}

// credit adds the saturated time up to now to the buckets it fell in and
// moves the window to now. Every method moves the window through it.
func (c *Circuit) credit(now time.Time) {
	if c.satOn && c.started && now.After(c.satAt) {
		// Every call moves the window through here, so satAt is never
		// before the current bucket: each step lands in its own bucket.
		t := maxTime(c.satAt, now.Add(-(circuitBuckets+1)*c.width))
		for t.Before(now) {
			c.advance(t)
			end := minTime(now, c.next)
			c.bucket(c.cur)[c.satCol] += end.Sub(t).Seconds()
			t = end
		}
	}
	c.advance(now)
	c.satAt = maxTime(c.satAt, now)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// advance moves the window to now: a time in a later bucket clears the
// buckets entered and re-sums the complete ones, which keeps full free of
// accumulated rounding.
func (c *Circuit) advance(now time.Time) {
	if !c.started {
		c.started, c.origin, c.last, c.next = true, now, now, now.Add(c.width)
		return
	}
	if now.After(c.last) {
		c.last = now
	}
	if now.Before(c.next) {
		return
	}
	idx := int64(now.Sub(c.origin) / c.width)
	c.next = c.origin.Add(time.Duration(idx+1) * c.width)
	if idx <= c.cur {
		return // only when now.Sub saturated
	}
	for k := c.cur + 1; k <= idx && k <= c.cur+circuitBuckets+1; k++ {
		clear(c.bucket(k))
	}
	c.cur = idx
	clear(c.full)
	for k := idx - circuitBuckets; k < idx; k++ {
		for t, v := range c.bucket(k) {
			c.full[t] += v
		}
	}
}

// rates fills dst (one entry per column) with the demand over the window
// ending at now, in units/s, without moving the window: the current and
// the complete buckets, less the part of the oldest that has slid out.
func (c *Circuit) rates(now time.Time, dst []float64) {
	if !c.started {
		clear(dst)
		return
	}
	e := now.Sub(c.origin) - time.Duration(c.cur)*c.width
	frac := min(max(float64(e)/float64(c.width), 0), 1)
	cur, oldest := c.bucket(c.cur), c.bucket(c.cur-circuitBuckets)
	for t := range dst {
		dst[t] = max(cur[t]+c.full[t]-oldest[t]*frac, 0) / c.windowSec
	}
}
