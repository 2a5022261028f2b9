package simulator

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// The wait-budget scenarios run once per test binary under every budget
// policy (seed 1), shared by the tests that assert on them.
var (
	budgetMu    sync.Mutex
	budgetCache = map[string]map[string]*Result{}
)

func budgetRuns(t *testing.T, name string) map[string]*Result {
	t.Helper()
	budgetMu.Lock()
	defer budgetMu.Unlock()
	if r, ok := budgetCache[name]; ok {
		return r
	}
	out, list := runSeed(t, name, 1, BudgetPolicies())
	var b strings.Builder
	FormatBudgets(&b, list)
	t.Logf("\n%s", b.String())
	for _, res := range list {
		if res.ViolationCount > 0 {
			t.Errorf("%s/%s: %d invariant violations: %s", name, res.Policy, res.ViolationCount,
				strings.Join(res.Violations, "; "))
		}
	}
	budgetCache[name] = out
	return out
}

// checkPromises asserts the wait-budget promises of issue 4 on one
// scenario under wfq-budgets (budgets, boost and fast-fail on).
func checkPromises(t *testing.T, name string) map[string]*Result {
	r := budgetRuns(t, name)
	res, noBoost := r[WFQBudgets], r[WFQNoBoost]
	sc := res.Scenario

	// No starved request: every admitted request, in every tenant, started
	// within its budget (the engine never dispatches after the deadline,
	// so a miss would be an expiry).
	if res.Overall.Starved != 0 {
		t.Errorf("%s: %d starved requests, want 0", name, res.Overall.Starved)
	}
	for _, row := range res.Rows {
		switch row.Class {
		case "realtime", "interactive":
			if row.MetBudget < 0.999 {
				t.Errorf("%s: %s met its budget for %.2f%% of requests, want >= 99.9%%", name, row.Name, 100*row.MetBudget)
			}
		case "batch":
			// Requests that cannot make 300 s are refused at admission,
			// not left to expire after waiting.
			if row.Expired != 0 || row.FastFailed == 0 {
				t.Errorf("%s: %s: %d expired, %d fast-failed; want 0 expired and some fast-failed",
					name, row.Name, row.Expired, row.FastFailed)
			}
		}
	}
	// Boosting reorders, it does not idle slots: throughput within 1% of
	// the same run without boost.
	if d := relDiff(res.Overall.TokPerSec, noBoost.Overall.TokPerSec); d > 0.01 {
		t.Errorf("%s: throughput %.0f tok/s with boost vs %.0f without: %.2f%% > 1%%",
			name, res.Overall.TokPerSec, noBoost.Overall.TokPerSec, 100*d)
	}
	// The boost budget, checked by the simulator at every dispatch.
	if res.BoostViolations != 0 || res.MaxBoostedInflight > res.BoostLimit {
		t.Errorf("%s: boosted in flight reached %d (limit %d), %d violations",
			name, res.MaxBoostedInflight, res.BoostLimit, res.BoostViolations)
	}
	perTenant := make([]int, len(sc.Tenants))
	for id := range res.Requests {
		if res.Records[id].Boosted {
			perTenant[res.Requests[id].Tenant]++
		}
	}
	for i, n := range perTenant {
		// The scenarios last at most 30 min: every boost is in one hour.
		if n > sc.admission().PerTenantBoostHourly {
			t.Errorf("%s: %s boosted %d times in the run, more than %d per hour", name, sc.Tenants[i].Name,
				n, sc.admission().PerTenantBoostHourly)
		}
	}
	// ETA accuracy: median |predicted - actual| / actual over the
	// dispatched requests with a prediction, all tenants pooled, and for
	// the tenants that wait in a queue of their own (batch).
	if e := res.Overall.ETAErrP50; !(e <= 0.20) {
		t.Errorf("%s: median ETA error %.1f%% over %d requests, want <= 20%%", name, 100*e, res.Overall.ETAN)
	}
	for _, row := range res.Rows {
		t.Logf("%s: %s ETA error: median %.1f%% relative over %d requests; absolute median %v, P90 %v",
			name, row.Name, 100*row.ETAErrP50, row.ETAN, row.ETAAbsP50, row.ETAAbsP90)
		b := sc.Budget(indexOf(sc, row.Name))
		switch {
		case row.Class == "batch":
			if !(row.ETAErrP50 <= 0.20) {
				t.Errorf("%s: %s median ETA error %.1f%%, want <= 20%%", name, row.Name, 100*row.ETAErrP50)
			}
		case row.ETAN > 0:
			// A realtime or interactive request waits for the next slot
			// to free: a sub-second residual time of a near-Poisson
			// completion stream, which no point estimate predicts to 20%
			// (the best constant achieves a median relative error of
			// about 63% on exponential waits). What decides its fate is
			// the error against its budget: the same 20%, of the budget,
			// for 90% of its requests.
			if row.ETAAbsP90 > b/5 {
				t.Errorf("%s: %s P90 absolute ETA error %v > 20%% of its %v budget", name, row.Name, row.ETAAbsP90, b)
			}
		}
	}
	return r
}

func TestBudgetsSeed000(t *testing.T) {
	r := checkPromises(t, "seed000")
	// Fast-fail precision: of the requests refused, how many missed their
	// budget (expired, or dispatched late) when the same workload ran
	// with fast-fail off.
	p := FastFailPrecision(r[WFQBudgets], r[WFQNoFastFail])
	t.Logf("seed000: fast-fail precision %.1f%%: %+v", 100*p.Precision(), p)
	if !(p.Precision() >= 0.95) {
		t.Errorf("seed000: fast-fail precision %.1f%% (%+v), want >= 95%%", 100*p.Precision(), p)
	}
	// FIFO with the same deadlines starves the sparse tenants.
	fifo := r[FIFOBudgets]
	for _, name := range []string{"marketing", "cs_bot"} {
		if m := fifo.Row(name).MetBudget; m > 0.1 {
			t.Errorf("fifo-budgets: %s met its budget for %.1f%%, want the flood to starve it", name, 100*m)
		}
	}
	// Deterministic: the same workload and policy give the same records.
	w, err := Generate(Seed000(), 1)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Run(w, p0(t, WFQBudgets))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again.Records, r[WFQBudgets].Records) {
		t.Error("seed000/wfq-budgets: a second run gave different records")
	}
	if !raceEnabled {
		priorSweep(t)
	}
}

func p0(t *testing.T, name string) Policy {
	p, ok := PolicyByName(name)
	if !ok {
		t.Fatalf("no policy %q", name)
	}
	return p
}

// priorSweep logs how seed000's outcome depends on the throughput prior,
// the only rate the engine has while the flood arrives (before the first
// completion): a prior above the flood's true share of capacity admits
// requests that then expire; one below it refuses some that would have
// made it.
func priorSweep(t *testing.T) {
	sc := Seed000()
	w, err := Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	nominal := NominalRate(w, "data_batch")
	var b strings.Builder
	fmt.Fprintf(&b, "seed000, throughput prior as a fraction of the flood's nominal rate (%.0f tok/s per upstream):\n", nominal)
	fmt.Fprintf(&b, "%6s  %8s  %8s  %11s  %9s\n", "prior", "starved", "refused", "precision", "eta err")
	for _, f := range []float64{0.75, 0.80, 0.85, 0.90, 0.95, 1.00} {
		sc.Admission = withPrior(f * nominal)
		on, _ := Run(w, EnginePolicy{PolicyName: WFQBudgets, CostUnit: fairqueue.CostTokens, Budgets: true})
		off, _ := Run(w, EnginePolicy{PolicyName: WFQNoFastFail, CostUnit: fairqueue.CostTokens, Budgets: true,
			Configure: func(c *fairqueue.Config) { c.Admission.FastFail = false }})
		p := FastFailPrecision(on, off)
		fmt.Fprintf(&b, "%6.2f  %8d  %8d  %10.1f%%  %8.1f%%\n", f, on.Overall.Starved, p.Refused,
			100*p.Precision(), 100*on.Row("data_batch").ETAErrP50)
	}
	t.Logf("\n%s", b.String())
}

func TestBudgetsStress(t *testing.T) {
	r := checkPromises(t, "seed000-stress")
	res := r[WFQBudgets]
	// The sparse small tenants' long requests need the boost: it is used,
	// and without it some of them are refused.
	if res.Overall.Boosted == 0 {
		t.Error("seed000-stress: no boost happened; the scenario should need some")
	}
	noBoost := r[WFQNoBoost]
	missed := 0
	for _, row := range noBoost.Rows {
		if row.Class == "realtime" {
			missed += row.N - int(math.Round(row.MetBudget*float64(row.N)))
		}
	}
	t.Logf("seed000-stress: without boost the realtime tenants miss %d requests", missed)
	// Fast-fail precision is reported, not asserted, here: under a
	// sustained overload the flood's queue is held at its budget and
	// every request is refused or admitted within one request's service
	// time of that edge, so whether it would have made it is a matter of
	// the run's phase: with fast-fail off a different set of requests
	// expires. See the report.
	p := FastFailPrecision(res, r[WFQNoFastFail])
	off := r[WFQNoFastFail].Row("data_batch").Expired
	t.Logf("seed000-stress: fast-fail precision %.1f%% request by request (%+v); "+
		"in aggregate fast-fail refused %d where fast-fail off let %d expire (%.1f%%)",
		100*p.Precision(), p, p.Refused, off, 100*float64(off)/float64(p.Refused))
}

// TestBudgetsOutage checks that ETAs follow capacity at once: with one of
// two upstreams down, the ETAs of new admissions double from the first
// admission on (the throughput estimator scales with the healthy count),
// refusals follow, and both recover when the upstream returns.
func TestBudgetsOutage(t *testing.T) {
	check := func(res *Result, tenant string, window time.Duration) []HealthEffect {
		var out []HealthEffect
		for _, e := range res.HealthEffects(window) {
			if e.Tenant != tenant {
				continue
			}
			out = append(out, e)
			t.Logf("%s: at %v (%d healthy) %s: ETA p50 %v (n=%d) -> %v (n=%d), %.2fx; fast-failed %.0f%% -> %.0f%%",
				res.Scenario.Name, e.At, e.Healthy, tenant, e.ETABefore, e.NBefore, e.ETAAfter, e.NAfter, e.Ratio(),
				100*e.RefusedBefore, 100*e.RefusedAft)
		}
		if len(out) != 2 {
			t.Fatalf("%s: %d health changes, want 2", res.Scenario.Name, len(out))
		}
		if r := out[0].Ratio(); !(r >= 1.6 && r <= 2.5) {
			t.Errorf("%s: %s ETAs x%.2f when an upstream went down, want about 2", res.Scenario.Name, tenant, r)
		}
		if r := out[1].Ratio(); !(r >= 0.4 && r <= 0.625) {
			t.Errorf("%s: %s ETAs x%.2f when it returned, want about 1/2", res.Scenario.Name, tenant, r)
		}
		return out
	}

	// outage: seed000's flood arrived in its first 5 s, so the new
	// admissions around the outage are the sparse tenants', whose ETA is
	// the time until a slot frees: it doubles, far below their budgets, so
	// nothing is refused. The flood's requests admitted before the outage
	// were promised full capacity; those the outage makes late expire.
	res := budgetRuns(t, "outage")[WFQBudgets]
	check(res, "(all)", 20*time.Second)
	t.Logf("outage: %d starved (admitted before the outage on full-capacity ETAs), %d fast-failed",
		res.Overall.Starved, res.Overall.FastFailed)

	// stress-outage: the flood keeps arriving, its queue holding a full
	// budget of work; its new requests' ETAs double and every one is
	// refused until the upstream returns, then admissions resume.
	res = budgetRuns(t, "stress-outage")[WFQBudgets]
	check(res, "data_batch", 5*time.Second)
	refused := func(from, to time.Duration) float64 {
		var n, ff int
		for id := range res.Requests {
			r, rec := &res.Requests[id], &res.Records[id]
			if r.Tenant == 0 && r.Arrival >= from && r.Arrival < to {
				n++
				if rec.State == StateRejected && rec.Reason == fairqueue.ReasonBudgetExceeded {
					ff++
				}
			}
		}
		return frac(ff, n)
	}
	before, during, after := refused(840*time.Second, 900*time.Second), refused(900*time.Second, 960*time.Second),
		refused(960*time.Second, 965*time.Second)
	t.Logf("stress-outage: data_batch fast-failed %.1f%% in the minute before the outage, %.1f%% during it, "+
		"%.1f%% in the 5 s after it", 100*before, 100*during, 100*after)
	if !(during == 1 && before < 0.9 && after < 0.5) {
		t.Errorf("stress-outage: refusals %.2f before, %.2f during, %.2f after the outage; "+
			"want all refused during it, and admissions before and after", before, during, after)
	}
}

// NominalRate is the throughput of one upstream of sc, in estimated tokens
// per second, when its slots serve tenant's requests only: slots x mean
// estimate / mean service time of the tenant's open-loop requests.
func NominalRate(w *Workload, tenant string) float64 {
	i := indexOf(w.Scenario, tenant)
	var est, svc float64
	for k := range w.Requests {
		if r := &w.Requests[k]; r.Tenant == i {
			est += float64(r.Estimate())
			svc += r.Service().Seconds()
		}
	}
	if svc == 0 {
		return 0
	}
	return float64(w.Scenario.Slots) * est / svc
}
