package degrade

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ActionKind is what a degrade step does. The zero value is invalid, so a
// forgotten Kind is rejected rather than silently meaning "pause".
type ActionKind int

// The actions of DESIGN.md section 5.
const (
	// ActionPause makes a class yield: none of its requests is dispatched
	// while a request of an unpaused class is waiting.
	ActionPause ActionKind = iota + 1
	// ActionLightMode rewrites the class's request bodies: input trimmed to
	// MaxInputTokens, output capped at MaxTokens.
	ActionLightMode
	// ActionThrottle limits the class's admission to Rate (token bucket, see
	// Throttle); beyond it the request is refused with a retry time.
	ActionThrottle
)

// kindNames are the actions' Caddyfile keywords, by kind.
var kindNames = [...]string{ActionPause: "pause", ActionLightMode: "light_mode", ActionThrottle: "throttle"}

// String returns the Caddyfile keyword: "pause", "light_mode", "throttle".
func (k ActionKind) String() string {
	if k >= ActionPause && k <= ActionThrottle {
		return kindNames[k]
	}
	return "ActionKind(" + strconv.Itoa(int(k)) + ")"
}

// MarshalText implements encoding.TextMarshaler with the Caddyfile keyword.
func (k ActionKind) MarshalText() ([]byte, error) {
	if k < ActionPause || k > ActionThrottle {
		return nil, fmt.Errorf("unknown degrade action kind %d", int(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler for the Caddyfile keyword.
func (k *ActionKind) UnmarshalText(b []byte) error {
	v, ok := kindByName(string(b))
	if !ok {
		return fmt.Errorf("unknown degrade action %q (want pause, light_mode or throttle)", b)
	}
	*k = v
	return nil
}

func kindByName(s string) (ActionKind, bool) {
	i := slices.Index(kindNames[:], s)
	return ActionKind(i), i >= int(ActionPause)
}

// Action is what one step does to one class. Which fields apply depends on
// Kind; fields that do not apply must be zero:
//
//   - ActionPause: Class only.
//   - ActionLightMode: Class, and MaxInputTokens and/or MaxTokens (> 0; 0 = unset,
//     at least one set).
//   - ActionThrottle: Class and a valid Rate.
type Action struct {
	Kind           ActionKind `json:"kind"`
	Class          string     `json:"class"`
	MaxInputTokens int        `json:"max_input_tokens,omitempty"`
	MaxTokens      int        `json:"max_tokens,omitempty"`
	Rate           Rate       `json:"rate,omitzero"`
}

// String returns the action in Caddyfile form, e.g. "pause batch",
// "light_mode interactive max_input_tokens 2048 max_tokens 256",
// "throttle realtime 20/s".
func (a Action) String() string {
	s := a.Kind.String() + " " + a.Class
	switch a.Kind {
	case ActionLightMode:
		if a.MaxInputTokens != 0 {
			s += " max_input_tokens " + strconv.Itoa(a.MaxInputTokens)
		}
		if a.MaxTokens != 0 {
			s += " max_tokens " + strconv.Itoa(a.MaxTokens)
		}
	case ActionThrottle:
		s += " " + a.Rate.String()
	}
	return s
}

// validate checks the action on its own (not its class against a config).
func (a Action) validate() error {
	if a.Class == "" {
		return fmt.Errorf("%s: missing class", a.Kind)
	}
	switch a.Kind {
	case ActionPause:
		if a.MaxInputTokens != 0 || a.MaxTokens != 0 || a.Rate != (Rate{}) {
			return fmt.Errorf("pause %s: takes no max_input_tokens, max_tokens or rate", a.Class)
		}
	case ActionLightMode:
		if a.MaxInputTokens < 0 {
			return fmt.Errorf("light_mode %s: max_input_tokens %d must be positive", a.Class, a.MaxInputTokens)
		}
		if a.MaxTokens < 0 {
			return fmt.Errorf("light_mode %s: max_tokens %d must be positive", a.Class, a.MaxTokens)
		}
		if a.MaxInputTokens == 0 && a.MaxTokens == 0 {
			return fmt.Errorf("light_mode %s: needs max_input_tokens and/or max_tokens", a.Class)
		}
		if a.Rate != (Rate{}) {
			return fmt.Errorf("light_mode %s: takes no rate", a.Class)
		}
	case ActionThrottle:
		if a.MaxInputTokens != 0 || a.MaxTokens != 0 {
			return fmt.Errorf("throttle %s: takes no max_input_tokens or max_tokens", a.Class)
		}
		if err := a.Rate.validate(); err != nil {
			return fmt.Errorf("throttle %s: %w", a.Class, err)
		}
	default:
		return fmt.Errorf("unknown action kind %d (want pause, light_mode or throttle)", int(a.Kind))
	}
	return nil
}

// Step is one rung of the ladder: engage Action when the water level rises
// above Trigger, release it when the water level falls below Recover.
type Step struct {
	Name    string  `json:"name"`
	Trigger float64 `json:"trigger"`
	Recover float64 `json:"recover"`
	Action  Action  `json:"action"`
}

// String returns the step as one Caddyfile line, e.g.
// "L1 trigger 0.70 recover 0.60 pause batch". For a valid step,
// ParseStep(strings.Fields(s.String())) returns s.
func (s Step) String() string {
	return s.Name + " trigger " + fmtLine(s.Trigger) + " recover " + fmtLine(s.Recover) + " " + s.Action.String()
}

// fmtLine formats a water line exactly, with at least two decimals:
// 0.7 -> "0.70", 0.333 -> "0.333".
func fmtLine(f float64) string {
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return s
	}
	dot := strings.IndexByte(s, '.')
	switch {
	case dot < 0:
		s += ".00"
	case len(s)-dot == 2:
		s += "0"
	}
	return s
}

// validate checks what a step can check on its own: name, lines, action.
// Errors are prefixed "degrade step <name>: ".
func (s Step) validate() error {
	if s.Name == "" {
		return fmt.Errorf("degrade step: missing name")
	}
	if !finitePositive(s.Trigger) {
		return s.errorf("trigger %s must be a finite number > 0", fmtLine(s.Trigger))
	}
	if !finitePositive(s.Recover) {
		return s.errorf("recover %s must be a finite number > 0", fmtLine(s.Recover))
	}
	if s.Recover >= s.Trigger {
		return s.errorf("recover %s must be below trigger %s", fmtLine(s.Recover), fmtLine(s.Trigger))
	}
	if err := s.Action.validate(); err != nil {
		return s.errorf("%w", err)
	}
	return nil
}

func (s Step) errorf(format string, args ...any) error {
	return fmt.Errorf("degrade step %s: %w", s.Name, fmt.Errorf(format, args...))
}

func finitePositive(f float64) bool {
	return f > 0 && !math.IsInf(f, 0) // NaN > 0 is false
}

// ParseStep parses the tokens of one Caddyfile line of a degrade block:
//
//	<name> trigger <x> recover <y> pause <class>
//	<name> trigger <x> recover <y> light_mode <class> [max_input_tokens <n>] [max_tokens <n>]
//	<name> trigger <x> recover <y> throttle <class> <rate>
//
// and runs every check a step can make on its own; NewLadder adds the
// checks across steps. Errors quote the offending token.
func ParseStep(args []string) (Step, error) {
	if len(args) == 0 || args[0] == "" {
		return Step{}, fmt.Errorf("degrade step: missing step name")
	}
	s := Step{Name: args[0]}
	p := stepParser{step: &s, args: args, i: 1}

	var err error
	if s.Trigger, err = p.line("trigger"); err != nil {
		return Step{}, err
	}
	if s.Recover, err = p.line("recover"); err != nil {
		return Step{}, err
	}

	if s.Action, err = p.action(); err != nil {
		return Step{}, err
	}
	if extra, ok := p.next(); ok {
		return Step{}, s.errorf("unexpected token %q after %q", extra, strings.Join(args[1:p.i-1], " "))
	}
	if err := s.validate(); err != nil {
		return Step{}, err
	}
	return s, nil
}

type stepParser struct {
	step *Step
	args []string
	i    int
}

func (p *stepParser) next() (string, bool) {
	if p.i >= len(p.args) {
		return "", false
	}
	p.i++
	return p.args[p.i-1], true
}

// action parses "<kind> <class>" and the kind's options.
func (p *stepParser) action() (Action, error) {
	kw, ok := p.next()
	if !ok {
		return Action{}, p.step.errorf("missing action after recover %s (want pause, light_mode or throttle)", p.args[p.i-1])
	}
	kind, ok := kindByName(kw)
	if !ok {
		return Action{}, p.step.errorf("unknown action %q (want pause, light_mode or throttle)", kw)
	}
	class, ok := p.next()
	if !ok {
		return Action{}, p.step.errorf("%s: missing class", kw)
	}
	a := Action{Kind: kind, Class: class}
	var err error
	switch kind {
	case ActionLightMode:
		err = p.lightMode(&a)
	case ActionThrottle:
		v, ok := p.next()
		if !ok {
			return Action{}, p.step.errorf("throttle %s: missing rate (e.g. 20/s, 1200/m, 5000tok/s, 100tok/m)", class)
		}
		if a.Rate, err = ParseRate(v); err != nil {
			err = p.step.errorf("throttle %s: %w", class, err)
		}
	}
	return a, err
}

// lightMode parses light_mode's options, each at most once, in any order,
// up to the end of the line.
func (p *stepParser) lightMode(a *Action) error {
	for {
		opt, ok := p.next()
		if !ok {
			return nil
		}
		var dst *int
		switch opt {
		case "max_input_tokens":
			dst = &a.MaxInputTokens
		case "max_tokens":
			dst = &a.MaxTokens
		default:
			return p.step.errorf("light_mode %s: unknown option %q (want max_input_tokens or max_tokens)", a.Class, opt)
		}
		if *dst != 0 {
			return p.step.errorf("light_mode %s: %s given twice", a.Class, opt)
		}
		v, ok := p.next()
		if !ok {
			return p.step.errorf("light_mode %s: missing value after %s", a.Class, opt)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return p.step.errorf("light_mode %s: %s %q must be a positive integer", a.Class, opt, v)
		}
		*dst = n
	}
}

// line parses "<keyword> <number>".
func (p *stepParser) line(keyword string) (float64, error) {
	kw, ok := p.next()
	if !ok {
		return 0, p.step.errorf("missing %q", keyword)
	}
	if kw != keyword {
		return 0, p.step.errorf("expected %q, got %q", keyword, kw)
	}
	v, ok := p.next()
	if !ok {
		return 0, p.step.errorf("missing value after %q", keyword)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !finitePositive(f) {
		return 0, p.step.errorf("%s %q must be a finite number > 0", keyword, v)
	}
	return f, nil
}
