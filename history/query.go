package history

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Windows are the spans a query may cover, by name.
var Windows = map[string]time.Duration{"5m": 5 * time.Minute, "1h": time.Hour, "24h": 24 * time.Hour}

// ParseWindow returns the span a window name stands for.
func ParseWindow(name string) (time.Duration, error) {
	if d, ok := Windows[name]; ok {
		return d, nil
	}
	return 0, fmt.Errorf("unknown window %q: use 5m, 1h or 24h", name)
}

// TenantParams is what the caller knows of a tenant from the configuration
// in force: its weight, and its quota's limits (0: the meter is not set).
type TenantParams struct {
	Weight float64
	// QPS is the quota's request rate, per second.
	QPS float64
	// TokensPerMin is the quota's token rate, per minute.
	TokensPerMin float64
	// JointPerSec is the joint meter's rate, request-equivalents per
	// second, where a request weighs 1 + its tokens x TokenWeight.
	JointPerSec float64
	TokenWeight float64
	// PerCaller says the limits bind each caller counted under the name
	// separately (UnknownTenant: every undeclared tenant has
	// default_tenant's quota of its own).
	PerCaller bool
}

// Report is what happened over a window.
type Report struct {
	// Window is the window asked for, in seconds.
	Window float64 `json:"window_seconds"`
	// Span is the part of the window the history covers (since it was
	// created, at most the window), in seconds: rates are over it.
	Span float64 `json:"span_seconds"`
	// BucketBounds are the wait histogram's bucket upper bounds, seconds;
	// the last bucket of each histogram is unbounded.
	BucketBounds []float64 `json:"bucket_bounds"`
	// Tenants are sorted by name: every tenant given params, and any other
	// tenant with records.
	Tenants []TenantReport `json:"tenants"`
	// Jain is Jain's fairness index of served-token share over fair share,
	// over the JainTenants tenants owed a part of the window's tokens: 1
	// when each got what WFQ owed it, 1/n when one took everything the
	// others waited for; 0 when nothing was served.
	Jain        float64 `json:"jain"`
	JainTenants int     `json:"jain_tenants"`
	// Series is the gateway over the window, oldest first: per second for
	// windows of up to five minutes, else per minute. Seconds and minutes
	// without a sample are left out.
	Series []Point `json:"series"`
	// Resolution is the series' step, seconds.
	Resolution float64 `json:"resolution_seconds"`
	// Transitions are the degrade and circuit transitions in the window,
	// oldest first (at most MaxTransitions).
	Transitions []Transition `json:"transitions"`
}

// TenantReport is one tenant over a window.
type TenantReport struct {
	Name string `json:"name"`
	// Requests is every answered request; Outcomes splits them by code
	// (codes with no request are left out).
	Requests int64            `json:"requests"`
	Outcomes map[string]int64 `json:"outcomes"`
	Served   int64            `json:"served"`
	// SuccessRate is Served over Requests (0 without requests).
	SuccessRate float64 `json:"success_rate"`
	// Wait is the served requests' wait in the queue, seconds.
	Wait WaitSummary `json:"wait"`
	// WaitHistogram counts served requests per bucket (Report.BucketBounds).
	WaitHistogram []uint64 `json:"wait_histogram"`
	// ServedTokens are the tokens served, actual usage.
	ServedTokens int64 `json:"served_tokens"`
	// Weight is the tenant's weight in force. Share is its part of the
	// tokens served in the window; FairShare its part of what WFQ owed
	// (see History.Sample), 0 for a tenant owed nothing.
	Weight    float64 `json:"weight"`
	Share     float64 `json:"share"`
	FairShare float64 `json:"fair_share"`
	// Rates are per second over Report.Span.
	RequestsPerSec     float64      `json:"requests_per_sec"`
	ServedTokensPerSec float64      `json:"served_tokens_per_sec"`
	Boosts             int64        `json:"boosts"`
	ETA                ETASummary   `json:"eta"`
	Quota              QuotaSummary `json:"quota"`
}

// WaitSummary is a wait distribution, seconds.
type WaitSummary struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
}

// ETASummary is how well the promised waits matched the real ones.
type ETASummary struct {
	Count int64 `json:"count"`
	// MeanRatio is the mean of predicted / actual wait (1 = exact, above 1
	// = pessimistic).
	MeanRatio float64 `json:"mean_ratio"`
	// MeanAbsLogError is the mean of |ln(predicted/actual)|: exp of it is
	// the typical factor the prediction was off by.
	MeanAbsLogError float64 `json:"mean_abs_log_error"`
}

// QuotaSummary is the tenant's use of its quota: what was charged against
// the limits, and the limit hits by meter.
type QuotaSummary struct {
	QPSLimit          float64 `json:"qps_limit"`
	TokensPerMinLimit float64 `json:"tokens_per_min_limit"`
	// JointLimit is the joint meter's rate in request-equivalents per
	// second, a request weighing 1 + tokens x TokenWeight (0: no joint
	// meter).
	JointLimit  float64 `json:"joint_limit"`
	TokenWeight float64 `json:"token_to_qps_weight"`
	// PerCaller: the limits bind each caller counted here separately, so
	// there is no occupancy.
	PerCaller bool `json:"per_caller"`
	// ChargedPerSec, ChargedTokensPerMin and ChargedJointPerSec are
	// averages over Report.Span; the joint one weighs tokens at the
	// TokenWeight in force now.
	ChargedPerSec       float64 `json:"charged_per_sec"`
	ChargedTokensPerMin float64 `json:"charged_tokens_per_min"`
	ChargedJointPerSec  float64 `json:"charged_joint_per_sec"`
	// QPSOccupancy, TokenOccupancy and JointOccupancy are the charged
	// averages over their limits (0 without the limit, or per caller): 1
	// is exactly the quota, over the window.
	QPSOccupancy   float64 `json:"qps_occupancy"`
	TokenOccupancy float64 `json:"token_occupancy"`
	JointOccupancy float64 `json:"joint_occupancy"`
	// Hits counts the requests the quota limited, by meter.
	Hits map[string]QuotaHits `json:"hits"`
}

// QuotaHits is one meter's limit hits.
type QuotaHits struct {
	Delayed int64 `json:"delayed"`
	Refused int64 `json:"refused"`
}

// Point is the gateway at one second or minute: its last state then and
// its highest water, degrade and circuit levels.
type Point struct {
	At         time.Time `json:"at"`
	Capacity   int       `json:"capacity"`
	Healthy    int       `json:"healthy"`
	Water      float64   `json:"water"`
	WaterMax   float64   `json:"water_max"`
	Degrade    int       `json:"degrade"`
	DegradeMax int       `json:"degrade_max"`
	Circuit    int       `json:"circuit"`
	CircuitMax int       `json:"circuit_max"`
}

// agg is a tenant's minutes merged.
type agg struct {
	outcomes [numOutcomes]uint64
	wait     [NumBuckets]uint64
	waitSum  float64
	tokens   int64
	boosts   uint64
	etaN     uint64
	etaRatio float64
	etaErr   float64
	limited  [len(QuotaReasons)][2]uint64
	chargedN uint64
	chargedT int64
	owed     float64
}

func (a *agg) add(s *tenantMinute) {
	for i, c := range s.outcomes {
		a.outcomes[i] += uint64(c)
	}
	for i, c := range s.wait {
		a.wait[i] += uint64(c)
	}
	a.waitSum += s.waitSum
	a.tokens += s.tokens
	a.boosts += uint64(s.boosts)
	a.etaN += uint64(s.etaN)
	a.etaRatio += s.etaRatio
	a.etaErr += s.etaErr
	for r := range s.limited {
		for k := range s.limited[r] {
			a.limited[r][k] += uint64(s.limited[r][k])
		}
	}
	a.chargedN += uint64(s.chargedN)
	a.chargedT += s.chargedT
	a.owed += s.owed
}

// Query reports the window ending now, rounded up to whole minutes (a 5m
// window is the current minute and the four before it). params gives the
// tenants' weights and limits; tenants it names appear even without
// records.
func (h *History) Query(window time.Duration, params map[string]TenantParams) Report {
	now := h.now()
	minutes := min(max(int64(window/time.Minute), 1), Minutes)
	last := unixMinute(now)
	first := last - minutes + 1
	from := time.Unix(first*60, 0)
	if from.Before(h.start) {
		from = h.start
	}
	span := max(now.Sub(from).Seconds(), 1)

	rep := Report{Window: window.Seconds(), Span: span, BucketBounds: BucketBounds()}
	sums := map[string]*agg{}
	h.mu.Lock()
	for name, r := range h.tenants {
		a := &agg{}
		for m := first; m <= last; m++ {
			if s := &r.minutes[ringIndex(m, Minutes)]; s.minute == m {
				a.add(s)
			}
		}
		sums[name] = a
	}
	rep.Series, rep.Resolution = h.seriesLocked(now, window)
	rep.Transitions = h.transitionsLocked(now.Add(-window))
	h.mu.Unlock()

	for name := range params {
		if sums[name] == nil {
			sums[name] = &agg{}
		}
	}
	names := slices.Sorted(maps.Keys(sums))
	owed := make([]float64, len(names))
	for i, n := range names {
		rep.Tenants = append(rep.Tenants, tenantReport(n, sums[n], params[n], span))
		owed[i] = sums[n].owed
	}
	rep.Jain, rep.JainTenants = shares(rep.Tenants, owed)
	return rep
}

func tenantReport(name string, a *agg, p TenantParams, span float64) TenantReport {
	t := TenantReport{Name: name, Outcomes: map[string]int64{}, Weight: p.Weight,
		WaitHistogram: append([]uint64(nil), a.wait[:]...), ServedTokens: a.tokens,
		Boosts: int64(a.boosts)}
	for i, c := range a.outcomes {
		if c > 0 {
			t.Outcomes[Outcomes[i]] = int64(c)
			t.Requests += int64(c)
		}
	}
	t.Served = int64(a.outcomes[outServed])
	if t.Requests > 0 {
		t.SuccessRate = float64(t.Served) / float64(t.Requests)
	}
	var n uint64
	for _, c := range a.wait {
		n += c
	}
	t.Wait = WaitSummary{Count: int64(n), P50: quantile(&a.wait, 0.50),
		P95: quantile(&a.wait, 0.95), P99: quantile(&a.wait, 0.99)}
	if n > 0 {
		t.Wait.Mean = a.waitSum / float64(n)
	}
	t.RequestsPerSec = float64(t.Requests) / span
	t.ServedTokensPerSec = float64(a.tokens) / span
	if a.etaN > 0 {
		t.ETA = ETASummary{Count: int64(a.etaN), MeanRatio: a.etaRatio / float64(a.etaN),
			MeanAbsLogError: a.etaErr / float64(a.etaN)}
	}
	t.Quota = quotaSummary(a, p, span)
	return t
}

// quotaSummary is the tenant's charges and limit hits against its limits p.
func quotaSummary(a *agg, p TenantParams, span float64) QuotaSummary {
	q := QuotaSummary{QPSLimit: p.QPS, TokensPerMinLimit: p.TokensPerMin, JointLimit: p.JointPerSec,
		TokenWeight: p.TokenWeight, PerCaller: p.PerCaller,
		ChargedPerSec:       float64(a.chargedN) / span,
		ChargedTokensPerMin: float64(a.chargedT) / span * 60, Hits: map[string]QuotaHits{}}
	if p.JointPerSec > 0 {
		q.ChargedJointPerSec = (float64(a.chargedN) + float64(a.chargedT)*p.TokenWeight) / span
	}
	if !p.PerCaller {
		if p.QPS > 0 {
			q.QPSOccupancy = q.ChargedPerSec / p.QPS
		}
		if p.TokensPerMin > 0 {
			q.TokenOccupancy = q.ChargedTokensPerMin / p.TokensPerMin
		}
		if p.JointPerSec > 0 {
			q.JointOccupancy = q.ChargedJointPerSec / p.JointPerSec
		}
	}
	for r, reason := range QuotaReasons {
		if hit := a.limited[r]; hit[actionDelayed]+hit[actionRefused] > 0 {
			q.Hits[reason] = QuotaHits{Delayed: int64(hit[actionDelayed]), Refused: int64(hit[actionRefused])}
		}
	}
	return q
}

// shares fills in each tenant's share of the tokens served and its fair
// share, its part of the tokens owed (owed, by tenant; see Sample), and
// returns Jain's index of share / fair share over the tenants owed
// anything.
func shares(ts []TenantReport, owed []float64) (jain float64, n int) {
	var tokens int64
	var owedAll float64
	for i, t := range ts {
		tokens += t.ServedTokens
		owedAll += owed[i]
	}
	if tokens == 0 || owedAll == 0 {
		return 0, 0
	}
	var sum, sq float64
	for i := range ts {
		t := &ts[i]
		t.Share = float64(t.ServedTokens) / float64(tokens)
		if owed[i] <= 0 {
			continue
		}
		t.FairShare = owed[i] / owedAll
		x := t.Share / t.FairShare
		sum += x
		sq += x * x
		n++
	}
	if sq == 0 {
		return 0, n
	}
	return sum * sum / (float64(n) * sq), n
}

// seriesLocked returns the gateway samples of the window.
func (h *History) seriesLocked(now time.Time, window time.Duration) ([]Point, float64) {
	ring, step, last := h.minutes[:], int64(60), unixMinute(now)
	if window <= Seconds*time.Second {
		ring, step, last = h.seconds[:], 1, now.Unix()
	}
	n := min(max(int64(window.Seconds())/step, 1), int64(len(ring)))
	out := make([]Point, 0, n)
	for at := last - n + 1; at <= last; at++ {
		s := &ring[ringIndex(at, len(ring))]
		if s.at != at || s.samples == 0 {
			continue
		}
		out = append(out, Point{At: time.Unix(at*step, 0).UTC(), Capacity: int(s.capacity),
			Healthy: int(s.healthy), Water: round(s.water), WaterMax: round(s.waterMax),
			Degrade: int(s.degrade), DegradeMax: int(s.degradeMax),
			Circuit: int(s.circuit), CircuitMax: int(s.circuitMax)})
	}
	return out, float64(step)
}

// transitionsLocked returns the transitions at or after since, oldest
// first.
func (h *History) transitionsLocked(since time.Time) []Transition {
	out := []Transition{}
	n := min(h.transN, MaxTransitions)
	for i := h.transN - n; i < h.transN; i++ {
		if t := h.trans[i%MaxTransitions]; !t.At.Before(since) {
			out = append(out, t)
		}
	}
	return out
}

// round keeps four decimals: the series is for charts.
func round(x float64) float64 { return math.Round(x*1e4) / 1e4 }
