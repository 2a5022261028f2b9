package degrade

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	t0      = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	classes = []string{"realtime", "interactive", "batch"}
)

// designSteps is the ladder of DESIGN.md section 7.
func designSteps() []Step {
	return []Step{
		{Name: "L1", Trigger: 0.70, Recover: 0.60, Action: Action{Kind: ActionPause, Class: "batch"}},
		{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxInputTokens: 2048}},
		{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 20}}},
	}
}

func newDesignLadder(t testing.TB, hold time.Duration) *Ladder {
	t.Helper()
	l, err := NewLadder(designSteps(), hold, classes)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// sec converts seconds to a duration, exactly for multiples of 1ms.
func sec(s float64) time.Duration { return time.Duration(math.Round(s*1000)) * time.Millisecond }

// summary renders transitions as "L1+ L2+" / "L3- L2-" for table comparison.
func summary(ts []Transition) string {
	var parts []string
	for _, tr := range ts {
		sign := "-"
		if tr.Up {
			sign = "+"
		}
		parts = append(parts, tr.Step+sign)
	}
	return strings.Join(parts, " ")
}

type obs struct {
	at    float64 // seconds after t0
	water float64
	want  string // summary of the transitions returned
	level int    // Level() afterwards
}

func runObs(t *testing.T, l *Ladder, seq []obs) {
	t.Helper()
	for i, o := range seq {
		got := summary(l.Observe(t0.Add(sec(o.at)), o.water))
		if got != o.want || l.Level() != o.level {
			t.Fatalf("obs #%d (t=%gs, water=%g): transitions %q level %d, want %q level %d",
				i, o.at, o.water, got, l.Level(), o.want, o.level)
		}
	}
}

func TestObserveLadder(t *testing.T) {
	tests := []struct {
		name string
		hold time.Duration
		seq  []obs
	}{
		{
			name: "hysteresis: lines are strict, water between recover and trigger changes nothing",
			hold: 0,
			seq: []obs{
				{0, 0.70, "", 0}, // equal to trigger: not above
				{1, 0.7000001, "L1+", 1},
				{2, 0.65, "", 1}, // between recover and trigger
				{3, 0.60, "", 1}, // equal to recover: not below
				{4, 0.5999999, "L1-", 0},
				{5, 0.69, "", 0}, // below trigger again: stays released
				{6, 0.71, "L1+", 1},
			},
		},
		{
			name: "cumulative levels climb and descend one step at a time",
			hold: 0,
			seq: []obs{
				{0, 0.71, "L1+", 1},
				{1, 0.86, "L2+", 2},
				{2, 0.96, "L3+", 3},
				{3, 0.92, "", 3},
				{4, 0.89, "L3-", 2},
				{5, 0.80, "", 2},
				{6, 0.74, "L2-", 1},
				{7, 0.65, "", 1},
				{8, 0.59, "L1-", 0},
			},
		},
		{
			name: "multi-level jump up and down in one observation, in order",
			hold: 0,
			seq: []obs{
				{0, 0.99, "L1+ L2+ L3+", 3},
				{1, 0.10, "L3- L2- L1-", 0},
				{2, 0.90, "L1+ L2+", 2},
				{3, 0.76, "", 2}, // above L2 recover
				{4, 0.70, "L2-", 1},
			},
		},
		{
			name: "hold: release waits for hold after engage, then happens exactly at t+hold",
			hold: 5 * time.Second,
			seq: []obs{
				{0, 0.80, "L1+", 1},
				{1, 0.10, "", 1},
				{4.999, 0.10, "", 1},
				{5, 0.10, "L1-", 0}, // now - engagedAt == hold: allowed
			},
		},
		{
			name: "hold: re-engage waits for hold after release",
			hold: 5 * time.Second,
			seq: []obs{
				{0, 0.80, "L1+", 1},
				{5, 0.10, "L1-", 0},
				{6, 0.99, "", 0}, // L1 released at 5: held until 10; L2, L3 above it wait too
				{9.999, 0.99, "", 0},
				{10, 0.99, "L1+ L2+ L3+", 3}, // L2, L3 never moved: no hold
			},
		},
		{
			name: "hold is per step: a fresh upper step is not held by a lower one",
			hold: 5 * time.Second,
			seq: []obs{
				{0, 0.80, "L1+", 1},
				{0.1, 0.99, "L2+ L3+", 3},
				{5, 0.10, "", 3},              // L3 engaged at 0.1: held until 5.1, and L2, L1 below it wait
				{5.1, 0.10, "L3- L2- L1-", 0}, // all three holds have elapsed
			},
		},
		{
			name: "hold: a held step stops a jump and holds out the fresh steps above it",
			hold: 5 * time.Second,
			seq: []obs{
				{0, 0.86, "L1+ L2+", 2},
				{5, 0.72, "L2-", 1},          // below L2's recover, above L1's
				{6, 0.99, "", 1},             // L2 released at 5, held until 10; L3 (fresh) waits above it
				{10, 0.99, "L2+ L3+", 3},     // L2's hold elapsed
				{10.5, 0.10, "", 3},          // L3 engaged at 10, held until 15; L2 and L1 wait below it
				{15, 0.10, "L3- L2- L1-", 0}, // L2 engaged at 10, L1 at 0: all free
			},
		},
		{
			name: "hold 0: moves at every observation the lines allow",
			hold: 0,
			seq: []obs{
				{0, 0.99, "L1+ L2+ L3+", 3},
				{0, 0.10, "L3- L2- L1-", 0}, // same instant: now - last == 0 >= 0
				{0, 0.99, "L1+ L2+ L3+", 3},
			},
		},
		{
			name: "NaN water changes nothing; +Inf engages everything",
			hold: 0,
			seq: []obs{
				{0, math.NaN(), "", 0},
				{1, math.Inf(1), "L1+ L2+ L3+", 3},
				{2, math.NaN(), "", 3},
				{3, 0, "L3- L2- L1-", 0},
			},
		},
		{
			name: "time going backwards only holds",
			hold: 5 * time.Second,
			seq: []obs{
				{10, 0.80, "L1+", 1},
				{16, 0.10, "L1-", 0},
				{3, 0.99, "", 0}, // earlier than L1's last move: held
				{21, 0.99, "L1+ L2+ L3+", 3},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runObs(t, newDesignLadder(t, tc.hold), tc.seq)
		})
	}
}

func TestTransitionFields(t *testing.T) {
	l := newDesignLadder(t, time.Second)
	at := t0.Add(3 * time.Second)
	got := l.Observe(at, 0.97)
	want := []Transition{
		{Step: "L1", From: 0, To: 1, Up: true, Water: 0.97, At: at},
		{Step: "L2", From: 1, To: 2, Up: true, Water: 0.97, At: at},
		{Step: "L3", From: 2, To: 3, Up: true, Water: 0.97, At: at},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Observe = %+v\nwant %+v", got, want)
	}
	at2 := at.Add(time.Second)
	got = l.Observe(at2, 0.5)
	want = []Transition{
		{Step: "L3", From: 3, To: 2, Up: false, Water: 0.5, At: at2},
		{Step: "L2", From: 2, To: 1, Up: false, Water: 0.5, At: at2},
		{Step: "L1", From: 1, To: 0, Up: false, Water: 0.5, At: at2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Observe = %+v\nwant %+v", got, want)
	}
	if s := got[0].String(); s != "degrade L3 released (level 3 -> 2, water 0.500)" {
		t.Errorf("Transition.String() = %q", s)
	}
}

func TestActiveAndSteps(t *testing.T) {
	l := newDesignLadder(t, 0)
	steps := designSteps()
	if a := l.Active(); a != nil {
		t.Fatalf("Active at level 0 = %v, want nil", a)
	}
	for level, water := range []float64{0.1, 0.71, 0.86, 0.96} {
		l.Observe(t0, water)
		if l.Level() != level {
			t.Fatalf("water %g: level %d, want %d", water, l.Level(), level)
		}
		var want []Action
		for _, s := range steps[:level] {
			want = append(want, s.Action)
		}
		if got := l.Active(); !reflect.DeepEqual(got, want) {
			t.Fatalf("level %d: Active = %v, want %v", level, got, want)
		}
	}
	// Returned slices are copies.
	l.Active()[0].Class = "mutated"
	l.Steps()[0].Name = "mutated"
	if l.Active()[0].Class != "batch" || l.Steps()[0].Name != "L1" {
		t.Fatal("Active/Steps expose internal state")
	}
	if !reflect.DeepEqual(l.Steps(), steps) {
		t.Fatalf("Steps = %v, want %v", l.Steps(), steps)
	}
	// NewLadder copied its input.
	in := designSteps()
	l2, _ := NewLadder(in, 0, classes)
	in[0].Trigger = 0.01
	if l2.Steps()[0].Trigger != 0.70 {
		t.Fatal("NewLadder kept a reference to the caller's slice")
	}
	if l.hold != 0 {
		t.Fatal("Hold")
	}
}

func TestEmptyLadder(t *testing.T) {
	l, err := NewLadder(nil, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tr := l.Observe(t0, 5); tr != nil || l.Level() != 0 || l.Active() != nil {
		t.Fatalf("empty ladder moved: %v level %d", tr, l.Level())
	}
}

// TestNoFlapping oscillates the water level around each line every 100ms for
// 10 virtual minutes with a 5s hold and counts transitions.
func TestNoFlapping(t *testing.T) {
	const (
		hold  = 5 * time.Second
		tick  = 100 * time.Millisecond
		ticks = 6000 // 600s
	)
	tests := []struct {
		name      string
		lead      []float64 // observations before the oscillation
		lo, hi    float64   // alternates lo (even ticks), hi (odd ticks)
		want      int       // transitions over the whole run
		wantLevel int
	}{
		// Engages once at the first hi, never falls below L1's recover.
		{name: "around L1 trigger", lo: 0.69, hi: 0.71, want: 1, wantLevel: 1},
		// L1 engaged by the lead-in at t=0; releases once at the first lo
		// at or after 5s; never rises above the trigger again.
		{name: "around L1 recover", lead: []float64{0.71}, lo: 0.59, hi: 0.61, want: 2, wantLevel: 0},
		// First lo (0.84) engages L1, first hi engages L2; nothing releases.
		{name: "around L2 trigger", lo: 0.84, hi: 0.86, want: 2, wantLevel: 2},
		{name: "around L2 recover", lead: []float64{0.86}, lo: 0.74, hi: 0.76, want: 3, wantLevel: 1},
		{name: "around L3 trigger", lo: 0.94, hi: 0.96, want: 3, wantLevel: 3},
		{name: "around L3 recover", lead: []float64{0.99}, lo: 0.89, hi: 0.91, want: 4, wantLevel: 2},
		// Hysteresis alone: noise inside the band, no hold needed.
		{name: "inside L1 band", lead: []float64{0.71}, lo: 0.61, hi: 0.69, want: 1, wantLevel: 1},
		// Worst case, full swing across every line every tick: each step
		// moves once per 5.1s (the first tick at or after 5s past its last
		// move, ticks being 100ms apart and alternating), so all three move
		// together at t = 0.1 + 5.1k s, k = 0..117 (the last tick is 599.9s):
		// 118 moves x 3 steps.
		{name: "full swing across every line", lo: 0.0, hi: 1.0, want: 354, wantLevel: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newDesignLadder(t, hold)
			last := make(map[string]time.Time)
			count := 0
			now := t0
			record := func(ts []Transition) {
				for _, tr := range ts {
					if prev, ok := last[tr.Step]; ok && tr.At.Sub(prev) < hold {
						t.Fatalf("%s moved at %v, only %v after its previous move", tr.Step, tr.At.Sub(t0), tr.At.Sub(prev))
					}
					last[tr.Step] = tr.At
					count++
				}
			}
			for _, w := range tc.lead {
				record(l.Observe(now, w))
			}
			for i := 0; i < ticks; i++ {
				now = t0.Add(time.Duration(i) * tick)
				w := tc.lo
				if i%2 == 1 {
					w = tc.hi
				}
				record(l.Observe(now, w))
			}
			if count != tc.want || l.Level() != tc.wantLevel {
				t.Fatalf("%d transitions, final level %d; want %d, level %d", count, l.Level(), tc.want, tc.wantLevel)
			}
			// Guarantee 3 as a bound: at most ceil(600s/hold) = 120 moves per step.
			if count > len(designSteps())*120 {
				t.Fatalf("%d transitions exceed the hold bound", count)
			}
		})
	}
}

// TestInvariantsRandom drives ladders with random water series and checks
// every guarantee of the package documentation after every observation.
func TestInvariantsRandom(t *testing.T) {
	steps := []Step{
		{Name: "A", Trigger: 0.3, Recover: 0.2, Action: Action{Kind: ActionPause, Class: "batch"}},
		{Name: "B", Trigger: 0.5, Recover: 0.2, Action: Action{Kind: ActionPause, Class: "interactive"}},
		{Name: "C", Trigger: 0.7, Recover: 0.45, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxTokens: 64}},
		{Name: "D", Trigger: 0.9, Recover: 0.8, Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 5}}},
	}
	for _, hold := range []time.Duration{0, 700 * time.Millisecond, 3 * time.Second} {
		for seed := uint64(1); seed <= 5; seed++ {
			t.Run(fmt.Sprintf("hold=%v/seed=%d", hold, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 42))
				l, err := NewLadder(steps, hold, classes)
				if err != nil {
					t.Fatal(err)
				}
				n := len(steps)
				moved := make([]bool, n)
				lastAt := make([]time.Time, n)
				engaged := make([]bool, n)
				now := t0
				w := 0.5
				for k := 0; k < 20000; k++ {
					now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond) // 0..1.5s, repeats allowed
					switch r := rng.Float64(); {
					case r < 0.05:
						w = rng.Float64() * 1.2 // jump
					default:
						w = math.Max(0, w+(rng.Float64()-0.5)*0.1) // walk
					}
					before := l.Level()
					ts := l.Observe(now, w)
					level := before
					for j, tr := range ts {
						i := max(tr.From, tr.To) - 1
						if tr.From != level || tr.At != now || tr.Water != w || tr.Step != steps[i].Name {
							t.Fatalf("obs %d: transition %d = %+v, chain broken (level %d)", k, j, tr, level)
						}
						if tr.Up != ts[0].Up { // guarantee 5: one direction
							t.Fatalf("obs %d: mixed directions %v", k, ts)
						}
						if tr.Up {
							if tr.To != level+1 || engaged[i] || !(w > steps[i].Trigger) {
								t.Fatalf("obs %d: bad engage %+v", k, tr)
							}
						} else if tr.To != level-1 || !engaged[i] || !(w < steps[i].Recover) {
							t.Fatalf("obs %d: bad release %+v", k, tr)
						}
						if moved[i] && now.Sub(lastAt[i]) < hold { // guarantee 3
							t.Fatalf("obs %d: %s moved %v after its last move (hold %v)", k, tr.Step, now.Sub(lastAt[i]), hold)
						}
						moved[i], lastAt[i], engaged[i] = true, now, tr.Up
						level = tr.To
					}
					if level != l.Level() {
						t.Fatalf("obs %d: transitions end at %d, Level() = %d", k, level, l.Level())
					}
					for i := range n { // guarantee 1
						if engaged[i] != (i < level) {
							t.Fatalf("obs %d: engaged %v at level %d", k, engaged, level)
						}
					}
					// Maximality: Observe did everything the rule allows, so
					// the same observation again changes nothing.
					free := func(i int) bool { return !moved[i] || now.Sub(lastAt[i]) >= hold }
					if level < n && w > steps[level].Trigger && free(level) {
						t.Fatalf("obs %d: step %d could engage but did not", k, level)
					}
					if level > 0 && w < steps[level-1].Recover && free(level-1) {
						t.Fatalf("obs %d: step %d could release but did not", k, level-1)
					}
					if again := l.Observe(now, w); again != nil {
						t.Fatalf("obs %d: repeated observation moved: %v", k, again)
					}
				}
			})
		}
	}
}

// TestBoundedDelay checks guarantee 4: water held above Trigger(K) (below
// Recover(K)) from t0 reaches level >= K (< K) at the first observation at or
// after t0+hold, whatever the history.
func TestBoundedDelay(t *testing.T) {
	const hold = 4 * time.Second
	steps := designSteps()
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := 0; trial < 2000; trial++ {
		l := newDesignLadder(t, hold)
		now := t0
		for k := rng.IntN(30); k > 0; k-- { // random history
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			l.Observe(now, rng.Float64()*1.1)
		}
		K := 1 + rng.IntN(len(steps))
		up := rng.IntN(2) == 0
		start := now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		for now = start; ; {
			var w float64
			if up {
				w = steps[K-1].Trigger + 0.001 + rng.Float64()*(1.2-steps[K-1].Trigger)
			} else {
				w = rng.Float64() * (steps[K-1].Recover - 0.001)
			}
			l.Observe(now, w)
			if now.Sub(start) >= hold {
				if up && l.Level() < K || !up && l.Level() >= K {
					t.Fatalf("trial %d: up=%v K=%d: level %d at %v after start", trial, up, K, l.Level(), now.Sub(start))
				}
			}
			if now.Sub(start) > 2*hold {
				break
			}
			now = now.Add(time.Duration(1+rng.IntN(900)) * time.Millisecond)
		}
	}
}

func TestCarry(t *testing.T) {
	const hold = 5 * time.Second
	named := func(names ...string) []Step {
		var out []Step
		for i, n := range names {
			out = append(out, Step{Name: n, Trigger: 0.5 + 0.1*float64(i), Recover: 0.4 + 0.1*float64(i),
				Action: Action{Kind: ActionPause, Class: "batch"}})
		}
		return out
	}
	tests := []struct {
		name      string
		oldNames  []string
		newNames  []string
		wantLevel int
	}{
		{"same names keep the level", []string{"L1", "L2", "L3"}, []string{"L1", "L2", "L3"}, 3},
		{"appended step keeps the level", []string{"L1", "L2", "L3"}, []string{"L1", "L2", "L3", "L4"}, 3},
		{"removed top step caps the level", []string{"L1", "L2", "L3"}, []string{"L1", "L2"}, 2},
		{"renamed middle step cuts the prefix", []string{"L1", "L2", "L3"}, []string{"L1", "X", "L3"}, 1},
		{"renamed first step resets", []string{"L1", "L2", "L3"}, []string{"A", "L2", "L3"}, 0},
		{"empty new ladder", []string{"L1", "L2", "L3"}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old, err := NewLadder(named(tc.oldNames...), hold, classes)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(old.Observe(t0, 10)); got != 3 {
				t.Fatalf("old ladder engaged %d steps", got)
			}
			nl, err := NewLadder(named(tc.newNames...), hold, classes)
			if err != nil {
				t.Fatal(err)
			}
			if got := nl.Carry(old); got != tc.wantLevel || nl.Level() != tc.wantLevel {
				t.Fatalf("Carry = %d, Level = %d, want %d", got, nl.Level(), tc.wantLevel)
			}
			// Carried steps keep their hold timers: nothing releases
			// before t0+hold, then everything does.
			if tr := nl.Observe(t0.Add(hold-time.Millisecond), 0); tc.wantLevel > 0 && tr != nil {
				t.Fatalf("carried steps released inside their hold: %v", tr)
			}
			if tr := nl.Observe(t0.Add(hold), 0); len(tr) != tc.wantLevel || nl.Level() != 0 {
				t.Fatalf("after hold: %v, level %d", tr, nl.Level())
			}
			if old.Level() != 3 {
				t.Fatal("Carry changed the old ladder")
			}
		})
	}

	t.Run("fresh steps beyond the prefix are not held", func(t *testing.T) {
		old, _ := NewLadder(named("L1", "L2"), hold, classes)
		old.Observe(t0, 10)
		old.Observe(t0.Add(hold), 0) // both released at t0+hold
		nl, _ := NewLadder(named("L1", "L2", "L3"), hold, classes)
		nl.Carry(old)
		// L1 was released at t0+hold: held until t0+2*hold; it blocks all.
		if tr := nl.Observe(t0.Add(hold+time.Second), 10); tr != nil {
			t.Fatalf("moved inside carried hold: %v", tr)
		}
		if got := summary(nl.Observe(t0.Add(2*hold), 10)); got != "L1+ L2+ L3+" {
			t.Fatalf("got %q", got)
		}
	})

	t.Run("changed lines apply at the next observation", func(t *testing.T) {
		old, _ := NewLadder(named("L1"), 0, classes)
		old.Observe(t0, 0.55) // L1 0.50/0.40 engages
		s := named("L1")
		s[0].Trigger, s[0].Recover = 0.9, 0.8
		nl, _ := NewLadder(s, 0, classes)
		nl.Carry(old)
		if got := summary(nl.Observe(t0, 0.55)); got != "L1-" {
			t.Fatalf("got %q, want L1- (0.55 is below the new recover 0.8)", got)
		}
	})

	t.Run("nil old is a no-op", func(t *testing.T) {
		l := newDesignLadder(t, 0)
		l.Observe(t0, 0.8)
		if l.Carry(nil) != 1 {
			t.Fatal("Carry(nil) changed the level")
		}
	})
}

func TestNewLadderErrors(t *testing.T) {
	s := designSteps
	mod := func(f func(st []Step)) []Step { st := s(); f(st); return st }
	tests := []struct {
		name    string
		steps   []Step
		hold    time.Duration
		classes []string
		want    string
	}{
		{"recover above trigger", mod(func(st []Step) { st[1].Recover = 0.90 }), 0, classes,
			"degrade step L2: recover 0.90 must be below trigger 0.85"},
		{"recover equal to trigger", mod(func(st []Step) { st[0].Recover = 0.70 }), 0, classes,
			"degrade step L1: recover 0.70 must be below trigger 0.70"},
		{"trigger zero", mod(func(st []Step) { st[0].Trigger = 0 }), 0, classes,
			"degrade step L1: trigger 0.00 must be a finite number > 0"},
		{"trigger NaN", mod(func(st []Step) { st[2].Trigger = math.NaN() }), 0, classes,
			"degrade step L3: trigger NaN must be a finite number > 0"},
		{"trigger infinite", mod(func(st []Step) { st[2].Trigger = math.Inf(1) }), 0, classes,
			"degrade step L3: trigger +Inf must be a finite number > 0"},
		{"recover zero (could never release)", mod(func(st []Step) { st[0].Recover = 0 }), 0, classes,
			"degrade step L1: recover 0.00 must be a finite number > 0"},
		{"recover negative", mod(func(st []Step) { st[0].Recover = -0.1 }), 0, classes,
			"degrade step L1: recover -0.10 must be a finite number > 0"},
		{"triggers not strictly increasing", mod(func(st []Step) { st[1].Trigger, st[1].Recover = 0.70, 0.65 }), 0, classes,
			"degrade step L2: trigger 0.70 must be above trigger 0.70 of the step before it, L1 (triggers must strictly increase)"},
		{"triggers decreasing", mod(func(st []Step) { st[2].Trigger, st[2].Recover = 0.80, 0.76 }), 0, classes,
			"degrade step L3: trigger 0.80 must be above trigger 0.85 of the step before it, L2 (triggers must strictly increase)"},
		{"recover lines decreasing", mod(func(st []Step) { st[1].Recover = 0.55 }), 0, classes,
			"degrade step L2: recover 0.55 must not be below recover 0.60 of the step before it, L1 (recovery lines must not decrease)"},
		{"unknown class", mod(func(st []Step) { st[0].Action.Class = "bach" }), 0, classes,
			`degrade step L1: pause: unknown class "bach" (known classes: batch, interactive, realtime)`},
		{"no classes declared", s()[:1], 0, nil,
			`degrade step L1: pause: unknown class "batch" (known classes: none declared)`},
		{"missing class", mod(func(st []Step) { st[2].Action.Class = "" }), 0, classes,
			"degrade step L3: throttle: missing class"},
		{"zero action kind", mod(func(st []Step) { st[0].Action.Kind = 0 }), 0, classes,
			"degrade step L1: unknown action kind 0 (want pause, light_mode or throttle)"},
		{"out-of-range action kind", mod(func(st []Step) { st[0].Action.Kind = 9 }), 0, classes,
			"degrade step L1: unknown action kind 9 (want pause, light_mode or throttle)"},
		{"pause with a rate", mod(func(st []Step) { st[0].Action.Rate = Rate{PerSecond: 1} }), 0, classes,
			"degrade step L1: pause batch: takes no max_input_tokens, max_tokens or rate"},
		{"light_mode without limits", mod(func(st []Step) { st[1].Action.MaxInputTokens = 0 }), 0, classes,
			"degrade step L2: light_mode interactive: needs max_input_tokens and/or max_tokens"},
		{"light_mode negative limit", mod(func(st []Step) { st[1].Action.MaxTokens = -5 }), 0, classes,
			"degrade step L2: light_mode interactive: max_tokens -5 must be positive"},
		{"light_mode with a rate", mod(func(st []Step) { st[1].Action.Rate = Rate{PerSecond: 3} }), 0, classes,
			"degrade step L2: light_mode interactive: takes no rate"},
		{"throttle without rate", mod(func(st []Step) { st[2].Action.Rate = Rate{} }), 0, classes,
			"degrade step L3: throttle realtime: rate 0: must be a finite number > 0 per second"},
		{"throttle NaN rate", mod(func(st []Step) { st[2].Action.Rate.PerSecond = math.NaN() }), 0, classes,
			"degrade step L3: throttle realtime: rate NaN: must be a finite number > 0 per second"},
		{"throttle with light limits", mod(func(st []Step) { st[2].Action.MaxTokens = 10 }), 0, classes,
			"degrade step L3: throttle realtime: takes no max_input_tokens or max_tokens"},
		{"duplicate names", mod(func(st []Step) { st[2].Name = "L1" }), 0, classes,
			"degrade step L1: duplicate step name (steps #1 and #3)"},
		{"missing name", mod(func(st []Step) { st[1].Name = "" }), 0, classes,
			"degrade step #2: missing name"},
		{"negative hold", s(), -time.Second, classes,
			"degrade: hold -1s must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewLadder(tc.steps, tc.hold, tc.classes)
			if err == nil {
				t.Fatalf("NewLadder succeeded (%v), want error %q", l.Steps(), tc.want)
			}
			if err.Error() != tc.want {
				t.Fatalf("error\n got %q\nwant %q", err, tc.want)
			}
		})
	}

	// Accepted edge cases.
	ok := []struct {
		name  string
		steps []Step
	}{
		{"equal recover lines", mod(func(st []Step) { st[1].Recover = 0.60 })},
		{"trigger above 1", mod(func(st []Step) { st[2].Trigger, st[2].Recover = 1.5, 1.2 })},
		{"recover below the previous trigger", mod(func(st []Step) { st[1].Recover = 0.65 })},
		{"same class and kind twice (tightening)", append(s(), Step{Name: "L4", Trigger: 0.99, Recover: 0.95,
			Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 5}}})},
	}
	for _, tc := range ok {
		if _, err := NewLadder(tc.steps, DefaultHold, classes); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestObserveNoAllocWhenSteady(t *testing.T) {
	l := newDesignLadder(t, time.Second)
	l.Observe(t0, 0.8) // level 1
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if l.Observe(now, 0.65) != nil {
			t.Fatal("moved")
		}
	})
	if allocs != 0 {
		t.Fatalf("Observe allocated %v times per steady call", allocs)
	}
}

func BenchmarkObserve(b *testing.B) {
	b.Run("steady", func(b *testing.B) {
		l := newDesignLadder(b, DefaultHold)
		l.Observe(t0, 0.86) // level 2, water then stays inside the bands
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Millisecond)
			l.Observe(now, 0.80)
		}
	})
	b.Run("held", func(b *testing.B) {
		// Water wants a move every call but the hold forbids it.
		l := newDesignLadder(b, time.Hour)
		l.Observe(t0, 0.99)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Millisecond)
			l.Observe(now, 0.10)
		}
	})
	b.Run("full-swing", func(b *testing.B) {
		// Worst case: three transitions every call (hold 0).
		l := newDesignLadder(b, 0)
		now := t0
		w := [2]float64{0.99, 0.10}
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Millisecond)
			l.Observe(now, w[i&1])
			i++
		}
	})
}
