package simulator

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Result is one policy's run of one workload.
type Result struct {
	Scenario *Scenario
	Policy   string
	Seed     uint64
	// Requests and Records are parallel: every request of the run,
	// closed-loop ones included, and its outcome.
	Requests []Request
	Records  []Record
	// Rows has one entry per tenant (or group), in scenario order.
	Rows    []Row
	Overall Overall
	// Violations lists the first scheduler invariant violations seen;
	// ViolationCount counts all of them.
	Violations     []string
	ViolationCount int

	// Budgets reports that requests had deadlines.
	Budgets bool
	// MaxBoostedInflight is the most boosted requests in flight seen at a
	// dispatch; BoostViolations counts dispatches over the boost budget.
	MaxBoostedInflight int
	BoostViolations    int
	// BoostLimit is the boost budget's bound at full capacity.
	BoostLimit int
	// Timeline samples the ladder every second while the run has work;
	// Transitions lists its transitions.
	Timeline      []Sample
	Transitions   []degrade.Transition
	CircuitEvents []fairqueue.CircuitEvent

	contended []interval
}

// Row is the measurements of one tenant (or group of tenants).
type Row struct {
	Name   string
	Weight float64 // NaN for a group of mixed weights
	Class  string  // "mixed" for a group of mixed classes
	// N counts the requests; Dispatched, Expired and Rejected split them.
	N, Dispatched, Expired, Rejected int
	// Waits of dispatched requests (nearest-rank percentiles).
	WaitP50, WaitP95, WaitP99 time.Duration
	// LimitP95 is the P95 of the slot-free limit.
	LimitP95 time.Duration
	// AtLimit and AtOrderLimit are the fractions of dispatched requests
	// whose wait was at most their slot-free (in-order) limit + 1 ms.
	AtLimit, AtOrderLimit float64
	// MetBudget is the fraction of all requests dispatched within their
	// class budget; NaN when the class has none.
	MetBudget float64
	// Tokens is the actual cost of completed requests, served at
	// TokPerSec over Makespan (first arrival to last completion).
	Tokens    int64
	TokPerSec float64
	Makespan  time.Duration

	// Starved counts admitted requests that did not start within their
	// budget. FastFailed, Throttled and QueueFull split Rejected by reason;
	// Light counts requests trimmed by light mode.
	Starved, FastFailed, Throttled, QueueFull, Boosted, Light int
	// ETA accuracy over the ETAN dispatched requests with a prediction:
	// the median of |predicted - actual| / actual, and the median and P90
	// of |predicted - actual|.
	ETAN                 int
	ETAErrP50            float64
	ETAAbsP50, ETAAbsP90 time.Duration
}

// Overall is the run as a whole.
type Overall struct {
	Requests  int
	Tokens    int64
	TokPerSec float64
	Makespan  time.Duration
	// Contended is the total time some request was queued.
	Contended time.Duration
	// Jain is the mean of Jain's index over the JainWindows windows wholly
	// in contended time, JainMin the smallest; NaN without such a window.
	Jain, JainMin float64
	JainWindows   int
	// MaxDiff is the max service diff (see the package doc), NaN when no
	// group is tracked; MaxCost is the largest actual request cost.
	MaxDiff           float64
	MaxCost           int64
	Expired, Rejected int
	// Totals of the Row fields, and the ETA error over all requests.
	Starved, FastFailed, Throttled, Boosted, Light int
	ETAN                                           int
	ETAErrP50                                      float64
}

// Row returns the row called name, or nil.
func (res *Result) Row(name string) *Row {
	for i := range res.Rows {
		if res.Rows[i].Name == name {
			return &res.Rows[i]
		}
	}
	return nil
}

func (s *sim) result(policy string) *Result {
	res := &Result{Scenario: s.sc, Policy: policy, Seed: s.w.Seed, Requests: s.reqs, Records: s.recs,
		Violations: s.violations, ViolationCount: s.nViolation, contended: s.contended,
		Budgets: s.budgets, MaxBoostedInflight: s.maxBoosted, BoostViolations: s.boostViol,
		Timeline: s.timeline}
	if s.eng != nil {
		res.Transitions = s.eng.transitions
		res.CircuitEvents = s.eng.circuitEvents
		res.BoostLimit = s.eng.boosts.Limit(s.sc.Capacity())
	}
	res.Rows = s.rows()
	res.Overall = s.overall(res.Rows)
	o := &res.Overall
	o.Jain, o.JainMin, o.JainWindows = res.windowedJain()
	return res
}

// rows measures every tenant, or with GroupRows every group.
func (s *sim) rows() []Row {
	sc := s.sc
	rowOf := make([]int, len(sc.Tenants))
	var names []string
	var members [][]int // row -> its tenants
	idx := map[string]int{}
	for i, t := range sc.Tenants {
		name := t.Name
		if sc.GroupRows {
			name = t.Group
		}
		r, ok := idx[name]
		if !ok {
			r = len(names)
			idx[name] = r
			names = append(names, name)
			members = append(members, nil)
		}
		rowOf[i] = r
		members[r] = append(members[r], i)
	}
	byRow := make([][]int, len(names))
	for id := range s.reqs {
		r := rowOf[s.reqs[id].Tenant]
		byRow[r] = append(byRow[r], id)
	}
	rows := make([]Row, len(names))
	for r, name := range names {
		rows[r] = s.row(name, members[r], byRow[r])
	}
	return rows
}

// overall measures the run as a whole, but for Jain's index.
func (s *sim) overall(rows []Row) Overall {
	o := Overall{Requests: len(s.reqs), MaxDiff: math.NaN()}
	first, last := time.Duration(-1), time.Duration(0)
	var errs []float64
	for id := range s.reqs {
		r, rec := &s.reqs[id], &s.recs[id]
		if first < 0 || r.Arrival < first {
			first = r.Arrival
		}
		switch rec.State {
		case StateCompleted:
			o.Tokens += r.Actual()
			last = max(last, rec.Complete)
			o.MaxCost = max(o.MaxCost, r.Actual())
		case StateExpired:
			o.Expired++
		case StateRejected:
			o.Rejected++
		}
		if e, ok := etaError(r, rec); ok {
			errs = append(errs, e)
		}
	}
	o.Makespan, o.TokPerSec = activeSpan(o.Tokens, first, last)
	for _, iv := range s.contended {
		o.Contended += iv.to - iv.from
	}
	for _, row := range rows {
		o.Starved += row.Starved
		o.FastFailed += row.FastFailed
		o.Throttled += row.Throttled
		o.Boosted += row.Boosted
		o.Light += row.Light
	}
	o.ETAN, o.ETAErrP50 = len(errs), median(errs)
	if s.diff.tracked {
		o.MaxDiff = s.diff.max
	}
	return o
}

// activeSpan returns the span from first arrival to last completion and
// the tokens served per second over it.
func activeSpan(tokens int64, first, last time.Duration) (time.Duration, float64) {
	if first < 0 || last <= first {
		return 0, 0
	}
	span := last - first
	return span, float64(tokens) / span.Seconds()
}

// row measures the requests ids of the tenants of one row.
func (s *sim) row(name string, tenants, ids []int) Row {
	sc := s.sc
	b := rowBuilder{first: -1, Row: Row{Name: name, Weight: sc.Tenants[tenants[0]].Weight,
		Class: sc.Tenants[tenants[0]].Class, N: len(ids), MetBudget: math.NaN()}}
	for _, t := range tenants[1:] {
		if sc.Tenants[t].Weight != b.Weight {
			b.Weight = math.NaN()
		}
		if sc.Tenants[t].Class != b.Class {
			b.Class = "mixed"
		}
	}
	for _, id := range ids {
		r := &s.reqs[id]
		b.add(r, &s.recs[id], sc.Budget(r.Tenant))
	}
	return b.finish()
}

// rowBuilder counts a row's requests one by one.
type rowBuilder struct {
	Row
	waits, limits, absErr           []time.Duration
	relErr                          []float64
	met, budgeted, atLimit, atOrder int
	first, last                     time.Duration
}

func (b *rowBuilder) add(r *Request, rec *Record, budget time.Duration) {
	if b.first < 0 || r.Arrival < b.first {
		b.first = r.Arrival
	}
	if budget > 0 {
		b.budgeted++
	}
	if rec.Light {
		b.Light++
	}
	if e, ok := etaError(r, rec); ok {
		b.relErr = append(b.relErr, e)
		b.absErr = append(b.absErr, (rec.Predicted - rec.Wait(r)).Abs())
	}
	switch rec.State {
	case StateInflight, StateCompleted:
		b.dispatched(r, rec, budget)
	case StateExpired:
		b.Expired++
		b.Starved++
	case StateRejected:
		b.Rejected++
		switch rec.Reason {
		case fairqueue.ReasonBudgetExceeded:
			b.FastFailed++
		case fairqueue.ReasonClassThrottled:
			b.Throttled++
		case fairqueue.ReasonQueueFull, fairqueue.ReasonTenantQueueFull:
			b.QueueFull++
		}
	}
}

func (b *rowBuilder) dispatched(r *Request, rec *Record, budget time.Duration) {
	b.Dispatched++
	if rec.Boosted {
		b.Boosted++
	}
	w := rec.Wait(r)
	b.waits = append(b.waits, w)
	b.limits = append(b.limits, rec.Limit)
	if w <= rec.Limit+time.Millisecond {
		b.atLimit++
	}
	if w <= rec.OrderLimit+time.Millisecond {
		b.atOrder++
	}
	switch {
	case budget > 0 && w > budget:
		b.Starved++
	case budget > 0:
		b.met++
	}
	if rec.State == StateCompleted {
		b.Tokens += r.Actual()
		b.last = max(b.last, rec.Complete)
	}
}

func (b *rowBuilder) finish() Row {
	row := b.Row
	row.ETAN, row.ETAErrP50 = len(b.relErr), median(b.relErr)
	if len(b.absErr) > 0 {
		slices.Sort(b.absErr)
		row.ETAAbsP50, row.ETAAbsP90 = percentile(b.absErr, 0.5), percentile(b.absErr, 0.9)
	}
	if b.budgeted > 0 {
		row.MetBudget = float64(b.met) / float64(b.budgeted)
	}
	if row.Dispatched > 0 {
		slices.Sort(b.waits)
		slices.Sort(b.limits)
		row.WaitP50 = percentile(b.waits, 0.50)
		row.WaitP95 = percentile(b.waits, 0.95)
		row.WaitP99 = percentile(b.waits, 0.99)
		row.LimitP95 = percentile(b.limits, 0.95)
		row.AtLimit = float64(b.atLimit) / float64(row.Dispatched)
		row.AtOrderLimit = float64(b.atOrder) / float64(row.Dispatched)
	}
	row.Makespan, row.TokPerSec = activeSpan(row.Tokens, b.first, b.last)
	return row
}

// etaError is the relative error |predicted - actual| / actual of a
// dispatched request with a prediction, boosted ones left out (the boost,
// not the ETA, set their wait).
func etaError(r *Request, rec *Record) (float64, bool) {
	if !rec.HasPrediction || rec.Boosted || !rec.Served() {
		return 0, false
	}
	actual := rec.Wait(r)
	if actual <= 0 {
		// Queued at admission yet dispatched in the same instant: the
		// prediction is off by all of itself.
		return 1, true
	}
	return math.Abs(float64(rec.Predicted-actual)) / float64(actual), true
}

// median returns the median of xs (sorting them), NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// windowedJain returns the mean, the minimum and the number of Jain's
// indexes over the windows wholly in contended time (see the package doc).
func (res *Result) windowedJain() (mean, lowest float64, n int) {
	sc := res.Scenario
	W := sc.window()
	ok, end := res.contendedWindows(W)
	nw, nt := len(ok), len(sc.Tenants)
	if nw == 0 {
		return math.NaN(), math.NaN(), 0
	}
	recv, backlog := res.windowTotals(W, end, nw)
	weights := make([]float64, nt)
	for i, t := range sc.Tenants {
		weights[i] = t.Weight
	}
	demand := make([]float64, nt)
	fair := make([]float64, nt)
	order := make([]int, nt)
	sum, lowest := 0.0, math.Inf(1)
	for k := range nw {
		if !ok[k] {
			continue
		}
		got := recv[k*nt : (k+1)*nt]
		capacity := 0.0
		for i := range demand {
			demand[i] = got[i] + backlog[k*nt+i]
			capacity += got[i]
		}
		waterfill(demand, weights, capacity, fair, order)
		if j, defined := weightedJain(got, fair); defined {
			sum += j
			lowest = min(lowest, j)
			n++
		}
	}
	if n == 0 {
		return math.NaN(), math.NaN(), 0
	}
	return sum / float64(n), lowest, n
}

// contendedWindows returns, for each window of length W up to the end of
// contention, whether it lies wholly in contended time.
func (res *Result) contendedWindows(W time.Duration) (ok []bool, end time.Duration) {
	for _, iv := range res.contended {
		end = max(end, iv.to)
	}
	ok = make([]bool, int(end/W))
	for _, iv := range res.contended {
		for k := int((iv.from + W - 1) / W); k < len(ok) && time.Duration(k+1)*W <= iv.to; k++ {
			ok[k] = true
		}
	}
	return ok, end
}

// windowTotals returns, per window k and tenant i at [k*nt+i], the tokens
// received in the window (spread evenly over each service) and the
// backlog at its end (actual cost arrived and not yet gone).
func (res *Result) windowTotals(W, end time.Duration, nw int) (recv, backlog []float64) {
	nt := len(res.Scenario.Tenants)
	recv = make([]float64, nw*nt)
	backlog = make([]float64, nw*nt)
	for id := range res.Requests {
		r, rec := &res.Requests[id], &res.Records[id]
		if rec.State == StateRejected || rec.State == StateNone {
			continue
		}
		// Backlog at each window end b with arrival < b < left.
		left := rec.Left
		if rec.State == StateQueued {
			left = end + W
		}
		for k := int(r.Arrival / W); k < nw; k++ {
			b := time.Duration(k+1) * W
			if b <= r.Arrival {
				continue
			}
			if b >= left {
				break
			}
			backlog[k*nt+r.Tenant] += float64(r.Actual())
		}
		if rec.State != StateCompleted || rec.Complete <= rec.Dispatch {
			continue
		}
		rate := float64(r.Actual()) / float64(rec.Complete-rec.Dispatch)
		for k := int(rec.Dispatch / W); k < nw; k++ {
			lo, hi := max(rec.Dispatch, time.Duration(k)*W), min(rec.Complete, time.Duration(k+1)*W)
			if hi <= lo {
				break
			}
			recv[k*nt+r.Tenant] += rate * float64(hi-lo)
		}
	}
	return recv, backlog
}

// weightedJain is Jain's index of got[i] / fair[i] over the tenants with
// a fair share; not defined when none has one or every ratio is 0.
func weightedJain(got, fair []float64) (float64, bool) {
	var sx, sxx float64
	m := 0
	for i := range fair {
		if fair[i] > 1e-9 {
			x := got[i] / fair[i]
			sx += x
			sxx += x * x
			m++
		}
	}
	if m == 0 || sxx == 0 {
		return 0, false
	}
	return sx * sx / (float64(m) * sxx), true
}

// waterfill writes into fair the weighted max-min fair allocation of
// capacity, min(demand_i, L * w_i) for the level L that uses it all.
// order is scratch space.
func waterfill(demand, weight []float64, capacity float64, fair []float64, order []int) {
	var wsum float64
	order = order[:0]
	for i := range demand {
		fair[i] = 0
		if demand[i] > 0 {
			order = append(order, i)
			wsum += weight[i]
		}
	}
	sort.Slice(order, func(a, b int) bool {
		return demand[order[a]]/weight[order[a]] < demand[order[b]]/weight[order[b]]
	})
	left := capacity
	for k, i := range order {
		if demand[i]/weight[i]*wsum <= left {
			fair[i] = demand[i]
			left -= demand[i]
			wsum -= weight[i]
			continue
		}
		level := left / wsum
		for _, j := range order[k:] {
			fair[j] = level * weight[j]
		}
		return
	}
}
