package budget

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Defaults for ThroughputConfig fields left zero.
const (
	DefaultWindow         = 60 * time.Second
	DefaultBuckets        = 12
	DefaultQuantile       = 0.25
	DefaultMinCompletions = 4
)

// ThroughputConfig configures a Throughput. Zero fields take the defaults.
type ThroughputConfig struct {
	// Window is the span of completed buckets the estimate looks at; it
	// should exceed a long request's latency. Default 60s.
	Window time.Duration
	// Buckets splits Window; bucket width = Window/Buckets. Default 12.
	Buckets int
	// Quantile of the sample rates taken as the measured rate, in (0, 1].
	// Default 0.25: low, because LLM throughput is long-tailed.
	Quantile float64
	// Prior is the rate in cost units per second per unit of healthy (see
	// Observe) assumed before any data; it fades out over Warmup of busy
	// time. 0 means no prior: Rate is 0 until there is data.
	Prior float64
	// MinCompletions is the fewest completions a sample may hold. Default 4.
	MinCompletions int
	// Warmup is the busy time of data after which the prior no longer counts.
	// Default Window/4. Negative means no warm-up: data replaces the prior at
	// once.
	Warmup time.Duration
}

// ThroughputStats is a snapshot of the estimator, for metrics and tests.
type ThroughputStats struct {
	Rate        float64 // PerUpstream × healthy: what Rate returns
	PerUpstream float64 // blended per-upstream rate
	Measured    float64 // quantile of the sample rates (0 without samples)
	// Mean is the samples' cost over their busy time (0 without samples):
	// the unbiased rate early refusal uses, where Measured, a low quantile,
	// is what the queue promises on.
	Mean        float64
	Samples     int           // samples in the window
	Covered     time.Duration // busy time inside the samples
	PriorWeight float64       // weight of the prior/learned base in PerUpstream, 0..1
	Learned     float64       // last fully warmed-up measured rate, 0 if none yet
}

type bucket struct {
	epoch   int64         // bucket number since origin; a mismatch means empty
	busy    time.Duration // busy time inside this bucket
	cost    float64       // Σ cost/healthy of completions observed while busy
	n       int           // completions observed while busy
	allCost float64       // Σ cost of all completions, busy or not (MeanCost)
	allN    int           // all completions
}

// Throughput estimates the rate at which the upstreams complete work, in cost
// units per second. See the package documentation for the model.
type Throughput struct {
	width  time.Duration
	nb     int64 // complete buckets in the window
	q      float64
	prior  float64
	minN   int
	warmup time.Duration

	ring    []bucket  // nb+1 entries: nb complete plus the current one
	scratch []float64 // nb entries, for sorting sample rates

	started bool
	origin  time.Time
	last    time.Time // busy time is accounted up to here
	cur     int64     // current (incomplete) bucket number
	busy    bool

	valid      bool  // stats is computed for cacheEpoch
	cacheEpoch int64 //
	stats      ThroughputStats

	learned  float64
	lastMean float64
}

// NewThroughput returns an estimator with cfg, zero fields set to defaults.
func NewThroughput(cfg ThroughputConfig) *Throughput {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = DefaultBuckets
	}
	if int64(cfg.Buckets) > int64(cfg.Window) {
		cfg.Buckets = int(cfg.Window) // width at least 1ns
	}
	if !(cfg.Quantile > 0) { // also NaN
		cfg.Quantile = DefaultQuantile
	}
	cfg.Quantile = min(cfg.Quantile, 1)
	if !(cfg.Prior > 0) || math.IsInf(cfg.Prior, 1) {
		cfg.Prior = 0
	}
	if cfg.MinCompletions <= 0 {
		cfg.MinCompletions = DefaultMinCompletions
	}
	// Zero means the default, negative no warm-up.
	cfg.Warmup = max(cmp.Or(cfg.Warmup, cfg.Window/4), 0)
	return &Throughput{
		width:   cfg.Window / time.Duration(cfg.Buckets),
		nb:      int64(cfg.Buckets),
		q:       cfg.Quantile,
		prior:   cfg.Prior,
		minN:    cfg.MinCompletions,
		warmup:  cfg.Warmup,
		ring:    make([]bucket, cfg.Buckets+1),
		scratch: make([]float64, 0, cfg.Buckets),
	}
}

// SetBusy reports whether the system is saturated from now on: no dispatch
// slot free, or a request waiting. Only busy time and its completions feed
// the rate.
func (t *Throughput) SetBusy(now time.Time, busy bool) {
	t.advance(now)
	t.busy = busy
}

// Observe records a completion of cost units at now, with healthy upstreams
// (any capacity measure, the same as passed to Rate). healthy <= 0 counts
// as 1. Negative, NaN or infinite costs are ignored.
func (t *Throughput) Observe(now time.Time, cost float64, healthy int) {
	if !(cost >= 0) || math.IsInf(cost, 1) {
		return
	}
	t.advance(now)
	b := &t.ring[t.cur%int64(len(t.ring))]
	b.allCost += cost
	b.allN++
	if t.busy {
		if healthy < 1 {
			healthy = 1
		}
		b.cost += cost / float64(healthy)
		b.n++
	}
}

// Rate returns the estimated throughput in cost units per second with
// healthy upstreams: the per-upstream estimate × healthy; 0 when
// healthy <= 0.
func (t *Throughput) Rate(now time.Time, healthy int) float64 {
	if healthy <= 0 {
		t.advance(now)
		return 0
	}
	return t.perUpstream(now) * float64(healthy)
}

// ETA is ETA(workAhead, t.Rate(now, healthy)).
func (t *Throughput) ETA(now time.Time, workAhead float64, healthy int) time.Duration {
	if !(workAhead > 0) {
		return 0
	}
	return ETA(workAhead, t.Rate(now, healthy))
}

// Stats returns a snapshot of the estimate at now with healthy upstreams.
func (t *Throughput) Stats(now time.Time, healthy int) ThroughputStats {
	t.perUpstream(now)
	s := t.stats
	if healthy > 0 {
		s.Rate = s.PerUpstream * float64(healthy)
	} else {
		s.Rate = 0
	}
	return s
}

// MeanCost returns the mean cost of one completion over the window (all
// completions, busy or not, including the current bucket); when the window
// holds none, the last non-zero mean seen; 0 before any completion.
func (t *Throughput) MeanCost(now time.Time) float64 {
	t.advance(now)
	var c float64
	var n int
	for k := t.cur; k >= 0 && k >= t.cur-t.nb; k-- {
		b := &t.ring[k%int64(len(t.ring))]
		if b.epoch != k {
			continue
		}
		c += b.allCost
		n += b.allN
	}
	if n > 0 {
		t.lastMean = c / float64(n)
	}
	return t.lastMean
}

func (t *Throughput) bucketStart(k int64) time.Time {
	return t.origin.Add(time.Duration(k) * t.width)
}

// advance moves the window to now, crediting busy time to every bucket the
// interval since the last call overlaps.
func (t *Throughput) advance(now time.Time) {
	if !t.started {
		t.started = true
		t.origin, t.last, t.cur = now, now, 0
		t.ring[0] = bucket{}
		return
	}
	if now.Before(t.last) {
		return // time went backwards: treat as t.last
	}
	n := int64(len(t.ring))
	e := int64(now.Sub(t.origin) / t.width)
	if e > t.cur {
		// Close the current bucket.
		if t.busy {
			t.ring[t.cur%n].busy += t.bucketStart(t.cur + 1).Sub(t.last)
		}
		// Buckets strictly between; only the last n-1 of them can survive.
		first := t.cur + 1
		if e-first > n-1 {
			first = e - (n - 1)
		}
		for k := first; k < e; k++ {
			b := &t.ring[k%n]
			*b = bucket{epoch: k}
			if t.busy {
				b.busy = t.width
			}
		}
		t.ring[e%n] = bucket{epoch: e}
		t.cur = e
		t.last = t.bucketStart(e)
	}
	if t.busy {
		t.ring[e%n].busy += now.Sub(t.last)
	}
	t.last = now
}

// perUpstream advances to now and returns the blended per-upstream rate,
// recomputing it once per bucket.
func (t *Throughput) perUpstream(now time.Time) float64 {
	t.advance(now)
	if !t.valid || t.cacheEpoch != t.cur {
		t.compute()
		t.valid, t.cacheEpoch = true, t.cur
	}
	return t.stats.PerUpstream
}

// compute blends the samples' low quantile with the prior or the learned
// rate.
func (t *Throughput) compute() {
	samples, covered, cost := t.samples()
	var mean float64
	if len(samples) > 0 && covered > 0 {
		mean = cost / covered.Seconds()
	}
	measured := quantile(samples, t.q)
	base := t.prior
	if t.learned > 0 {
		base = t.learned
	}
	var f float64 // weight of the measurement
	switch {
	case len(samples) == 0:
		f = 0
	case base <= 0 || covered >= t.warmup:
		f = 1
	default:
		f = covered.Seconds() / t.warmup.Seconds()
	}
	if len(samples) > 0 && covered >= t.warmup && measured > 0 {
		t.learned = measured
	}
	t.stats = ThroughputStats{
		PerUpstream: f*measured + (1-f)*base,
		Measured:    measured,
		Mean:        mean,
		Samples:     len(samples),
		Covered:     covered,
		PriorWeight: 1 - f,
		Learned:     t.learned,
	}
}

// samples groups the complete buckets, newest first, into samples of at
// least a bucket's busy time and minN completions, and returns their rates,
// the busy time they cover and their total cost. A trailing group too small
// to be a sample joins the last one.
func (t *Throughput) samples() (rates []float64, covered time.Duration, cost float64) {
	n := int64(len(t.ring))
	rates = t.scratch[:0]
	var (
		gCost, lCost float64       // open group; last closed sample
		gBusy, lBusy time.Duration // open group; last closed sample
		gN           int
	)
	for k := t.cur - 1; k >= max(t.cur-t.nb, 0); k-- {
		b := &t.ring[k%n]
		if b.epoch != k || (b.busy == 0 && b.n == 0) {
			continue // never touched, or idle throughout
		}
		gCost += b.cost
		gBusy += b.busy
		gN += b.n
		cost += b.cost
		if gBusy >= t.width && gN >= t.minN {
			rates = append(rates, gCost/gBusy.Seconds())
			covered += gBusy
			lCost, lBusy = gCost, gBusy
			gCost, gBusy, gN = 0, 0, 0
		}
	}
	if gBusy > 0 {
		if len(rates) > 0 {
			rates[len(rates)-1] = (lCost + gCost) / (lBusy + gBusy).Seconds()
		} else {
			rates = append(rates, gCost/gBusy.Seconds())
		}
		covered += gBusy
	}
	return rates, covered, cost
}

// quantile returns the q-quantile of xs (sorted in place), interpolating
// linearly between order statistics; 0 for no values.
func quantile(xs []float64, q float64) float64 {
	switch len(xs) {
	case 0:
		return 0
	case 1:
		return xs[0]
	}
	slices.Sort(xs)
	h := q * float64(len(xs)-1)
	i := int(h)
	if i >= len(xs)-1 {
		return xs[len(xs)-1]
	}
	return xs[i] + (h-float64(i))*(xs[i+1]-xs[i])
}
