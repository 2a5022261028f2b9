package degrade

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// DefaultHold is a suggested minimum hold time for callers whose
// configuration does not set one.
const DefaultHold = 5 * time.Second

// Ladder is the degrade state machine of the package doc: build it with
// NewLadder and feed it water levels with Observe. Not safe for concurrent
// use.
type Ladder struct {
	steps []Step
	hold  time.Duration
	level int

	moved  []bool      // moved[i]: step i has made at least one transition
	lastAt []time.Time // lastAt[i]: time of step i's last transition, if moved[i]
}

// Transition is one step engaging (Up, From+1 == To) or releasing (!Up,
// From-1 == To), as reported by Observe.
type Transition struct {
	Step     string    // name of the step that moved
	From, To int       // level before and after
	Up       bool      // engaged (true) or released (false)
	Water    float64   // the water level that caused it
	At       time.Time // the now passed to Observe
}

// String renders t for logs, e.g. "degrade L2 engaged (level 1 -> 2, water 0.86)".
func (t Transition) String() string {
	verb := "released"
	if t.Up {
		verb = "engaged"
	}
	return fmt.Sprintf("degrade %s %s (level %d -> %d, water %.3f)", t.Step, verb, t.From, t.To, t.Water)
}

// NewLadder validates steps and returns a ladder at level 0. hold is the
// minimum time between two transitions of one step (0: none). An action
// naming a class not in knownClasses is an error. Beyond each step's own
// checks, names must be unique, triggers increase and recovery lines never
// decrease; every error names the offending step.
func NewLadder(steps []Step, hold time.Duration, knownClasses []string) (*Ladder, error) {
	if hold < 0 {
		return nil, fmt.Errorf("degrade: hold %s must not be negative", hold)
	}
	for i, s := range steps {
		if err := s.validate(); err != nil {
			if s.Name == "" {
				return nil, fmt.Errorf("degrade step #%d: missing name", i+1)
			}
			return nil, err
		}
		if !slices.Contains(knownClasses, s.Action.Class) {
			known := slices.Clone(knownClasses)
			slices.Sort(known)
			list := strings.Join(known, ", ")
			if list == "" {
				list = "none declared"
			}
			return nil, s.errorf("%s: unknown class %q (known classes: %s)", s.Action.Kind, s.Action.Class, list)
		}
		if j := slices.IndexFunc(steps[:i], func(p Step) bool { return p.Name == s.Name }); j >= 0 {
			return nil, s.errorf("duplicate step name (steps #%d and #%d)", j+1, i+1)
		}
		if i == 0 {
			continue
		}
		prev := steps[i-1]
		if s.Trigger <= prev.Trigger {
			return nil, s.errorf("trigger %s must be above trigger %s of the step before it, %s (triggers must strictly increase)",
				fmtLine(s.Trigger), fmtLine(prev.Trigger), prev.Name)
		}
		if s.Recover < prev.Recover {
			return nil, s.errorf("recover %s must not be below recover %s of the step before it, %s (recovery lines must not decrease)",
				fmtLine(s.Recover), fmtLine(prev.Recover), prev.Name)
		}
	}
	return newLadder(steps, hold), nil
}

// newLadder is NewLadder without the checks, for the circuit breaker,
// whose steps share one pair of lines and carry no action.
func newLadder(steps []Step, hold time.Duration) *Ladder {
	return &Ladder{
		steps:  slices.Clone(steps),
		hold:   hold,
		moved:  make([]bool, len(steps)),
		lastAt: make([]time.Time, len(steps)),
	}
}

// Observe records the water level seen at now, applies the lines and the
// hold rule, and returns the transitions made in order (nil when none).
func (l *Ladder) Observe(now time.Time, water float64) []Transition {
	return l.observe(now, water, nil)
}

// observe is Observe with, when waters is not nil, step i compared with
// waters[i] instead of water: the circuit breaker's signals, which never
// increase from one step to the next.
func (l *Ladder) observe(now time.Time, water float64, waters []float64) []Transition {
	signal := func(i int) float64 {
		if waters != nil {
			return waters[i]
		}
		return water
	}
	var out []Transition
	for l.level < len(l.steps) {
		i := l.level
		w := signal(i)
		if !(w > l.steps[i].Trigger) || !l.mayMove(i, now) {
			break
		}
		l.moved[i], l.lastAt[i] = true, now
		l.level++
		if out == nil {
			out = make([]Transition, 0, len(l.steps)-i) // one allocation per moving call
		}
		out = append(out, Transition{Step: l.steps[i].Name, From: i, To: i + 1, Up: true, Water: w, At: now})
	}
	if out != nil {
		return out
	}
	for l.level > 0 {
		i := l.level - 1
		w := signal(i)
		if !(w < l.steps[i].Recover) || !l.mayMove(i, now) {
			break
		}
		l.moved[i], l.lastAt[i] = true, now
		l.level--
		if out == nil {
			out = make([]Transition, 0, i+1)
		}
		out = append(out, Transition{Step: l.steps[i].Name, From: i + 1, To: i, Up: false, Water: w, At: now})
	}
	return out
}

// mayMove is the hold rule: step i has never moved, or its last transition
// is at least hold before now.
func (l *Ladder) mayMove(i int, now time.Time) bool {
	return !l.moved[i] || now.Sub(l.lastAt[i]) >= l.hold
}

// Level returns the current level: steps 1..Level() are engaged.
func (l *Ladder) Level() int { return l.level }

// Active returns the actions of the engaged steps, in step order (step 1
// first). It returns nil at level 0 and a fresh slice otherwise.
func (l *Ladder) Active() []Action {
	if l.level == 0 {
		return nil
	}
	out := make([]Action, l.level)
	for i := range out {
		out[i] = l.steps[i].Action
	}
	return out
}

// Steps returns a copy of the ladder's steps, in order.
func (l *Ladder) Steps() []Step { return slices.Clone(l.steps) }

// Carry makes l, a ladder just built from a reloaded configuration, adopt
// the state of old, and returns l's level. The longest common prefix of
// step names keeps old's state and hold timers; l's level becomes
// min(old.Level(), prefix), with no Transition reported. Changed lines or
// actions apply from the next Observe. Call it before l's first Observe.
func (l *Ladder) Carry(old *Ladder) int {
	if old == nil {
		return l.level
	}
	p := 0
	for p < len(l.steps) && p < len(old.steps) && l.steps[p].Name == old.steps[p].Name {
		p++
	}
	clear(l.moved)
	clear(l.lastAt)
	copy(l.moved, old.moved[:p])
	copy(l.lastAt, old.lastAt[:p])
	l.level = min(old.level, p)
	return l.level
}
