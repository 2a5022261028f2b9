package degrade

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var circuitStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	simCapacity = 100.0                  // units/s the upstreams can serve
	simArrival  = 10 * time.Millisecond  // one arrival per tier with demand every simArrival
	simObserve  = 100 * time.Millisecond // one Observe every simObserve
)

var simTiers = []string{"low", "mid", "high"}

// mix is a demand in units/s per tier of simTiers, then tier-less.
type mix [4]float64

// split returns a demand of ratio × simCapacity shared as low/mid/high/none
// percentages.
func split(ratio float64, low, mid, high, none float64) mix {
	total := ratio * simCapacity
	return mix{total * low / 100, total * mid / 100, total * high / 100, total * none / 100}
}

func newTestCircuit(t testing.TB, cfg CircuitConfig) *Circuit {
	t.Helper()
	if cfg.Order == nil {
		cfg.Order = simTiers
	}
	c, err := NewCircuit(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The upstreams are saturated throughout: these tests are about the
	// demand signal; the saturation gate has its own.
	c.Saturated(circuitStart, true)
	return c
}

// circuitSim drives a circuit on a virtual clock: steady arrivals every
// simArrival at the rates demand gives, an Observe every simObserve. Each
// Observe is checked against a reference model of the documented rule,
// written independently of the ladder: the signal of tier k is D(k)/C with
// D(k) the demand of tiers k.. plus tier-less demand, as read by Demand.
type circuitSim struct {
	t        *testing.T
	c        *Circuit
	capacity float64
	at       time.Duration // virtual time since circuitStart

	level  int
	lastAt map[int]time.Time
	trs    []CircuitTransition // every transition, in order
	obs    int                 // observations made
	lastD  []float64           // D(k) at the last observation
}

func newSim(t *testing.T, cfg CircuitConfig) *circuitSim {
	return &circuitSim{t: t, c: newTestCircuit(t, cfg), capacity: simCapacity, lastAt: map[int]time.Time{}}
}

// run advances the virtual clock to until.
func (s *circuitSim) run(until time.Duration, demand func(at time.Duration) mix) {
	s.t.Helper()
	for s.at < until {
		s.at += simArrival
		now := circuitStart.Add(s.at)
		d := demand(s.at)
		for i, r := range d {
			tier := ""
			if i < len(simTiers) {
				tier = simTiers[i]
			}
			s.c.Arrive(now, tier, r*simArrival.Seconds())
		}
		if s.at%simObserve == 0 {
			s.observe()
		}
	}
}

func (s *circuitSim) observe() {
	s.t.Helper()
	s.obs++
	now := circuitStart.Add(s.at)
	per, tierless, total := s.c.Demand(now, 0)
	n := len(per)
	d := make([]float64, n)
	acc := tierless
	for i := n - 1; i >= 0; i-- {
		acc += per[i]
		d[i] = acc
	}
	if math.Abs(d[0]-total) > 1e-9*total {
		s.t.Fatalf("%v: Demand total %v, sum of tiers %v", s.at, total, d[0])
	}
	s.lastD = d
	cfg := s.c.Config()
	may := func(i int) bool {
		last, ok := s.lastAt[i]
		return !ok || now.Sub(last) >= cfg.Hold
	}
	var want []string
	level := s.level
	sat := s.c.Saturation(now)
	for level < n-1 && d[level]/s.capacity > cfg.Trigger && sat >= cfg.Saturation && may(level) {
		want = append(want, "+"+simTiers[level])
		s.lastAt[level] = now
		level++
	}
	if want == nil {
		for level > 0 && d[level-1]/s.capacity < cfg.Recover && may(level-1) {
			level--
			want = append(want, "-"+simTiers[level])
			s.lastAt[level] = now
		}
	}

	got := s.c.Observe(now, s.capacity)
	var names []string
	from := s.level
	for _, tr := range got {
		sign := "-"
		if tr.Up {
			sign = "+"
		}
		names = append(names, sign+tr.Tier)
		i := min(tr.From, tr.To)
		wantTo := from - 1
		if tr.Up {
			wantTo = from + 1
		}
		if tr.From != from || tr.To != wantTo || tr.Tier != simTiers[i] || !tr.At.Equal(now) ||
			tr.Demand != d[i] || tr.Ratio != d[i]/s.capacity || tr.Capacity != s.capacity || tr.Saturation != sat {
			s.t.Fatalf("%v: transition %+v, want From %d, Tier %s, Demand %v, Ratio %v", s.at, tr, from, simTiers[i], d[i], d[i]/s.capacity)
		}
		from = tr.To
	}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		s.t.Fatalf("%v: Observe made %v, the rule says %v (level %d, D %v)", s.at, names, want, s.level, d)
	}
	s.level = level
	if s.c.Level() != level {
		s.t.Fatalf("%v: Level() = %d, want %d", s.at, s.c.Level(), level)
	}
	for i, tier := range simTiers {
		if s.c.Shed(tier) != (i < level) {
			s.t.Fatalf("%v: Shed(%s) = %v at level %d", s.at, tier, s.c.Shed(tier), level)
		}
	}
	s.trs = append(s.trs, got...)
}

// admitted returns the ratio of the admitted demand to capacity at the last
// observation.
func (s *circuitSim) admitted() float64 { return s.lastD[s.level] / s.capacity }

func (s *circuitSim) names() []string {
	var out []string
	for _, tr := range s.trs {
		sign := "-"
		if tr.Up {
			sign = "+"
		}
		out = append(out, sign+tr.Tier)
	}
	return out
}

func constant(m mix) func(time.Duration) mix { return func(time.Duration) mix { return m } }

// TestCircuitShedsLowestFirst: (1) overload sheds from the lowest tier, a
// higher tier only while the remaining ratio is still above the trigger,
// never the top tier; the admitted ratio ends at most the trigger.
func TestCircuitShedsLowestFirst(t *testing.T) {
	cases := []struct {
		name        string
		demand      mix
		wantNames   string  // every transition over 10 minutes
		wantLevel   int     // final
		admittedLo  float64 // final admitted ratio within [lo, hi]
		admittedHi  float64
		firstShedBy time.Duration // upper bound on the first shed
	}{
		// D(0) = 1.5 > 1.3 sheds low; D(1) = 0.9 keeps mid.
		{"1.5x low40/mid30/high30", split(1.5, 40, 30, 30, 0), "[+low]", 1, 0.89, 0.91, 10*time.Second + simObserve},
		// Tier-less demand counts in every signal: D(1) = 1.5×0.6 = 0.9.
		{"1.5x low40/mid20/high20/none20", split(1.5, 40, 20, 20, 20), "[+low]", 1, 0.89, 0.91, 10*time.Second + simObserve},
		// D(0) = 2.5, D(1) = 1.5 > 1.3: mid goes too (later: the fresh
		// window reaches 1.3 for D(1) after D(0)); admitted = high, 0.75.
		{"2.5x low40/mid30/high30", split(2.5, 40, 30, 30, 0), "[+low +mid]", 2, 0.74, 0.76, 10*time.Second + simObserve},
		// The top tier alone is 1.5x: still never shed.
		{"5x low40/mid30/high30", split(5, 40, 30, 30, 0), "[+low +mid]", 2, 1.49, 1.51, 10*time.Second + simObserve},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, CircuitConfig{})
			s.run(10*time.Minute, constant(tc.demand))
			if got := fmt.Sprint(s.names()); got != tc.wantNames {
				t.Fatalf("transitions %s, want %s", got, tc.wantNames)
			}
			if s.level != tc.wantLevel || s.c.Shed("high") {
				t.Fatalf("level %d (Shed(high) %v), want %d", s.level, s.c.Shed("high"), tc.wantLevel)
			}
			if a := s.admitted(); a < tc.admittedLo || a > tc.admittedHi {
				t.Fatalf("admitted ratio %.4f, want [%v, %v]", a, tc.admittedLo, tc.admittedHi)
			}
			if a := s.admitted(); tc.wantLevel < len(simTiers)-1 && a > DefaultCircuitTrigger {
				t.Fatalf("admitted ratio %.4f above the trigger with tiers left to shed", a)
			}
			if first := s.trs[0].At.Sub(circuitStart); first > tc.firstShedBy {
				t.Fatalf("first shed at %v, want by %v (a fresh circuit: window + one observation)", first, tc.firstShedBy)
			}
			// mid is shed only at an observation where the demand left
			// after shedding low was itself over the line.
			for _, tr := range s.trs {
				if tr.Tier == "mid" && !(tr.Ratio > DefaultCircuitTrigger) {
					t.Fatalf("mid shed at ratio %.3f", tr.Ratio)
				}
			}
			t.Logf("%s; admitted %.3f", s.names(), s.admitted())
		})
	}
}

// TestCircuitRecoversTopFirst: (2) demand back at 0.8x readmits mid, then
// low, each no earlier than its hold and no later than the window and the
// hold allow.
func TestCircuitRecoversTopFirst(t *testing.T) {
	hold := DefaultCircuitHold
	t.Run("demand-bound", func(t *testing.T) {
		s := newSim(t, CircuitConfig{})
		drop := 60 * time.Second
		s.run(5*time.Minute, func(at time.Duration) mix {
			if at <= drop {
				return split(2.5, 40, 30, 30, 0)
			}
			return split(0.8, 40, 30, 30, 0)
		})
		if got := fmt.Sprint(s.names()); got != "[+low +mid -mid -low]" {
			t.Fatalf("transitions %s", got)
		}
		shedMid, shedLow := s.trs[1].At, s.trs[0].At
		backMid, backLow := s.trs[2].At, s.trs[3].At
		if !backLow.After(backMid) {
			t.Fatalf("low back at %v, not after mid at %v: demand readmits mid first", backLow, backMid)
		}
		if backMid.Sub(shedMid) < hold || backLow.Sub(shedLow) < hold {
			t.Fatalf("readmitted within the hold: mid %v after shed, low %v", backMid.Sub(shedMid), backLow.Sub(shedLow))
		}
		// Guarantee 5: settled by drop + Window + Window/10 + Hold + one observation.
		bound := circuitStart.Add(drop + 11*time.Second + hold + simObserve)
		if backLow.After(bound) {
			t.Fatalf("low back at %v, after the bound %v", backLow.Sub(circuitStart), bound.Sub(circuitStart))
		}
		if s.level != 0 {
			t.Fatalf("level %d at the end", s.level)
		}
		t.Logf("shed low %v mid %v; back mid %v low %v", shedLow.Sub(circuitStart), shedMid.Sub(circuitStart),
			backMid.Sub(circuitStart), backLow.Sub(circuitStart))
	})
	t.Run("hold-bound", func(t *testing.T) {
		// Demand drops 1.3 s after mid is shed and far enough that both
		// signals are under the line before mid's hold ends: mid is then
		// readmitted at the first observation its hold allows, and low in
		// the same call, after it.
		s := newSim(t, CircuitConfig{})
		s.run(time.Minute, func(at time.Duration) mix {
			if at <= 10*time.Second {
				return split(2.5, 40, 30, 30, 0)
			}
			return split(0.3, 40, 30, 30, 0)
		})
		if got := fmt.Sprint(s.names()); got != "[+low +mid -mid -low]" {
			t.Fatalf("transitions %s", got)
		}
		shedMid := s.trs[1].At
		if shedMid.After(circuitStart.Add(10 * time.Second)) {
			t.Fatalf("mid shed at %v, after the drop: the scenario is off", shedMid.Sub(circuitStart))
		}
		backMid, backLow := s.trs[2].At, s.trs[3].At
		if !backMid.Equal(backLow) {
			t.Fatalf("mid back at %v, low at %v: want one observation", backMid, backLow)
		}
		if wait := backMid.Sub(shedMid); wait < hold || wait >= hold+simObserve {
			t.Fatalf("mid readmitted %v after its shed, want the first observation in [hold, hold+%v)", wait, simObserve)
		}
	})
}

// TestCircuitNoFlapping: (3) constant demand moves each tier at most once;
// oscillating demand moves a tier at most once per hold.
func TestCircuitNoFlapping(t *testing.T) {
	t.Run("constant 1.5x for 10 minutes", func(t *testing.T) {
		s := newSim(t, CircuitConfig{})
		below := 0 // observations where the admitted ratio was under recover while low was shed
		s.run(10*time.Minute, func(at time.Duration) mix {
			if at%simObserve == simArrival && s.level == 1 && s.admitted() < DefaultCircuitRecover {
				below++
			}
			return split(1.5, 40, 30, 30, 0)
		})
		if got := fmt.Sprint(s.names()); got != "[+low]" {
			t.Fatalf("transitions %s over 10 minutes, want [+low] only", got)
		}
		// A rule readmitting by the admitted demand (0.9 < 1.0) would have
		// readmitted low here, then shed it again (1.5 > 1.3), every hold.
		if below < 5900 {
			t.Fatalf("admitted ratio under recover at only %d of 6000 observations: the scenario does not test the would-be rule", below)
		}
	})
	t.Run("readmitting low would land between recover and trigger", func(t *testing.T) {
		s := newSim(t, CircuitConfig{})
		s.run(30*time.Second, constant(split(1.5, 40, 30, 30, 0)))
		if s.level != 1 {
			t.Fatalf("level %d after 30 s at 1.5x", s.level)
		}
		before, obs := len(s.trs), s.obs
		// D(0) = 1.15 in [1.0, 1.3]: low must stay shed; D(1) = 0.69: mid stays.
		s.run(30*time.Second+10*time.Minute, constant(split(1.15, 40, 30, 30, 0)))
		if len(s.trs) != before || s.level != 1 {
			t.Fatalf("state changed at 1.15x: %v", s.names()[before:])
		}
		if s.obs-obs != 6000 {
			t.Fatalf("%d observations, want 6000", s.obs-obs)
		}
		if r := s.lastD[0] / s.capacity; r < 1.14 || r > 1.16 {
			t.Fatalf("would-be ratio %.4f, want 1.15", r)
		}
	})
	periods := []time.Duration{2 * time.Second, 7 * time.Second, 12 * time.Second, 30 * time.Second, 61 * time.Second}
	for _, period := range periods {
		t.Run(fmt.Sprintf("square wave 0.5x/2.5x period %v", period), func(t *testing.T) {
			s := newSim(t, CircuitConfig{})
			s.run(10*time.Minute, func(at time.Duration) mix {
				if at%period < period/2 {
					return split(2.5, 40, 30, 30, 0)
				}
				return split(0.5, 40, 30, 30, 0)
			})
			perTier := checkHold(t, s.trs, DefaultCircuitHold)
			for tier, n := range perTier {
				if n > 61 {
					t.Fatalf("%s moved %d times in 10 minutes, more than once per hold", tier, n)
				}
			}
			if period == 2*time.Second && fmt.Sprint(s.names()) != "[+low]" {
				// Five periods fill the window: it reads 1.5x, steadily.
				t.Fatalf("2 s period: transitions %v, want [+low]", s.names())
			}
			t.Logf("moves per tier %v", perTier)
		})
	}
	t.Run("random demand", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		s := newSim(t, CircuitConfig{Hold: 3 * time.Second, Window: 2 * time.Second})
		var cur mix
		s.run(30*time.Minute, func(at time.Duration) mix {
			if at%time.Second == simArrival {
				cur = split(3*rng.Float64(), 100*rng.Float64(), 100*rng.Float64(), 100*rng.Float64(), 20*rng.Float64())
			}
			return cur
		})
		perTier := checkHold(t, s.trs, 3*time.Second)
		if perTier["low"] == 0 || perTier["mid"] == 0 {
			t.Fatalf("moves %v: the scenario exercises nothing", perTier)
		}
		t.Logf("moves per tier %v", perTier)
	})
}

// checkHold asserts guarantee 3 on trs: per tier, transitions alternate shed,
// readmit, ... and are at least hold apart. It returns the moves per tier.
func checkHold(t *testing.T, trs []CircuitTransition, hold time.Duration) map[string]int {
	t.Helper()
	last := map[string]CircuitTransition{}
	count := map[string]int{}
	for _, tr := range trs {
		if tr.Tier == "high" {
			t.Fatalf("top tier moved: %v", tr)
		}
		if p, ok := last[tr.Tier]; ok {
			if tr.At.Sub(p.At) < hold {
				t.Fatalf("%s moved at %v and %v: less than the hold %v apart", tr.Tier, p.At.Sub(circuitStart), tr.At.Sub(circuitStart), hold)
			}
			if p.Up == tr.Up {
				t.Fatalf("%s: two moves in the same direction at %v and %v", tr.Tier, p.At.Sub(circuitStart), tr.At.Sub(circuitStart))
			}
		} else if !tr.Up {
			t.Fatalf("%s readmitted before it was shed", tr.Tier)
		}
		last[tr.Tier] = tr
		count[tr.Tier]++
	}
	return count
}

// TestCircuitWindow: the window reads a steady rate exactly (no saw-tooth
// as it slides), a spike shorter than the window does not trip, and a
// stream that stops reads zero after one window.
func TestCircuitWindow(t *testing.T) {
	t.Run("steady rate", func(t *testing.T) {
		s := newSim(t, CircuitConfig{})
		worst := 0.0
		s.run(2*time.Minute, func(at time.Duration) mix {
			if at > 12*time.Second && s.at%simObserve == 0 {
				worst = max(worst, math.Abs(s.lastD[0]-120)/120)
			}
			return split(1.2, 50, 25, 25, 0)
		})
		// One 10 ms arrival of 1.2 units in a 10 s window is 0.1 % of it.
		if worst > 0.002 {
			t.Fatalf("steady 120 units/s read with a relative error up to %.4f", worst)
		}
		if len(s.trs) != 0 {
			t.Fatalf("1.2x tripped: %v", s.names())
		}
	})
	t.Run("spike", func(t *testing.T) {
		// 1.0x with a 1 s spike at 3.0x: the window peaks near
		// (9×1.0 + 1×3.0)/10 = 1.2 < 1.3.
		s := newSim(t, CircuitConfig{})
		peak := 0.0
		s.run(2*time.Minute, func(at time.Duration) mix {
			if s.lastD != nil {
				peak = max(peak, s.lastD[0]/s.capacity)
			}
			if at > 60*time.Second && at <= 61*time.Second {
				return split(3, 40, 30, 30, 0)
			}
			return split(1, 40, 30, 30, 0)
		})
		if len(s.trs) != 0 {
			t.Fatalf("a 1 s spike tripped the circuit: %v", s.names())
		}
		if peak < 1.19 || peak > 1.21 {
			t.Fatalf("peak ratio %.4f, want 1.2", peak)
		}
	})
	t.Run("stops", func(t *testing.T) {
		c := newTestCircuit(t, CircuitConfig{})
		for at := simArrival; at <= 30*time.Second; at += simArrival {
			c.Arrive(circuitStart.Add(at), "mid", 1)
		}
		_, _, total := c.Demand(circuitStart.Add(30*time.Second), 0)
		if math.Abs(total-100) > 0.2 {
			t.Fatalf("demand %v, want 100", total)
		}
		_, _, half := c.Demand(circuitStart.Add(35*time.Second), 0)
		if math.Abs(half-50) > 0.2 {
			t.Fatalf("5 s after the stream stopped: demand %v, want 50", half)
		}
		// Window + Window/10 after the last arrival its bucket has slid out.
		per, tierless, total := c.Demand(circuitStart.Add(41*time.Second+simArrival), 0)
		if total != 0 || tierless != 0 || fmt.Sprint(per) != "[0 0 0]" {
			t.Fatalf("11 s after the stream stopped: %v %v %v", per, tierless, total)
		}
	})
}

func TestCircuitArriveInputs(t *testing.T) {
	c := newTestCircuit(t, CircuitConfig{})
	now := circuitStart
	c.Arrive(now, "low", 10)
	c.Arrive(now, "", 20)
	c.Arrive(now, "gold", 30) // not in Order: tier-less
	c.Arrive(now, "high", 40)
	for _, bad := range []float64{0, -5, math.NaN(), math.Inf(1), math.Inf(-1)} {
		c.Arrive(now, "mid", bad)
	}
	later := now.Add(5 * time.Second)
	c.Arrive(now.Add(-time.Hour), "mid", 5) // earlier than the current bucket: counted in it
	per, tierless, total := c.Demand(later, 0)
	want := []float64{1, 0.5, 4}
	for i, w := range want {
		if math.Abs(per[i]-w) > 1e-12 {
			t.Fatalf("perTier %v, want %v", per, want)
		}
	}
	if math.Abs(tierless-5) > 1e-12 || math.Abs(total-10.5) > 1e-12 {
		t.Fatalf("tierless %v total %v, want 5 and 10.5", tierless, total)
	}
	if c.Shed("gold") || c.Shed("") {
		t.Fatal("unknown tiers are never shed")
	}
}

func TestCircuitCapacityNoData(t *testing.T) {
	for _, capacity := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		c := newTestCircuit(t, CircuitConfig{})
		for at := simArrival; at <= time.Minute; at += simArrival {
			now := circuitStart.Add(at)
			c.Arrive(now, "low", 10) // 1000 units/s
			if trs := c.Observe(now, capacity); trs != nil {
				t.Fatalf("capacity %v: %v", capacity, trs)
			}
		}
		if c.Level() != 0 {
			t.Fatalf("capacity %v: level %d", capacity, c.Level())
		}
		if trs := c.Observe(circuitStart.Add(time.Minute), 100); len(trs) != 1 || trs[0].Tier != "low" {
			t.Fatalf("capacity 100 after no data: %v", trs)
		}
	}
}

func TestCircuitTransitionString(t *testing.T) {
	up := CircuitTransition{Tier: "low", From: 0, To: 1, Up: true, Ratio: 1.5234, Saturation: 0.971}
	if got, want := up.String(), "circuit shed tier low (level 0 -> 1, demand 1.523x capacity, saturated 97% of the window)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	down := CircuitTransition{Tier: "mid", From: 2, To: 1, Ratio: 0.8, Resource: "slots", Saturation: 0.5}
	if got, want := down.String(), "circuit readmitted tier mid (level 2 -> 1, demand 0.800x capacity of slots, saturated 50% of the window)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

func TestCircuitReadmitIn(t *testing.T) {
	c := newTestCircuit(t, CircuitConfig{Window: time.Second})
	at := func(d time.Duration) time.Time { return circuitStart.Add(d) }
	for d := time.Duration(0); d <= time.Second; d += simArrival {
		c.Arrive(at(d), "low", 2) // 200 units/s at 100 capacity
	}
	if trs := c.Observe(at(time.Second), 100); len(trs) != 1 {
		t.Fatalf("low not shed: %v", trs)
	}
	for d := time.Second; d <= 3*time.Second; d += simArrival {
		c.Arrive(at(d), "mid", 2)
	}
	if trs := c.Observe(at(3*time.Second), 100); len(trs) != 1 || trs[0].Tier != "mid" {
		t.Fatalf("mid not shed: %v", trs)
	}
	// low's hold ends at 11 s, mid's at 13 s; low waits for mid.
	cases := []struct {
		tier string
		now  time.Duration
		want time.Duration
	}{
		{"low", 4 * time.Second, 9 * time.Second},
		{"mid", 4 * time.Second, 9 * time.Second},
		{"mid", 12 * time.Second, time.Second},
		{"mid", 20 * time.Second, 0},
		{"high", 4 * time.Second, 0},
		{"gold", 4 * time.Second, 0},
	}
	for _, tc := range cases {
		if got := c.ReadmitIn(at(tc.now), tc.tier); got != tc.want {
			t.Errorf("ReadmitIn(%v, %s) = %v, want %v", tc.now, tc.tier, got, tc.want)
		}
	}
}

// TestCircuitValidate: (4) every problem at once, each naming its field and
// range; defaults fill zero fields.
func TestCircuitValidate(t *testing.T) {
	ok := []CircuitConfig{
		{Order: []string{"low", "high"}},
		{Trigger: 0.9, Recover: 0.5, Hold: time.Nanosecond, Window: MinCircuitWindow, Order: []string{"a", "b", "c", "d"}},
		{Trigger: 2, Order: []string{"low", "mid", "high"}},
		{Saturation: 1, Order: []string{"low", "high"}},
		{Saturation: 0.01, Order: []string{"low", "high"}},
	}
	for _, cfg := range ok {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	c := newTestCircuit(t, CircuitConfig{Order: []string{"low", "high"}})
	if got := fmt.Sprintf("%+v", c.Config()); got != "{Trigger:1.3 Recover:1 Hold:10s Window:10s Order:[low high] Saturation:0.9}" {
		t.Errorf("defaults: %s", got)
	}

	bad := []struct {
		cfg  CircuitConfig
		want []string
	}{
		{CircuitConfig{Trigger: 0.9, Order: simTiers},
			[]string{"circuit_break: recover 1.00 (default) must be below trigger 0.90"}},
		{CircuitConfig{Trigger: 1.2, Recover: 1.2, Order: simTiers},
			[]string{"circuit_break: recover 1.20 must be below trigger 1.20"}},
		{CircuitConfig{Recover: 1.5, Order: simTiers},
			[]string{"circuit_break: recover 1.50 must be below trigger 1.30 (default)"}},
		{CircuitConfig{Trigger: math.NaN(), Recover: math.Inf(1), Order: simTiers},
			[]string{"circuit_break: trigger NaN must be a finite number > 0 (unset means 1.30)",
				"circuit_break: recover +Inf must be a finite number > 0 and below trigger (unset means 1.00)"}},
		{CircuitConfig{Order: []string{"only"}},
			[]string{"circuit_break: order needs at least 2 tiers, lowest first (the last is never shed), got 1"}},
		{CircuitConfig{Order: nil},
			[]string{"circuit_break: order needs at least 2 tiers, lowest first (the last is never shed), got 0"}},
		{CircuitConfig{Trigger: -1, Recover: -2, Hold: -time.Second, Window: 50 * time.Millisecond, Order: []string{"low", "", "mid", "low"}},
			[]string{
				"circuit_break: trigger -1.00 must be a finite number > 0 (unset means 1.30)",
				"circuit_break: recover -2.00 must be a finite number > 0 and below trigger (unset means 1.00)",
				"circuit_break: hold -1s must not be negative (unset means 10s)",
				"circuit_break: window 50ms must be at least 100ms (unset means 10s)",
				"circuit_break: order: tier #2 has an empty name",
				`circuit_break: order: tier "low" appears twice (#1 and #4); tier names must be unique`,
			}},
		{CircuitConfig{Window: -time.Second, Order: simTiers},
			[]string{"circuit_break: window -1s must be at least 100ms (unset means 10s)"}},
		{CircuitConfig{Saturation: 1.5, Order: simTiers},
			[]string{"circuit_break: saturation 1.50 must be in (0, 1] (unset means 0.90)"}},
		{CircuitConfig{Saturation: -0.5, Order: simTiers},
			[]string{"circuit_break: saturation -0.50 must be in (0, 1] (unset means 0.90)"}},
		{CircuitConfig{Saturation: math.NaN(), Order: simTiers},
			[]string{"circuit_break: saturation NaN must be in (0, 1] (unset means 0.90)"}},
	}
	for _, tc := range bad {
		err := tc.cfg.Validate()
		if err == nil {
			t.Errorf("%+v: no error", tc.cfg)
			continue
		}
		if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
			t.Errorf("%+v:\n got %s\nwant %s", tc.cfg, got, want)
		}
		if c, err2 := NewCircuit(tc.cfg); c != nil || err2 == nil || err2.Error() != err.Error() {
			t.Errorf("NewCircuit(%+v) = %v, %v", tc.cfg, c, err2)
		}
	}
}

// TestCircuitCarry: (5) a reload keeps the shed state and hold timers of
// the common prefix of Order, and the measured demand by tier name.
func TestCircuitCarry(t *testing.T) {
	// old: 2.5x until both low and mid are shed, at a known time.
	build := func(t *testing.T, d time.Duration) *circuitSim {
		s := newSim(t, CircuitConfig{})
		s.run(d, constant(split(2.5, 40, 30, 30, 0)))
		if s.level != 2 {
			t.Fatalf("old level %d", s.level)
		}
		return s
	}
	t.Run("same order, new lines", func(t *testing.T) {
		old := build(t, 30*time.Second)
		c := newTestCircuit(t, CircuitConfig{Trigger: 1.4, Recover: 0.9})
		if got := c.Carry(old.c); got != 2 || !c.Shed("low") || !c.Shed("mid") {
			t.Fatalf("Carry level %d", got)
		}
		now := circuitStart.Add(old.at)
		oldPer, oldNone, oldTotal := old.c.Demand(now, 0)
		per, none, total := c.Demand(now, 0)
		for i := range per {
			if math.Abs(per[i]-oldPer[i]) > 1e-9*oldTotal {
				t.Fatalf("carried demand %v, old %v", per, oldPer)
			}
		}
		if none != oldNone || math.Abs(total-oldTotal) > 1e-9*oldTotal {
			t.Fatalf("carried total %v tier-less %v, old %v %v", total, none, oldTotal, oldNone)
		}
		// Holds have long elapsed: an empty window would readmit both at
		// the first observation. The carried one keeps the overload, and,
		// with no arrivals, drains linearly over the window: D(1) = 1.5x
		// falls under the new recover 0.9 after 4 s, D(0) = 2.5x after 6.4 s.
		var trs []CircuitTransition
		for at := simObserve; at <= 20*time.Second; at += simObserve {
			trs = append(trs, c.Observe(now.Add(at), simCapacity)...)
		}
		if len(trs) != 2 || trs[0].Tier != "mid" || trs[1].Tier != "low" {
			t.Fatalf("after draining: %v", trs)
		}
		if mid, low := trs[0].At.Sub(now), trs[1].At.Sub(now); mid < 4*time.Second || mid > 4100*time.Millisecond ||
			low < 6400*time.Millisecond || low > 6500*time.Millisecond {
			t.Fatalf("readmitted mid %v and low %v after the reload, want 4.0-4.1 s and 6.4-6.5 s", mid, low)
		}
	})
	t.Run("hold timers", func(t *testing.T) {
		// Reload 12 s in: mid was shed under 10 s ago. Its hold runs from
		// its old shed time, not from the reload.
		old := build(t, 12*time.Second)
		c := newTestCircuit(t, CircuitConfig{})
		c.Carry(old.c)
		now := circuitStart.Add(old.at)
		shedLow, shedMid := old.trs[0].At, old.trs[1].At
		wantWait := shedMid.Add(DefaultCircuitHold).Sub(now)
		if wantWait <= 0 {
			t.Fatalf("mid shed at %v: the scenario is off", shedMid.Sub(circuitStart))
		}
		if got := c.ReadmitIn(now, "low"); got != wantWait {
			t.Fatalf("ReadmitIn(low) %v after Carry, want %v (mid's hold)", got, wantWait)
		}
		var trs []CircuitTransition
		for at := simObserve; at <= 20*time.Second; at += simObserve {
			trs = append(trs, c.Observe(now.Add(at), simCapacity)...)
		}
		if len(trs) != 2 || trs[0].Tier != "mid" || trs[1].Tier != "low" {
			t.Fatalf("after draining: %v", trs)
		}
		if d := trs[0].At.Sub(shedMid); d < DefaultCircuitHold || d >= DefaultCircuitHold+simObserve {
			t.Fatalf("mid readmitted %v after its old shed, want the first observation after its hold", d)
		}
		if trs[1].At.Sub(shedLow) < DefaultCircuitHold {
			t.Fatalf("low readmitted within its carried hold")
		}
	})
	t.Run("orders", func(t *testing.T) {
		cases := []struct {
			order     []string
			wantLevel int
			wantShed  []string
		}{
			{[]string{"low", "mid", "top", "high"}, 2, []string{"low", "mid"}},
			{[]string{"low", "high"}, 1, []string{"low"}},    // mid is gone; only low's step is common
			{[]string{"low", "mid"}, 1, []string{"low"}},     // mid is the top now: never shed
			{[]string{"mid", "low", "high"}, 0, nil},         // no common prefix
			{[]string{"free", "low", "mid", "high"}, 0, nil}, // a new lowest tier starts admitted, and so does everything above it
		}
		for _, tc := range cases {
			old := build(t, 30*time.Second)
			c := newTestCircuit(t, CircuitConfig{Order: tc.order})
			if got := c.Carry(old.c); got != tc.wantLevel {
				t.Errorf("%v: level %d, want %d", tc.order, got, tc.wantLevel)
			}
			var shed []string
			for _, tier := range tc.order {
				if c.Shed(tier) {
					shed = append(shed, tier)
				}
			}
			if fmt.Sprint(shed) != fmt.Sprint(tc.wantShed) {
				t.Errorf("%v: shed %v, want %v", tc.order, shed, tc.wantShed)
			}
			// Demand carried by name; tiers the new order lacks are tier-less.
			now := circuitStart.Add(old.at)
			oldPer, _, oldTotal := old.c.Demand(now, 0)
			per, none, total := c.Demand(now, 0)
			if math.Abs(total-oldTotal) > 1e-9*oldTotal {
				t.Errorf("%v: total %v, old %v", tc.order, total, oldTotal)
			}
			wantNone := 0.0
			for i, tier := range simTiers {
				j := indexOf(tc.order, tier)
				if j < 0 {
					wantNone += oldPer[i]
					continue
				}
				if math.Abs(per[j]-oldPer[i]) > 1e-9*oldTotal {
					t.Errorf("%v: %s demand %v, old %v", tc.order, tier, per[j], oldPer[i])
				}
			}
			if math.Abs(none-wantNone) > 1e-9*oldTotal {
				t.Errorf("%v: tier-less %v, want %v", tc.order, none, wantNone)
			}
		}
	})
	t.Run("nil and unstarted", func(t *testing.T) {
		old := build(t, 30*time.Second)
		if got := old.c.Carry(nil); got != 2 {
			t.Fatalf("Carry(nil) changed the level to %d", got)
		}
		c := newTestCircuit(t, CircuitConfig{})
		c.Carry(old.c)
		fresh := newTestCircuit(t, CircuitConfig{})
		if got := c.Carry(fresh); got != 0 || c.Shed("low") {
			t.Fatalf("Carry(fresh) level %d", got)
		}
		if _, _, total := c.Demand(circuitStart, 0); total != 0 {
			t.Fatalf("Carry(fresh) kept demand %v", total)
		}
	})
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// TestCircuitNoAlloc: (6) Arrive (bucket changes included) and an Observe
// that changes nothing allocate nothing.
func TestCircuitNoAlloc(t *testing.T) {
	c := newTestCircuit(t, CircuitConfig{})
	now := circuitStart
	tiers := []string{"low", "mid", "high", "", "gold"}
	i := 0
	if a := testing.AllocsPerRun(10000, func() {
		now = now.Add(37 * time.Millisecond) // crosses a bucket every ~27 calls
		c.Arrive(now, tiers[i%len(tiers)], 1.5)
		i++
	}); a != 0 {
		t.Fatalf("Arrive: %v allocs/op", a)
	}
	if a := testing.AllocsPerRun(10000, func() {
		now = now.Add(37 * time.Millisecond)
		if c.Observe(now, 1e6) != nil {
			t.Fatal("moved")
		}
	}); a != 0 {
		t.Fatalf("Observe: %v allocs/op", a)
	}
	// Steady overload: after the shed, Observe changes nothing and allocates nothing.
	for k := 0; k < 1000; k++ {
		now = now.Add(10 * time.Millisecond)
		c.Arrive(now, "low", 2)
		c.Observe(now, 100)
	}
	if !c.Shed("low") {
		t.Fatal("low not shed")
	}
	if a := testing.AllocsPerRun(10000, func() {
		now = now.Add(10 * time.Millisecond)
		c.Arrive(now, "low", 2)
		if c.Observe(now, 100) != nil {
			t.Fatal("moved")
		}
		c.Shed("low")
	}); a != 0 {
		t.Fatalf("steady overload: %v allocs/op", a)
	}
	// Two resources and saturation changes: still nothing.
	c2, err := NewCircuit(CircuitConfig{Order: simTiers}, "slots", "account_tokens")
	if err != nil {
		t.Fatal(err)
	}
	units := []float64{0.5, 120}
	if a := testing.AllocsPerRun(10000, func() {
		now = now.Add(37 * time.Millisecond)
		c2.Arrive(now, tiers[i%len(tiers)], units...)
		c2.Saturated(now, i%3 == 0)
		c2.Observe(now, 100, 1e9)
		i++
	}); a != 0 {
		t.Fatalf("two resources: %v allocs/op", a)
	}
}

// BenchmarkCircuitArrive: one arrival, three tiers, a bucket change every
// 1000 arrivals (1 ms apart, 1 s buckets).
func BenchmarkCircuitArrive(b *testing.B) {
	c := newTestCircuit(b, CircuitConfig{})
	now := circuitStart
	tiers := []string{"low", "mid", "high"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond) // a new bucket every 1000 arrivals
		c.Arrive(now, tiers[i%3], 1.25)
		i++
	}
}

// BenchmarkCircuitObserve: one Arrive and one Observe that changes nothing
// (low already shed under a steady 1.5x), a bucket change every 10
// observations (100 ms apart).
func BenchmarkCircuitObserve(b *testing.B) {
	c := newTestCircuit(b, CircuitConfig{})
	now := circuitStart
	for k := 0; k < 20000; k++ {
		now = now.Add(time.Millisecond)
		c.Arrive(now, simTiers[k%3], 0.15) // 150 units/s
	}
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Millisecond) // a new bucket every 10 observations
		c.Arrive(now, "low", 15)
		c.Observe(now, 100)
	}
	if !c.Shed("low") {
		b.Fatal("low not shed")
	}
}

// TestCircuitSaturationGate: demand far over the trigger sheds nothing
// while the upstreams are saturated for less than Saturation of the
// window (the demand estimate is wrong, capacity idles); the same demand
// sheds once they have been saturated that long; readmission is not
// gated.
func TestCircuitSaturationGate(t *testing.T) {
	c, err := NewCircuit(CircuitConfig{Order: simTiers, Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) time.Time { return circuitStart.Add(d) }
	// 3x demand for a minute; saturated 0.5 s of every second: 50%.
	for d := simArrival; d <= time.Minute; d += simArrival {
		c.Arrive(at(d), "low", 3*simCapacity*simArrival.Seconds())
		c.Saturated(at(d), d%time.Second < 500*time.Millisecond)
		if trs := c.Observe(at(d), simCapacity); trs != nil {
			t.Fatalf("%v: shed at saturation %.3f: %v", d, c.Saturation(at(d)), trs)
		}
	}
	if s := c.Saturation(at(time.Minute)); math.Abs(s-0.5) > 0.011 {
		t.Fatalf("saturation %.4f, want 0.5", s)
	}
	// Saturated from 60 s on: the window reaches 90% saturated 9 s later
	// (it held 50%: 5 s of it, sliding out as the new seconds come in).
	var shedAt time.Duration
	for d := time.Minute + simArrival; d <= 90*time.Second; d += simArrival {
		c.Arrive(at(d), "low", 3*simCapacity*simArrival.Seconds())
		c.Saturated(at(d), true)
		for _, tr := range c.Observe(at(d), simCapacity) {
			if shedAt == 0 && tr.Up {
				shedAt = d
				if tr.Saturation < 0.9 || tr.Tier != "low" {
					t.Fatalf("shed %v", tr)
				}
			}
		}
	}
	if shedAt < 67*time.Second || shedAt > 69*time.Second {
		t.Fatalf("first shed at %v, want between 67 and 69 s (the window 90%% saturated)", shedAt)
	}
	// Demand stops and saturation ends: readmitted, top first, not gated.
	for d := 90*time.Second + simArrival; d <= 3*time.Minute; d += simArrival {
		c.Saturated(at(d), false)
		c.Observe(at(d), simCapacity)
	}
	if c.Level() != 0 {
		t.Fatalf("level %d after demand stopped, want 0", c.Level())
	}
}

// TestCircuitSaturationMeter: the saturated share of the window follows
// on/off spells exactly (time before the first call counts as not
// saturated), across bucket edges and spells longer than the ring.
func TestCircuitSaturationMeter(t *testing.T) {
	c, err := NewCircuit(CircuitConfig{Order: simTiers}) // 10 s window, 1 s buckets
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) time.Time { return circuitStart.Add(d) }
	c.Saturated(at(0), true)
	for _, tc := range []struct {
		d    time.Duration
		want float64
	}{{2500 * time.Millisecond, 0.25}, {10 * time.Second, 1}, {time.Hour, 1}} {
		if got := c.Saturation(at(tc.d)); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("at %v: %v, want %v", tc.d, got, tc.want)
		}
	}
	c.Saturated(at(time.Hour), false)
	// 3 s later: the window holds 7 s saturated.
	if got := c.Saturation(at(time.Hour + 3*time.Second)); math.Abs(got-0.7) > 1e-9 {
		t.Fatalf("3 s after the spell: %v, want 0.7", got)
	}
	// A 0.3 s spell every second for a minute reads 30%.
	for d := time.Hour + time.Minute; d < time.Hour+2*time.Minute; d += 100 * time.Millisecond {
		c.Saturated(at(d), d%time.Second < 300*time.Millisecond)
	}
	if got := c.Saturation(at(time.Hour + 2*time.Minute)); math.Abs(got-0.3) > 1e-9 {
		t.Fatalf("0.3 s a second: %v, want 0.3", got)
	}
	if got := c.Saturation(at(2 * time.Hour)); got != 0 {
		t.Fatalf("an hour later: %v, want 0", got)
	}
}

// TestCircuitResources: with demand measured on two resources each
// against its own capacity, a tier's signal is the larger ratio, and the
// transition names the resource that set it; a resource without
// capacity data is left out.
func TestCircuitResources(t *testing.T) {
	c, err := NewCircuit(CircuitConfig{Order: simTiers, Window: time.Second, Hold: time.Second}, "slots", "account_tokens")
	if err != nil {
		t.Fatal(err)
	}
	c.Saturated(circuitStart, true)
	at := func(d time.Duration) time.Time { return circuitStart.Add(d) }
	var trs []CircuitTransition
	for d := simArrival; d <= 3*time.Second; d += simArrival {
		// low: 0.5x of the slots, 2x of the account; high: 0.4x of each.
		c.Arrive(at(d), "low", 0.5*simCapacity*simArrival.Seconds(), 2*1000*simArrival.Seconds())
		c.Arrive(at(d), "high", 0.4*simCapacity*simArrival.Seconds(), 0.4*1000*simArrival.Seconds())
		trs = append(trs, c.Observe(at(d), simCapacity, 1000)...)
	}
	// Shed as soon as the fresh window is 90% saturated: the account's
	// ratio is then 0.9 x 2.4.
	if len(trs) != 1 || trs[0].Tier != "low" || trs[0].Resource != "account_tokens" || trs[0].Capacity != 1000 ||
		trs[0].Ratio < 2.1 || trs[0].Saturation < 0.9 {
		t.Fatalf("transitions %+v, want low shed on account_tokens at about 2.2x", trs)
	}
	sig := c.Signals(at(3*time.Second), simCapacity, 1000)
	// One 10 ms arrival is 1% of the 1 s window.
	if len(sig) != 2 || math.Abs(sig[0]-2.4) > 0.025 || math.Abs(sig[1]-0.4) > 0.005 {
		t.Fatalf("signals %v, want [2.4 0.4]", sig)
	}
	if sig := c.Signals(at(3*time.Second), simCapacity); math.Abs(sig[0]-0.9) > 0.01 {
		t.Fatalf("slots alone: signals %v, want [0.9 0.4]", sig)
	}
	if sig := c.Signals(at(3*time.Second), 0, math.NaN()); sig != nil {
		t.Fatalf("no capacity data: %v", sig)
	}
	if per, _, total := c.Demand(at(3*time.Second), 1); math.Abs(per[0]-2000) > 25 || math.Abs(total-2400) > 25 {
		t.Fatalf("account demand %v total %v", per, total)
	}
	if per, _, total := c.Demand(at(3*time.Second), 7); total != 0 || len(per) != 3 {
		t.Fatalf("resource out of range: %v %v", per, total)
	}
	// A reload that drops the account keeps the slots' demand by name and
	// the saturation.
	n, err := NewCircuit(CircuitConfig{Order: simTiers, Window: time.Second, Hold: time.Second}, "slots")
	if err != nil {
		t.Fatal(err)
	}
	n.Carry(c)
	if _, _, total := n.Demand(at(3*time.Second), 0); math.Abs(total-90) > 1.5 {
		t.Fatalf("carried slots demand %v, want 90", total)
	}
	if s := n.Saturation(at(3 * time.Second)); math.Abs(s-1) > 1e-9 {
		t.Fatalf("carried saturation %v, want 1", s)
	}
	if !n.Shed("low") {
		t.Fatal("carried circuit readmitted low")
	}
}

// BenchmarkCircuitArriveResources: BenchmarkCircuitArrive on three
// resources (slot-seconds, an account's tokens and requests), the
// saturation told on every other arrival: the queue's circuit behind a
// provider account.
func BenchmarkCircuitArriveResources(b *testing.B) {
	c, err := NewCircuit(CircuitConfig{Order: simTiers}, "slots", "account_tokens", "account_requests")
	if err != nil {
		b.Fatal(err)
	}
	now := circuitStart
	tiers := []string{"low", "mid", "high"}
	units := []float64{0.4, 1200, 1}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		c.Arrive(now, tiers[i%3], units...)
		c.Saturated(now, i%4 < 2)
		i++
	}
}
