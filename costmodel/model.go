package costmodel

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Defaults of Config's zero fields.
const (
	// DefaultMemory: an observation's weight falls to 1/e after 500 more.
	DefaultMemory = 500
	// DefaultMinSamples observations before a fit may be Ready.
	DefaultMinSamples = 100
	// DefaultMinSpread is the smallest coefficient of variation of prompt
	// (and completion) sizes that can separate per-token time from the
	// per-request overhead.
	DefaultMinSpread = 0.01
	// DefaultMaxCondition bounds the condition number of the scaled 2x2
	// slope system: |corr(prompt, completion)| < 0.998.
	DefaultMaxCondition = 1000
	// DefaultMaxTokens bounds an observation's prompt and completion
	// sizes, beyond any context window.
	DefaultMaxTokens = 1 << 24
	// DefaultMaxBusy bounds an observation's busy time.
	DefaultMaxBusy = time.Hour
)

// Config tunes a Model. Zero fields take the defaults above.
type Config struct {
	// Memory is the forgetting horizon in requests: every observation
	// multiplies the weight of all earlier ones by 1 - 1/Memory. It
	// counts requests, not seconds, so an idle gateway keeps its fit.
	Memory int `json:"memory,omitempty"`
	// MinSamples is the number of observations before a fit may be Ready.
	MinSamples int `json:"min_samples,omitempty"`
	// MinSpread is the smallest weighted standard deviation of prompt (and
	// completion) sizes, relative to their mean (at least 1 token), for
	// their coefficient to be told apart from the overhead.
	MinSpread float64 `json:"min_spread,omitempty"`
	// MaxCondition is the largest condition number, (1+|r|)/(1-|r|) for
	// the correlation r of prompt and completion sizes, at which the two
	// per-token times are still fitted.
	MaxCondition float64 `json:"max_condition,omitempty"`
	// MaxTokens and MaxBusy bound accepted observations; observations
	// outside [0, MaxTokens] tokens or [0, MaxBusy] are counted in
	// Fit.Rejected and otherwise ignored.
	MaxTokens int64         `json:"max_tokens,omitempty"`
	MaxBusy   time.Duration `json:"max_busy,omitempty"`
}

// Validate reports every invalid field; zero fields are valid (defaults).
func (c Config) Validate() error {
	var errs []error
	if c.Memory < 0 || c.Memory == 1 {
		errs = append(errs, fmt.Errorf("costmodel: memory %d must be 0 (default %d) or at least 2 requests", c.Memory, DefaultMemory))
	}
	if c.MinSamples < 0 {
		errs = append(errs, fmt.Errorf("costmodel: min_samples %d is negative", c.MinSamples))
	}
	if !(c.MinSpread >= 0) || math.IsInf(c.MinSpread, 0) {
		errs = append(errs, fmt.Errorf("costmodel: min_spread %v must be a finite number >= 0", c.MinSpread))
	}
	if c.MaxCondition != 0 && !(c.MaxCondition >= 1) || math.IsInf(c.MaxCondition, 0) {
		errs = append(errs, fmt.Errorf("costmodel: max_condition %v must be 0 (default %d) or a finite number >= 1", c.MaxCondition, DefaultMaxCondition))
	}
	if c.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("costmodel: max_tokens %d is negative", c.MaxTokens))
	}
	if c.MaxBusy < 0 {
		errs = append(errs, fmt.Errorf("costmodel: max_busy %v is negative", c.MaxBusy))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	c.Memory = cmp.Or(c.Memory, DefaultMemory)
	c.MinSamples = cmp.Or(c.MinSamples, DefaultMinSamples)
	c.MinSpread = cmp.Or(c.MinSpread, DefaultMinSpread)
	c.MaxCondition = cmp.Or(c.MaxCondition, DefaultMaxCondition)
	c.MaxTokens = cmp.Or(c.MaxTokens, DefaultMaxTokens)
	c.MaxBusy = cmp.Or(c.MaxBusy, DefaultMaxBusy)
	return c
}

// Model is an online fit of busy = a + b·prompt + c·completion over
// exponentially weighted observations. It is safe for concurrent use.
type Model struct {
	cfg    Config
	lambda float64

	mu sync.Mutex
	st stats // guarded by mu
}

// stats are the exponentially weighted sufficient statistics: total
// weight, means, and centered co-moments of (prompt, completion, busy
// seconds).
type stats struct {
	n, rejected int
	w, w2       float64 // Σw, Σw²
	mp, mq, my  float64
	cpp, cpq    float64
	cqq         float64
	cpy, cqy    float64
	cyy         float64
}

// New returns an empty model. It panics if cfg does not Validate: the
// caller validates configuration where it is parsed.
func New(cfg Config) *Model {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	return &Model{cfg: cfg, lambda: 1 - 1/float64(cfg.Memory)}
}

// Observe records one served request: its prompt and completion tokens and
// the time it kept its upstream busy. Out-of-range observations are only
// counted as rejected.
func (m *Model) Observe(prompt, completion int64, busy time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st
	if prompt < 0 || completion < 0 || busy < 0 ||
		prompt > m.cfg.MaxTokens || completion > m.cfg.MaxTokens || busy > m.cfg.MaxBusy {
		s.rejected++
		return
	}
	p, q, y := float64(prompt), float64(completion), busy.Seconds()
	l := m.lambda
	s.n++
	s.w = l*s.w + 1
	s.w2 = l*l*s.w2 + 1
	// Weighted Welford (West 1979) with forgetting: decaying every old
	// weight by l leaves the means alone and scales the co-moments by l;
	// the new point then moves each mean by d/W and adds d·(x - mean')
	// = d·d'·(1 - 1/W) to each co-moment, symmetric by construction.
	f := 1 / s.w
	g := 1 - f
	dp, dq, dy := p-s.mp, q-s.mq, y-s.my
	s.mp += dp * f
	s.mq += dq * f
	s.my += dy * f
	s.cpp = l*s.cpp + g*dp*dp
	s.cpq = l*s.cpq + g*dp*dq
	s.cqq = l*s.cqq + g*dq*dq
	s.cpy = l*s.cpy + g*dp*dy
	s.cqy = l*s.cqy + g*dq*dy
	s.cyy = l*s.cyy + g*dy*dy
}

// Status says whether a Fit is usable, and if not, why.
type Status uint8

// Fit statuses. Only StatusReady comes with coefficients.
const (
	// StatusReady: the coefficients are fitted and usable.
	StatusReady Status = iota
	// StatusWarmingUp: fewer than MinSamples observations so far.
	StatusWarmingUp
	// StatusFlatPrompt: prompt sizes barely vary (spread below
	// MinSpread), so per-prompt-token time is indistinguishable from the
	// per-request overhead.
	StatusFlatPrompt
	// StatusFlatCompletion: the same for completion sizes.
	StatusFlatCompletion
	// StatusCollinear: prompt and completion sizes move together
	// (condition number above MaxCondition), so only a mix of their
	// per-token times is known.
	StatusCollinear
	// StatusNoCompletionTime: the best non-negative fit gives completion
	// tokens no time, so costs in output-token units are undefined.
	StatusNoCompletionTime
)

var statusNames = [...]string{
	StatusReady:            "ready",
	StatusWarmingUp:        "warming_up",
	StatusFlatPrompt:       "flat_prompt",
	StatusFlatCompletion:   "flat_completion",
	StatusCollinear:        "collinear",
	StatusNoCompletionTime: "no_completion_time",
}

// String returns the status's snake_case name.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", int(s))
}

// MarshalText makes the status a string in JSON (admin API, dashboard).
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Coefs is a set of the model's coefficients.
type Coefs uint8

// The coefficients, as members of a Coefs set.
const (
	CoefOverhead Coefs = 1 << iota
	CoefPrompt
	CoefCompletion
)

// String lists the set's members, comma-separated ("" when empty).
func (c Coefs) String() string {
	var parts []string
	for _, x := range []struct {
		bit  Coefs
		name string
	}{{CoefOverhead, "overhead"}, {CoefPrompt, "prompt_token"}, {CoefCompletion, "completion_token"}} {
		if c&x.bit != 0 {
			parts = append(parts, x.name)
		}
	}
	return strings.Join(parts, ",")
}

// MarshalText makes the set a string in JSON.
func (c Coefs) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Fit is the model's current estimate. All times are in seconds. Unless
// Ready, the three coefficients and R2 are zero and Status says why.
type Fit struct {
	// Overhead (a) is the busy time of a request with no tokens.
	Overhead float64 `json:"overhead_seconds"`
	// PerPromptToken (b) and PerCompletionToken (c) are the busy time each
	// prompt token and each completion token adds.
	PerPromptToken     float64 `json:"prompt_token_seconds"`
	PerCompletionToken float64 `json:"completion_token_seconds"`
	// R2 is the weighted coefficient of determination, 1 - RSS/TSS: the
	// share of the variance of busy times the fit explains. It can be
	// negative when a coefficient is Clamped without an intercept.
	R2 float64 `json:"r2"`
	// Clamped lists the coefficients the least-squares solution would
	// have made negative and the fit holds at zero instead (non-negative
	// least squares); a Ready fit may have clamped a or b, never c.
	Clamped Coefs `json:"clamped"`
	// MeanPrompt and MeanCompletion are the weighted mean sizes of the
	// observations the fit rests on: TokenToQPSWeight's token mix.
	MeanPrompt     float64 `json:"mean_prompt_tokens"`
	MeanCompletion float64 `json:"mean_completion_tokens"`
	// Samples is the number of accepted observations ever, Effective the
	// number the forgetting leaves: (Σw)²/Σw², about 2·Memory once warm.
	Samples   int     `json:"samples"`
	Effective float64 `json:"effective_samples"`
	// Rejected counts observations out of range (see Config).
	Rejected int    `json:"rejected"`
	Status   Status `json:"status"`
	Ready    bool   `json:"ready"`
}

// Fit solves for the coefficients from the current statistics: O(1), no
// allocation.
func (m *Model) Fit() Fit {
	m.mu.Lock()
	s := m.st
	m.mu.Unlock()
	return s.fit(m.cfg)
}

func (s *stats) fit(cfg Config) Fit {
	f := Fit{Samples: s.n, Rejected: s.rejected, MeanPrompt: s.mp, MeanCompletion: s.mq}
	if s.w2 > 0 {
		f.Effective = s.w * s.w / s.w2
	}
	if s.n < cfg.MinSamples {
		f.Status = StatusWarmingUp
		return f
	}
	// Spreads are checked on the same scale as the sizes, so the test
	// means the same for 100-token and 100k-token prompts.
	if !(math.Sqrt(s.cpp/s.w) >= cfg.MinSpread*math.Max(s.mp, 1)) {
		f.Status = StatusFlatPrompt
		return f
	}
	if !(math.Sqrt(s.cqq/s.w) >= cfg.MinSpread*math.Max(s.mq, 1)) {
		f.Status = StatusFlatCompletion
		return f
	}
	r := math.Abs(s.cpq) / math.Sqrt(s.cpp*s.cqq)
	if !((1 + r) <= cfg.MaxCondition*(1-r)) {
		f.Status = StatusCollinear
		return f
	}
	beta, clamped := s.nnls()
	// c divides every cost in output-token units: it must be positive, and
	// large enough that a/c and b/c stay finite.
	if !(beta[2] > 0) || math.IsInf(beta[0]/beta[2], 0) || math.IsInf(beta[1]/beta[2], 0) {
		f.Status = StatusNoCompletionTime
		return f
	}
	f.Overhead, f.PerPromptToken, f.PerCompletionToken = beta[0], beta[1], beta[2]
	f.Clamped = clamped
	f.R2 = 1
	if s.cyy > 0 {
		f.R2 = 1 - s.rss(beta)/s.cyy
	}
	f.Ready = true
	return f
}

// nnls is exact non-negative least squares for three unknowns: the
// optimum is the least-squares solution on some subset of the
// coefficients (the others at zero) that is non-negative, and among those
// candidates it has the smallest residual, so trying all eight subsets,
// the full one first, finds it.
func (s *stats) nnls() (beta [3]float64, clamped Coefs) {
	const all = CoefOverhead | CoefPrompt | CoefCompletion
	if b, ok := s.solve(all); ok && b[0] >= 0 && b[1] >= 0 && b[2] >= 0 {
		return b, 0
	}
	best := math.Inf(1)
	var bestSet Coefs
	for set := all - 1; ; set-- {
		if b, ok := s.solve(set); ok && b[0] >= 0 && b[1] >= 0 && b[2] >= 0 {
			if r := s.rss(b); r < best {
				best, beta, bestSet = r, b, set
			}
		}
		if set == 0 {
			break
		}
	}
	return beta, all &^ bestSet
}

// solve is the least-squares solution with the coefficients outside free
// held at zero. With the intercept free it is the centered system (the
// intercept then follows from the means); without it, the raw second
// moments C + W·m·m'. ok is false when the system is singular.
func (s *stats) solve(free Coefs) (beta [3]float64, ok bool) {
	withA := free&CoefOverhead != 0
	app, apq, aqq, apy, aqy := s.cpp, s.cpq, s.cqq, s.cpy, s.cqy
	if !withA {
		app += s.w * s.mp * s.mp
		apq += s.w * s.mp * s.mq
		aqq += s.w * s.mq * s.mq
		apy += s.w * s.mp * s.my
		aqy += s.w * s.mq * s.my
	}
	var b, c float64
	switch free &^ CoefOverhead {
	case CoefPrompt | CoefCompletion:
		b, c, ok = solve2(app, apq, aqq, apy, aqy)
	case CoefPrompt:
		b, ok = solve1(app, apy)
	case CoefCompletion:
		c, ok = solve1(aqq, aqy)
	default:
		ok = true
	}
	if !ok {
		return beta, false
	}
	if withA {
		beta[0] = s.my - b*s.mp - c*s.mq
	}
	beta[1], beta[2] = b, c
	return beta, true
}

// solve1 solves m·x = r.
func solve1(m, r float64) (float64, bool) {
	if !(m > 0) {
		return 0, false
	}
	return r / m, true
}

// solve2 solves the symmetric system [m11 m12; m12 m22]·x = r after
// scaling it to unit diagonal, where its determinant 1 - ρ² measures the
// conditioning whatever the units.
func solve2(m11, m12, m22, r1, r2 float64) (x1, x2 float64, ok bool) {
	if !(m11 > 0 && m22 > 0) {
		return 0, 0, false
	}
	d1, d2 := math.Sqrt(m11), math.Sqrt(m22)
	rho := m12 / (d1 * d2)
	det := 1 - rho*rho
	if !(det > 1e-12) {
		return 0, 0, false
	}
	u1, u2 := r1/d1, r2/d2
	return (u1 - rho*u2) / det / d1, (u2 - rho*u1) / det / d2, true
}

// rss is the weighted residual sum of squares of beta, from the centered
// moments: W·(ȳ - a - b·p̄ - c·q̄)² + Σw·(ỹ - b·p̃ - c·q̃)².
func (s *stats) rss(beta [3]float64) float64 {
	a, b, c := beta[0], beta[1], beta[2]
	e := s.my - a - b*s.mp - c*s.mq
	r := s.w*e*e + s.cyy - 2*(b*s.cpy+c*s.cqy) + b*b*s.cpp + 2*b*c*s.cpq + c*c*s.cqq
	return math.Max(r, 0)
}

// PromptCostRatio is b/c: what one prompt token costs in completion
// tokens. It is 1 unless Ready (tokens of both kinds count the same).
func (f Fit) PromptCostRatio() float64 {
	if !f.Ready {
		return 1
	}
	return f.PerPromptToken / f.PerCompletionToken
}

// Cost is a request's cost in output-token units, prompt·b/c + completion
// (see the package doc). Unless Ready it is prompt + completion, the
// `tokens` cost, so a caller may use it unconditionally.
func (f Fit) Cost(prompt, completion int64) float64 {
	return float64(prompt)*f.PromptCostRatio() + float64(completion)
}

// TokenToQPSWeight is the weight of one token in request-equivalents for
// the quota's joint meter, (b·p̄ + c·q̄) / (a·(p̄ + q̄)) (see the package
// doc); 0 (keep the configured one) unless Ready with a positive overhead.
func (f Fit) TokenToQPSWeight() float64 {
	tokens := f.MeanPrompt + f.MeanCompletion
	if !f.Ready || !(f.Overhead > 0) || !(tokens > 0) {
		return 0
	}
	w := (f.PerPromptToken*f.MeanPrompt + f.PerCompletionToken*f.MeanCompletion) / (f.Overhead * tokens)
	if math.IsInf(w, 0) || math.IsNaN(w) {
		return 0
	}
	return w
}
