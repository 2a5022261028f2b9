package quota

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Config is one tenant's quota as an operator writes it. A zero rate turns
// its meter off; at least one of QPS and TokensPerMin must be set.
type Config struct {
	// QPS is the request rate, requests per second; 0: no request meter.
	QPS float64 `json:"qps,omitempty"`
	// TokensPerMin is the token rate, tokens per minute; 0: no token meter.
	TokensPerMin float64 `json:"tokens_per_min,omitempty"`
	// TokenToQPSWeight converts tokens to request-equivalents for the joint
	// meter (0.0008: 1250 tokens weigh as much as one request).
	TokenToQPSWeight float64 `json:"token_to_qps_weight,omitempty"`
	// JointCap scales QPS into the joint meter's rate, a request costing
	// 1 + tokens x TokenToQPSWeight; 0: no joint meter.
	JointCap float64 `json:"joint_cap,omitempty"`
	// BurstWindow is how long a caller may run BurstAllow above its rate
	// before it is held to the rate (see the package doc).
	BurstWindow time.Duration `json:"burst_window,omitempty"`
	// BurstAllow is the fraction above the rate the window allows (0.2:
	// 1.2x the rate for BurstWindow).
	BurstAllow float64 `json:"burst_allow,omitempty"`
}

// Bounds on rates keep every interval a finite, positive number of
// nanoseconds and every product of a rate and a window far from overflow.
const (
	maxQPS          = 1e9
	maxTokensPerMin = 1e13
	minRate         = 1e-6 // per second
	maxBurstAllow   = 100
	maxBurstWindow  = 24 * time.Hour
	maxWeight       = 1e6
	maxJointCap     = 1e3
)

// Validate reports every problem of c at once, each naming its field and
// the accepted range, so an operator fixes a config in one pass.
func (c Config) Validate() error {
	errs := []error{
		rateProblem("qps", c.QPS, maxQPS, 1, "requests per second"),
		rateProblem("tokens_per_min", c.TokensPerMin, maxTokensPerMin, 60, "tokens per minute"),
		factorProblem("token_to_qps_weight", c.TokenToQPSWeight, maxWeight, "request-equivalents per token"),
		factorProblem("joint_cap", c.JointCap, maxJointCap, "the joint rate is qps x joint_cap; 0 means no joint limit"),
		factorProblem("burst_allow", c.BurstAllow, maxBurstAllow, "the fraction above the rate a burst may run, e.g. 0.2"),
	}
	if c.BurstWindow < 0 || c.BurstWindow > maxBurstWindow {
		errs = append(errs, fmt.Errorf("quota: burst_window is %v; want 0..%v", c.BurstWindow, maxBurstWindow))
	}
	if c.QPS == 0 && c.TokensPerMin == 0 {
		errs = append(errs, errors.New("quota: neither qps nor tokens_per_min is set; set at least one (a quota without a rate limits nothing)"))
	}
	if c.JointCap > 0 && c.QPS == 0 {
		errs = append(errs, fmt.Errorf("quota: joint_cap is %v but qps is 0; the joint rate is qps x joint_cap, so set qps or set joint_cap 0", c.JointCap))
	}
	if c.JointCap > 0 && c.TokenToQPSWeight == 0 {
		errs = append(errs, errors.New("quota: joint_cap is set but token_to_qps_weight is 0; the joint meter would count requests only, set the weight (e.g. 0.0008) or set joint_cap 0"))
	}
	if (c.BurstAllow > 0) != (c.BurstWindow > 0) {
		errs = append(errs, fmt.Errorf("quota: burst_allow %v and burst_window %v must both be set or both be 0 (the burst is burst_allow above the rate for burst_window)", c.BurstAllow, c.BurstWindow))
	}
	return errors.Join(errs...) // leaves out the nil ones
}

// rateProblem checks a rate: 0 (no limit), or finite within [minRate, max];
// seconds is how many seconds the unit per spans.
func rateProblem(name string, v, max, seconds float64, per string) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Errorf("quota: %s is %v; want a finite number of %s, or 0 for no %s limit", name, v, per, name)
	case v < 0:
		return fmt.Errorf("quota: %s is %v; want >= 0 (%s; 0 means no %s limit)", name, v, per, name)
	case v > 0 && v < minRate*seconds:
		return fmt.Errorf("quota: %s is %v; want at least %v %s (or 0 for no %s limit)", name, v, minRate*seconds, per, name)
	case v > max:
		return fmt.Errorf("quota: %s is %v; want at most %v %s", name, v, max, per)
	}
	return nil
}

// factorProblem checks a factor: finite within [0, max].
func factorProblem(name string, v, max float64, why string) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > max {
		return fmt.Errorf("quota: %s is %v; want 0..%v (%s)", name, v, max, why)
	}
	return nil
}

// Limits is a validated Config compiled to nanoseconds per unit and the
// burst tolerance. It is immutable.
type Limits struct {
	cfg       Config
	interval  [numDims]float64 // ns per unit: request, token, request-equivalent; 0 = meter off
	weight    float64
	tolerance int64 // ns: BurstAllow x BurstWindow

	// scaled caches the last Scale result: Local scales on every decision.
	scaled atomic.Pointer[scaledLimits]
}

type scaledLimits struct {
	f float64
	l *Limits
}

// Compile validates c and returns its Limits.
func (c Config) Compile() (*Limits, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.compile(), nil
}

// compile computes the Limits of a valid (or Scale-derived) c.
func (c Config) compile() *Limits {
	l := &Limits{cfg: c, weight: c.TokenToQPSWeight}
	if c.QPS > 0 {
		l.interval[dimQPS] = 1e9 / c.QPS
	}
	if c.TokensPerMin > 0 {
		l.interval[dimTokens] = 60e9 / c.TokensPerMin
	}
	if c.JointCap > 0 {
		l.interval[dimJoint] = 1e9 / (c.QPS * c.JointCap)
	}
	l.tolerance = int64(math.Round(c.BurstAllow * float64(c.BurstWindow)))
	return l
}

// Scale returns Limits whose rates are f times l's with the same tolerance
// tau, so the burst volume scales too: N gateways deciding alone on
// l.Scale(1/N) together admit at most what one store on l would. f outside
// (0, 1) returns l. Scaled rates skip Validate's lower bounds.
func (l *Limits) Scale(f float64) *Limits {
	if !(f > 0 && f < 1) {
		return l
	}
	if c := l.scaled.Load(); c != nil && c.f == f {
		return c.l
	}
	c := l.cfg
	c.QPS *= f
	c.TokensPerMin *= f
	s := c.compile()
	l.scaled.Store(&scaledLimits{f: f, l: s})
	return s
}

// MustCompile is Compile that panics on an invalid config.
func MustCompile(c Config) *Limits {
	l, err := c.Compile()
	if err != nil {
		panic(err)
	}
	return l
}

// Config returns the configuration l was compiled from.
func (l *Limits) Config() Config { return l.cfg }

// Enabled reports whether l meters dimension d.
func (l *Limits) Enabled(d Dimension) bool {
	i, ok := dimIndex(d)
	return ok && l.interval[i] > 0
}

// Tolerance is tau = burst_allow x burst_window: how far a meter's TAT may
// run ahead of now and still admit a request.
func (l *Limits) Tolerance() time.Duration { return time.Duration(l.tolerance) }

// Increment is how far a request with the given tokens advances meter d's
// TAT; 0 when d is off. A Redis store computes it in Go and sends it.
func (l *Limits) Increment(d Dimension, tokens int64) time.Duration {
	return l.NetIncrement(d, 1, max(tokens, 0))
}

// maxInc caps one charge so that adding it to any reachable theoretical
// arrival time cannot overflow int64 (about 36 years of debt).
const maxInc = int64(1) << 60

func (l *Limits) inc(i int, tokens int64) int64 {
	return l.netInc(i, 1, max(tokens, 0))
}

// netInc is how far a batch of requests and tokens moves meter i, summed
// before rounding; either count may be negative (a net refund).
func (l *Limits) netInc(i int, requests, tokens int64) int64 {
	iv := l.interval[i]
	if iv == 0 {
		return 0
	}
	var units float64
	switch i {
	case dimQPS:
		units = float64(requests)
	case dimTokens:
		units = float64(tokens)
	default:
		units = float64(requests) + float64(tokens)*l.weight
	}
	v := math.Round(units * iv)
	return int64(min(max(v, -float64(maxInc)), float64(maxInc)))
}

// NetIncrement is netInc for meter d (a Redis store's Add).
func (l *Limits) NetIncrement(d Dimension, requests, tokens int64) time.Duration {
	i, ok := dimIndex(d)
	if !ok {
		return 0
	}
	return time.Duration(l.netInc(i, requests, tokens))
}
