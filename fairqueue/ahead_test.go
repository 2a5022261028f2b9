package fairqueue

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// aheadDriver drives a queue through random operations for the work-ahead
// index's property test, keeping the tickets it may act on.
type aheadDriver struct {
	tb       testing.TB
	q        *Queue
	clk      *ManualClock
	rng      *rand.Rand
	cfg      Config
	queued   []*Ticket // admitted; some may have left since (checked on use)
	inflight []*Ticket
	// checks counts the work-ahead comparisons made, worst the largest
	// difference seen relative to its scale.
	checks int
	worst  float64
	// cover counts the comparisons where other tenants had work ahead, by
	// case: [0] any, [1] a request of a paused class, [2] an undeclared
	// tenant's, [3] with a tenant filed in tierLater, [4] in tierPaused.
	cover [5]int
	// switched counts, for a queue that switches between the walk and the
	// index, the checks that ended with the index kept [1] or not [0].
	switched [2]int
	// pauses counts the pause changes that found the index kept and
	// re-filed the class's tenants [0] or dropped it [1].
	pauses [2]int
}

var aheadClasses = []string{"a", "b", "c"}

func newAheadDriver(tb testing.TB, seed uint64) *aheadDriver {
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1))
	cfg := Config{
		MaxInflight:  1 + rng.IntN(3),
		Classes:      []ClassConfig{{Name: "a"}, {Name: "b"}, {Name: "c"}},
		Tenants:      map[string]TenantConfig{},
		Default:      TenantConfig{Weight: 0.5 + 2*rng.Float64(), Class: "b"},
		ExpiryMargin: 100 * time.Millisecond,
		IdleForget:   time.Duration(1+rng.IntN(20)) * time.Second,
		Admission: BudgetConfig{FastFail: true, BoostShareMax: 0.3, PerTenantBoostHourly: 50,
			Margin: 50 * time.Millisecond},
	}
	if seed%2 == 0 {
		cfg.Admission.Throughput.Prior = 200 + 2000*rng.Float64()
	}
	if seed%5 == 0 {
		cfg.CostUnit = CostRequests
	}
	if seed%3 == 0 {
		cfg.Default.MaxInflight = 1
	}
	for i := range 6 {
		tc := TenantConfig{Weight: 0.25 + 4*rng.Float64(), Class: aheadClasses[rng.IntN(3)]}
		switch i {
		case 1:
			tc.MaxInflight = 1 // capped: its flows leave the heaps
		case 2:
			tc.Quota = quota.MustCompile(quota.Config{QPS: 2}) // held by its quota
		}
		cfg.Tenants[fmt.Sprintf("d%d", i)] = tc
	}
	clk := NewManualClock(t0)
	q, err := New(cfg, clk)
	if err != nil {
		tb.Fatal(err)
	}
	// The index whatever the number of flows, but for every third seed,
	// which switches between the walk and the index at 8 and 4 flows.
	q.adm.walkMax = -1
	if seed%3 == 0 {
		q.adm.walkMax = 8
	}
	d := &aheadDriver{tb: tb, q: q, clk: clk, rng: rng, cfg: cfg}
	q.SetObserver(func(ev Event, tk *Ticket) {
		if ev == EventDispatched {
			d.inflight = append(d.inflight, tk)
		}
	})
	q.SetHealthy(1 + rng.IntN(2))
	return d
}

// tenantName picks a declared tenant, an undeclared one, or one that a
// reload may move between the two (m*).
func (d *aheadDriver) tenantName() string {
	switch r := d.rng.IntN(10); {
	case r < 4:
		return fmt.Sprintf("d%d", d.rng.IntN(6))
	case r < 6:
		return fmt.Sprintf("m%d", d.rng.IntN(3))
	default:
		return fmt.Sprintf("u%d", d.rng.IntN(25))
	}
}

func (d *aheadDriver) enqueue(deadline bool) {
	r := Request{Tenant: d.tenantName(), Cost: 1 + d.rng.Int64N(4000)}
	if d.rng.IntN(3) > 0 {
		r.Class = aheadClasses[d.rng.IntN(3)]
	}
	if deadline {
		r.Deadline = d.clk.Now().Add(time.Duration(200+d.rng.IntN(30000)) * time.Millisecond)
	}
	if tk, err := d.q.Enqueue(r); err == nil {
		d.queued = append(d.queued, tk)
	}
}

// pick removes and returns a random element of *l, nil when empty.
func (d *aheadDriver) pick(l *[]*Ticket) *Ticket {
	if len(*l) == 0 {
		return nil
	}
	i := d.rng.IntN(len(*l))
	tk := (*l)[i]
	(*l)[i] = (*l)[len(*l)-1]
	*l = (*l)[:len(*l)-1]
	return tk
}

func (d *aheadDriver) state(tk *Ticket) ticketState {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	return tk.state
}

// step applies one random operation; deadlines says whether requests may
// carry one (an ETA at admission).
func (d *aheadDriver) step(deadlines bool) {
	switch op := d.rng.IntN(100); {
	case op < 40:
		d.enqueue(deadlines && d.rng.IntN(2) == 0)
	case op < 62:
		if tk := d.pick(&d.inflight); tk != nil {
			if d.state(tk) != stateInflight {
				return
			}
			switch d.rng.IntN(4) {
			case 0:
				tk.Release(UnknownCost)
			case 1:
				if tk.Requeue() {
					d.queued = append(d.queued, tk)
				}
			default: // back-fill, up or down
				tk.Release(max(0, tk.Cost()+d.rng.Int64N(3000)-1500))
			}
		}
	case op < 70:
		if tk := d.pick(&d.queued); tk != nil {
			tk.Release(0) // cancel; a no-op on a ticket that has left
		}
	case op < 74:
		if len(d.queued) > 0 {
			tk := d.queued[d.rng.IntN(len(d.queued))]
			d.q.Promote(tk)
		}
	case op < 77:
		x := &d.q.adm.ahead
		cls, paused := aheadClasses[d.rng.IntN(3)], d.rng.IntN(2) == 0
		d.q.mu.Lock()
		active, epoch := x.active, x.epoch
		changed := d.q.classLocked(cls).paused != paused
		d.q.mu.Unlock()
		d.q.SetPaused(cls, paused)
		if active && changed {
			if x.epoch == epoch {
				d.pauses[0]++ // the class's tenants re-filed
			} else {
				d.pauses[1]++ // the index dropped
			}
		}
	case op < 79:
		d.reload()
	case op < 81:
		d.q.SetHealthy(d.rng.IntN(4))
	default:
		d.clk.Advance(time.Duration(d.rng.IntN(800)) * time.Millisecond)
		d.q.Tick()
	}
}

// reload changes weights, and declares or undeclares the m* tenants.
func (d *aheadDriver) reload() {
	cfg := d.cfg
	cfg.Tenants = map[string]TenantConfig{}
	for name, tc := range d.cfg.Tenants {
		if name[0] == 'm' && d.rng.IntN(2) == 0 {
			continue
		}
		tc.Weight = 0.25 + 4*d.rng.Float64()
		cfg.Tenants[name] = tc
	}
	for i := range 3 {
		if d.rng.IntN(2) == 0 {
			cfg.Tenants[fmt.Sprintf("m%d", i)] = TenantConfig{Weight: 0.25 + 4*d.rng.Float64(), Class: "a"}
		}
	}
	cfg.Default.Weight = 0.5 + 2*d.rng.Float64()
	if err := d.q.Reconfigure(cfg); err != nil {
		d.tb.Fatal(err)
	}
	d.cfg = cfg
}

// workAheadWalk is workAheadLocked by the walk over the backlogged flows
// whatever their number: the oracle.
func workAheadWalk(q *Queue, now time.Time, t *tenant, cq *classQ, own, cost int64) float64 {
	ahead, finish := q.workAheadOwnLocked(now, t, own, cost)
	return ahead + q.othersWalkLocked(t, cq, float64(own)+float64(cost), finish)
}

// check compares, under the lock, the index's work ahead with the walk's
// for every remembered tenant (up to 16) and class, at the tenant's whole queue and
// at a random point inside it, for a random cost.
func (d *aheadDriver) check(step int) {
	q := d.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	q.aheadSyncLocked()
	var tiers [numTiers]int
	for _, t := range q.tenants {
		if t.ahead.epoch == q.adm.ahead.epoch {
			tiers[t.ahead.tier]++
		}
	}
	defer func() {
		if q.adm.walkMax >= 0 {
			if q.adm.ahead.active {
				d.switched[1]++
			} else {
				d.switched[0]++
			}
		}
	}()
	n := 0
	for _, t := range q.tenants { // map order: a random sample
		if n++; n > 16 {
			break
		}
		for _, cq := range q.classes {
			for _, own := range []int64{t.queuedWork, d.rng.Int64N(t.queuedWork + 1)} {
				cost := 1 + d.rng.Int64N(5000)
				fast := q.workAheadLocked(now, t, cq, own, cost, true)
				walk := workAheadWalk(q, now, t, cq, own, cost)
				if walk > q.workAheadLocked(now, t, cq, own, cost, false)+0.5 {
					d.cover[0]++
					if cq.paused {
						d.cover[1]++
					}
					if t.group != nil {
						d.cover[2]++
					}
					if tiers[tierLater] > 0 {
						d.cover[3]++
					}
					if tiers[tierPaused] > 0 {
						d.cover[4]++
					}
				}
				scale := 1 + walk + float64(q.queuedWork)
				diff := math.Abs(fast - walk)
				d.checks++
				d.worst = max(d.worst, diff/scale)
				if diff > 1e-9*scale {
					d.tb.Fatalf("step %d: tenant %s class %s (paused %v) own %d cost %d: index %.9f, walk %.9f",
						step, t.name, cq.name, cq.paused, own, cost, fast, walk)
				}
			}
		}
	}
}

// TestWorkAheadIndexMatchesWalk drives queues through random enqueues
// (with and without deadlines, so admission itself asks for ETAs),
// dispatches, completions with back-fill up and down, requeues, cancels,
// promotions, pauses, reloads that change weights and move tenants in and
// out of the undeclared group, health changes, capped and quota-held
// tenants, expiries and forgetting, and asserts after every step that the
// work-ahead index gives the walk's work ahead, within 1e-9 of the work
// queued, for every tenant and class. Between checks the index is left to
// pile up marks, and a phase without ETAs must make it drop itself.
func TestWorkAheadIndexMatchesWalk(t *testing.T) {
	seeds, steps := 10, 1200
	if testing.Short() {
		seeds, steps = 4, 800
	}
	total, pausedChecks, dropped := 0, 0, 0
	var cover [5]int
	var switched, pauses [2]int
	worst := 0.0
	for seed := range uint64(seeds) {
		d := newAheadDriver(t, seed+1)
		for i := range steps {
			d.step(true)
			if d.rng.IntN(4) > 0 {
				d.check(i)
				if d.q.classes[0].paused || d.q.classes[1].paused || d.q.classes[2].paused {
					pausedChecks++
				}
			}
		}
		// A spell without ETAs (no Tick either: its early-refusal pass and
		// re-check ask for some): a burst of new tenants without
		// deadlines, and completions. Each tenant is marked once however
		// often it changes, so only new tenants grow the marks; past
		// twice the index the index drops itself (or the queue runs
		// empty, which drops it too).
		d.q.SetHealthy(1)
		d.check(steps)
		d.q.adm.walkMax = -1
		d.check(steps) // builds the index
		for i := 0; i < 8000 && d.q.adm.ahead.active; i++ {
			if d.rng.IntN(3) > 0 {
				if tk, err := d.q.Enqueue(Request{Tenant: fmt.Sprintf("burst%d", i), Cost: 1 + d.rng.Int64N(4000)}); err == nil {
					d.queued = append(d.queued, tk)
				}
			} else if tk := d.pick(&d.inflight); tk != nil {
				tk.Release(tk.Cost() + 100)
			}
		}
		// Most of the burst leaves again (cancelled), so the checks below
		// walk a queue of the usual size.
		for len(d.queued) > 100 {
			d.pick(&d.queued).Release(0)
		}
		if d.q.adm.ahead.active {
			t.Fatalf("seed %d: the index was kept through 8000 steps without an ETA", seed+1)
		}
		dropped++
		for i := range steps / 2 {
			d.step(true)
			d.check(steps + i)
		}
		total += d.checks
		worst = max(worst, d.worst)
		for i, c := range d.cover {
			cover[i] += c
		}
		pauses[0] += d.pauses[0]
		pauses[1] += d.pauses[1]
		switched[0] += d.switched[0]
		switched[1] += d.switched[1]
	}
	if pausedChecks == 0 {
		t.Fatal("no check ran with a class paused")
	}
	for i, what := range []string{"any request", "a paused class's request", "an undeclared tenant's request",
		"a tenant in tierLater", "a tenant in tierPaused"} {
		if cover[i] == 0 {
			t.Errorf("no comparison had other tenants' work ahead of %s", what)
		}
	}
	if switched[0] == 0 || switched[1] == 0 {
		t.Errorf("the queues with a walk limit never switched: %d checks walked, %d kept the index", switched[0], switched[1])
	}
	if pauses[0] == 0 || pauses[1] == 0 {
		t.Errorf("pause changes re-filed a class %d times and dropped the index %d times: want both", pauses[0], pauses[1])
	}
	t.Logf("pause changes: %d re-filed the class's tenants, %d dropped the index", pauses[0], pauses[1])
	t.Logf("walk limit 8: %d checks walked, %d kept the index", switched[0], switched[1])
	t.Logf("%d comparisons (%d steps with a class paused; with others' work ahead: %v), index dropped and rebuilt %d times, worst relative difference %.3g",
		total, pausedChecks, cover, dropped, worst)
}
