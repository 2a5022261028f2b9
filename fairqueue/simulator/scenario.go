package simulator

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Scenario is a workload and an upstream pool, described as data so that
// every policy replays the same requests.
type Scenario struct {
	Name        string
	Description string
	// Upstreams x Slots is the capacity (MaxInflight = Slots).
	Upstreams int
	Slots     int
	// Health changes the number of healthy upstreams at the given times;
	// before the first entry all are healthy.
	Health []HealthChange
	// Classes in priority order, highest first. Budgets are enforced as
	// deadlines only with EnforceBudgets or a budget policy.
	Classes []Class
	Tenants []TenantSpec
	// Duration ends closed-loop (ArrivalBacklogged) arrivals.
	Duration time.Duration
	// EnforceBudgets gives every request a deadline of arrival + budget.
	// Off by default: the seeds compare schedulers on waits, not rejections.
	EnforceBudgets bool
	// GroupRows reports one row per TenantSpec.Group instead of per tenant.
	GroupRows bool
	// Window is the length of Jain's index windows (0: 10 s).
	Window time.Duration
	// TickPeriod is how often Queue.Tick runs while there is work (0: 50 ms).
	TickPeriod time.Duration

	// Admission is the budget policies' configuration (nil: the default).
	Admission *fairqueue.BudgetConfig
	// MaxQueue caps queued requests (0: no cap); queued/MaxQueue is the
	// water level that drives Degrade.
	MaxQueue int
	// The engine's Config.Degrade, DegradeHold, Circuit and Fallback;
	// fifo applies none of them.
	Degrade     []degrade.Step
	DegradeHold time.Duration
	Circuit     *degrade.CircuitConfig
	Fallback    *FallbackSpec
	// UpstreamQuota is the provider account every engine policy is gated
	// by; all but fifo also apply TenantSpec.Reserve.
	UpstreamQuota *fairqueue.UpstreamQuota
	// Exhausted lists when the primary provider declares its account
	// exhausted (as on a 429).
	Exhausted []Exhaustion
	// Policies names the policies fqsim runs by default (nil: Policies()).
	Policies []string
}

// FallbackSpec is a fallback channel of Slots for the listed tenants.
type FallbackSpec struct {
	Slots   int
	Tenants []string
}

// Exhaustion: at At, the primary account is out of quota for For.
type Exhaustion struct {
	At, For time.Duration
}

// HealthChange sets the number of healthy upstreams from At on.
type HealthChange struct {
	At      time.Duration
	Healthy int
}

// Class is a class of service.
type Class struct {
	Name   string
	Budget time.Duration
}

// TenantSpec describes one tenant and the requests it sends.
type TenantSpec struct {
	Name      string
	Weight    float64
	Class     string
	Group     string  // row label with Scenario.GroupRows
	Tier      string  // tier for Scenario.Circuit
	Reserve   float64 // share of Scenario.UpstreamQuota
	Arrivals  Arrivals
	Prompt    Dist
	MaxTokens Dist
}

// ArrivalKind selects how a tenant's requests arrive.
type ArrivalKind int

// The arrival processes.
const (
	// ArrivalBurst: N requests at uniform times in [Start, End].
	ArrivalBurst ArrivalKind = iota + 1
	// ArrivalPoisson: Rate requests/s from Start until End (or Alongside).
	ArrivalPoisson
	// ArrivalPeriodic: one every Interval from Start until End (or Alongside).
	ArrivalPeriodic
	// ArrivalPhases: the non-overlapping Phases in turn.
	ArrivalPhases
	// ArrivalBacklogged: a closed loop that keeps Queue requests waiting
	// from Start until Scenario.Duration.
	ArrivalBacklogged
)

// Arrivals parameterises an ArrivalKind.
type Arrivals struct {
	Kind       ArrivalKind
	N          int
	Rate       float64
	Interval   time.Duration
	Start, End time.Duration
	Queue      int
	// Alongside names an open-loop tenant this one keeps arriving beside
	// while it is backlogged (see the package doc).
	Alongside string
	Phases    []Phase
}

// Phase is one constant-rate stretch of an ArrivalPhases tenant: Poisson
// arrivals at Rate per second, or, with Even, one every 1/Rate seconds.
// Prompt and MaxTokens, when set, replace the tenant's sizes.
type Phase struct {
	Start, End        time.Duration
	Rate              float64
	Even              bool
	Prompt, MaxTokens Dist
}

// DistKind selects a token-count distribution.
type DistKind int

// The distributions.
const (
	// DistConst is always A.
	DistConst DistKind = iota + 1
	// DistUniform is uniform over the integers [A, B].
	DistUniform
	// DistChoice picks one of Values uniformly.
	DistChoice
	// DistPareto is Pareto with scale A and shape Alpha, capped at B.
	DistPareto
)

// Dist is a distribution of token counts.
type Dist struct {
	Kind   DistKind
	A, B   int64
	Alpha  float64
	Values []int64
}

func (d Dist) sample(r *rand.Rand) int64 {
	switch d.Kind {
	case DistConst:
		return d.A
	case DistUniform:
		return d.A + r.Int64N(d.B-d.A+1)
	case DistChoice:
		return d.Values[r.IntN(len(d.Values))]
	case DistPareto:
		u := 1 - r.Float64() // (0, 1]
		x := int64(math.Round(float64(d.A) / math.Pow(u, 1/d.Alpha)))
		if d.B > 0 && x > d.B {
			x = d.B
		}
		return x
	}
	panic("simulator: unknown distribution")
}

func (d Dist) validate() error {
	switch d.Kind {
	case DistConst:
		if d.A < 0 {
			return fmt.Errorf("negative constant %d", d.A)
		}
	case DistUniform:
		if d.A < 0 || d.B < d.A {
			return fmt.Errorf("bad uniform range [%d, %d]", d.A, d.B)
		}
	case DistChoice:
		if len(d.Values) == 0 {
			return fmt.Errorf("empty choice")
		}
	case DistPareto:
		if d.A <= 0 || !(d.Alpha > 0) {
			return fmt.Errorf("bad pareto scale %d shape %v", d.A, d.Alpha)
		}
	default:
		return fmt.Errorf("unknown distribution kind %d", d.Kind)
	}
	return nil
}

// Request is one generated request, its output included.
type Request struct {
	ID        int
	Tenant    int // index into Scenario.Tenants
	Arrival   time.Duration
	Prompt    int64
	MaxTokens int64
	Output    int64
}

// Estimate is the cost the gateway knows at admission: prompt + max_tokens.
func (r *Request) Estimate() int64 { return r.Prompt + r.MaxTokens }

// Actual is the cost known at completion: prompt + output tokens.
func (r *Request) Actual() int64 { return r.Prompt + r.Output }

// Service is how long the request holds an upstream slot.
func (r *Request) Service() time.Duration {
	return 30*time.Millisecond + time.Duration(r.Prompt)*50*time.Microsecond +
		time.Duration(r.Output)*15*time.Millisecond
}

// Workload is a scenario's requests for one seed.
type Workload struct {
	Scenario *Scenario
	Seed     uint64
	// Requests are the open-loop requests by (Arrival, tenant, the
	// tenant's own order); a request's ID is its index.
	Requests []Request
}

// Capacity is the number of slots with every upstream healthy.
func (sc *Scenario) Capacity() int { return sc.Upstreams * sc.Slots }

// ClassRank returns the position of class name in sc.Classes, or
// len(sc.Classes) for an unknown class.
func (sc *Scenario) ClassRank(name string) int {
	for i, c := range sc.Classes {
		if c.Name == name {
			return i
		}
	}
	return len(sc.Classes)
}

// Budget returns the wait budget of tenant i's class (0 = none).
func (sc *Scenario) Budget(i int) time.Duration {
	if r := sc.ClassRank(sc.Tenants[i].Class); r < len(sc.Classes) {
		return sc.Classes[r].Budget
	}
	return 0
}

func (sc *Scenario) window() time.Duration {
	if sc.Window > 0 {
		return sc.Window
	}
	return 10 * time.Second
}

func (sc *Scenario) tickPeriod() time.Duration {
	if sc.TickPeriod > 0 {
		return sc.TickPeriod
	}
	return 50 * time.Millisecond
}

// Validate reports the first problem in sc.
func (sc *Scenario) Validate() error {
	if err := sc.validate(); err != nil {
		return fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	return nil
}

func (sc *Scenario) validate() error {
	if sc.Upstreams <= 0 || sc.Slots <= 0 {
		return errors.New("upstreams and slots must be positive")
	}
	if len(sc.Tenants) == 0 {
		return errors.New("no tenants")
	}
	seen := make(map[string]bool, len(sc.Tenants))
	for i := range sc.Tenants {
		t := &sc.Tenants[i]
		if seen[t.Name] || t.Name == "" {
			return fmt.Errorf("tenant %d: empty or duplicate name %q", i, t.Name)
		}
		seen[t.Name] = true
		if err := t.validate(sc); err != nil {
			return fmt.Errorf("tenant %s: %w", t.Name, err)
		}
	}
	// Alongside may name a tenant listed later: checked once all are.
	for i := range sc.Tenants {
		if err := sc.validateAlongside(&sc.Tenants[i]); err != nil {
			return fmt.Errorf("tenant %s: %w", sc.Tenants[i].Name, err)
		}
	}
	for i, h := range sc.Health {
		if h.Healthy < 0 || h.Healthy > sc.Upstreams || i > 0 && h.At < sc.Health[i-1].At {
			return fmt.Errorf("health timeline entry %d out of order or range", i)
		}
	}
	return nil
}

// validate checks t on its own, and its class against sc.
func (t *TenantSpec) validate(sc *Scenario) error {
	if !(t.Weight > 0) {
		return errors.New("weight must be positive")
	}
	if sc.ClassRank(t.Class) == len(sc.Classes) {
		return fmt.Errorf("unknown class %q", t.Class)
	}
	if err := t.Prompt.validate(); err != nil {
		return fmt.Errorf("prompt: %w", err)
	}
	if err := t.MaxTokens.validate(); err != nil {
		return fmt.Errorf("max_tokens: %w", err)
	}
	return t.Arrivals.validate(sc.Duration)
}

// validate checks the arrival process; duration is the scenario's, which
// ends closed-loop arrivals.
func (a *Arrivals) validate(duration time.Duration) error {
	switch a.Kind {
	case ArrivalBurst:
		if a.N <= 0 {
			return errors.New("burst needs N > 0")
		}
	case ArrivalPoisson:
		return a.validateOpen(a.Rate > 0)
	case ArrivalPeriodic:
		return a.validateOpen(a.Interval > 0)
	case ArrivalPhases:
		return a.validatePhases()
	case ArrivalBacklogged:
		if a.Queue <= 0 || duration <= 0 {
			return errors.New("backlogged needs Queue > 0 and a scenario Duration")
		}
	default:
		return errors.New("unknown arrival kind")
	}
	return nil
}

// validateOpen checks a process that runs until End or Alongside.
func (a *Arrivals) validateOpen(paced bool) error {
	if !paced {
		return errors.New("rate or interval must be positive")
	}
	if a.End <= a.Start && a.Alongside == "" {
		return errors.New("needs End > Start or Alongside")
	}
	return nil
}

func (a *Arrivals) validatePhases() error {
	if len(a.Phases) == 0 || a.Alongside != "" {
		return errors.New("phases needs phases and no alongside")
	}
	for k, ph := range a.Phases {
		if !(ph.Rate > 0) || ph.End <= ph.Start || k > 0 && ph.Start < a.Phases[k-1].End {
			return fmt.Errorf("phase %d: bad rate or span, or overlaps", k)
		}
		for _, d := range []Dist{ph.Prompt, ph.MaxTokens} {
			if d.Kind == 0 {
				continue // the tenant's own
			}
			if err := d.validate(); err != nil {
				return fmt.Errorf("phase %d: %w", k, err)
			}
		}
	}
	return nil
}

// validateAlongside checks that t's leader, if any, is another, plain
// open-loop tenant.
func (sc *Scenario) validateAlongside(t *TenantSpec) error {
	o := t.Arrivals.Alongside
	if o == "" {
		return nil
	}
	j := indexOf(sc, o)
	if j < 0 || o == t.Name {
		return fmt.Errorf("alongside unknown tenant %q", o)
	}
	if k := sc.Tenants[j].Arrivals; k.Kind == ArrivalBacklogged || k.Alongside != "" {
		return fmt.Errorf("alongside %q needs a plain open-loop tenant", o)
	}
	return nil
}

// stream returns a tenant's random stream, keyed by its name so that
// adding tenants leaves the others' requests unchanged.
func stream(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// sizes draws prompt, max_tokens and output (max_tokens x uniform(0.5,
// 1.0), at least 1); ph, when not nil, may replace the distributions.
func (t *TenantSpec) sizes(r *rand.Rand, ph *Phase) (prompt, maxTokens, output int64) {
	pd, md := t.Prompt, t.MaxTokens
	if ph != nil && ph.Prompt.Kind != 0 {
		pd = ph.Prompt
	}
	if ph != nil && ph.MaxTokens.Kind != 0 {
		md = ph.MaxTokens
	}
	prompt = pd.sample(r)
	maxTokens = md.sample(r)
	output = max(int64(math.Round(float64(maxTokens)*(0.5+0.5*r.Float64()))), 1)
	return
}

// Generate draws the open-loop requests of sc for seed; closed-loop
// tenants draw theirs during each run.
func Generate(sc *Scenario, seed uint64) (*Workload, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	per := make([][]Request, len(sc.Tenants))
	// Tenants others arrive alongside are drawn first.
	for i, t := range sc.Tenants {
		if t.Arrivals.Alongside == "" && t.Arrivals.Kind != ArrivalBacklogged {
			per[i] = tenantRequests(sc, seed, i, nil)
		}
	}
	for i, t := range sc.Tenants {
		if o := t.Arrivals.Alongside; o != "" {
			per[i] = tenantRequests(sc, seed, i, per[indexOf(sc, o)])
		}
	}
	all := slices.Concat(per...)
	// Stable: equal arrival times keep tenant order, then the tenant's own.
	sort.SliceStable(all, func(x, y int) bool { return all[x].Arrival < all[y].Arrival })
	for k := range all {
		all[k].ID = k
	}
	return &Workload{Scenario: sc, Seed: seed, Requests: all}, nil
}

// tenantRequests draws tenant i's open-loop requests; leader holds those
// of the tenant it arrives alongside, if any.
func tenantRequests(sc *Scenario, seed uint64, i int, leader []Request) []Request {
	t := &sc.Tenants[i]
	d := &drawer{t: t, tenant: i, r: stream(seed, t.Name)}
	a := &t.Arrivals
	switch a.Kind {
	case ArrivalBurst:
		d.burst(a)
	case ArrivalPoisson:
		more := a.continues(leader, sc.Capacity())
		for at := a.Start + expGap(d.r, a.Rate); more(at, d.own); at += expGap(d.r, a.Rate) {
			d.add(at)
		}
	case ArrivalPeriodic:
		more := a.continues(leader, sc.Capacity())
		for at := a.Start; more(at, d.own); at += a.Interval {
			d.add(at)
		}
	case ArrivalPhases:
		for k := range a.Phases {
			d.drawPhase(&a.Phases[k])
		}
	}
	return d.reqs
}

// continues returns whether a process still arrives at t, own being the
// service time of the tenant's requests so far.
func (a *Arrivals) continues(leader []Request, capacity int) func(t, own time.Duration) bool {
	if a.Alongside == "" {
		return func(t, _ time.Duration) bool { return t < a.End }
	}
	var work, first time.Duration = 0, -1
	for _, q := range leader {
		work += q.Service()
		if first < 0 || q.Arrival < first {
			first = q.Arrival
		}
	}
	c := time.Duration(capacity)
	return func(t, own time.Duration) bool {
		return t < first+(work+own)/c && (a.End <= a.Start || t < a.End)
	}
}

// drawer draws one tenant's requests in arrival order.
type drawer struct {
	t      *TenantSpec
	tenant int
	r      *rand.Rand
	phase  *Phase // the phase arrivals are drawn in; nil outside phases
	reqs   []Request
	own    time.Duration // service time of reqs
}

func (d *drawer) add(at time.Duration) {
	p, m, o := d.t.sizes(d.r, d.phase)
	d.reqs = append(d.reqs, Request{Tenant: d.tenant, Arrival: at, Prompt: p, MaxTokens: m, Output: o})
	d.own += d.reqs[len(d.reqs)-1].Service()
}

// burst draws all N times first, then the sizes in time order.
func (d *drawer) burst(a *Arrivals) {
	times := make([]time.Duration, a.N)
	for k := range times {
		times[k] = a.Start
		if a.End > a.Start {
			times[k] += time.Duration(d.r.Int64N(int64(a.End-a.Start) + 1))
		}
	}
	slices.Sort(times)
	for _, at := range times {
		d.add(at)
	}
}

func (d *drawer) drawPhase(ph *Phase) {
	d.phase = ph
	if ph.Even {
		gap := time.Duration(float64(time.Second) / ph.Rate)
		for at := ph.Start; at < ph.End; at += gap {
			d.add(at)
		}
		return
	}
	for at := ph.Start + expGap(d.r, ph.Rate); at < ph.End; at += expGap(d.r, ph.Rate) {
		d.add(at)
	}
}

func expGap(r *rand.Rand, rate float64) time.Duration {
	return time.Duration(r.ExpFloat64() / rate * float64(time.Second))
}

func indexOf(sc *Scenario, name string) int {
	for i, t := range sc.Tenants {
		if t.Name == name {
			return i
		}
	}
	return -1
}
