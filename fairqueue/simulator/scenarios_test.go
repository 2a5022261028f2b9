package simulator

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The seed scenarios are run once per test binary (every policy, seed 1)
// and shared by the tests that assert on them, so -race stays cheap.
var (
	cacheMu sync.Mutex
	cache   = map[string]map[string]*Result{}
)

func runScenario(t testing.TB, name string, policies ...Policy) map[string]*Result {
	t.Helper()
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if len(policies) == 0 {
		if r, ok := cache[name]; ok {
			return r
		}
		policies = Policies()
	}
	out, _ := runSeed(t, name, 1, policies)
	if len(policies) == len(Policies()) {
		cache[name] = out
	}
	return out
}

// logTables prints every policy's table (go test -v shows them) and fails
// on any scheduler invariant violation.
func logTables(t *testing.T, results map[string]*Result) {
	t.Helper()
	for _, p := range Policies() {
		res, ok := results[p.Name()]
		if !ok {
			continue
		}
		t.Logf("\n%s", res)
		if res.ViolationCount > 0 {
			t.Errorf("%s/%s: %d invariant violations: %s", res.Scenario.Name, res.Policy,
				res.ViolationCount, strings.Join(res.Violations, "; "))
		}
	}
}

// relDiff is |a-b| / b.
func relDiff(a, b float64) float64 { return math.Abs(a-b) / b }

func TestSeed000(t *testing.T) {
	r := runScenario(t, "seed000")
	logTables(t, r)
	wfq, pri, fifo := r["wfq-tokens"], r["priority"], r["fifo"]

	// The sparse realtime and interactive tenants wait about as little as
	// under strict priority, which starves the batch tenant to get there.
	// One run holds only ~160 cs_bot requests, so its P95 is the 8th worst
	// wait and swings by ±15% from seed to seed under either policy; the
	// comparison pools five independent replications (seeds 1-5), both
	// policies replaying exactly the same requests in each.
	wfqP95, priP95 := pooledP95(t, "seed000", "wfq-tokens"), pooledP95(t, "seed000", "priority")
	for _, name := range []string{"marketing", "cs_bot"} {
		got, base := wfqP95[name], priP95[name]
		t.Logf("%s P95 wait over seeds 1-5: wfq-tokens %v, priority %v (%.2fx)", name, got, base,
			float64(got)/float64(base))
		if float64(got) > 1.1*float64(base) {
			t.Errorf("%s P95 wait %v under wfq-tokens > 1.1 x %v under priority", name, got, base)
		}
		if f := fifo.Row(name).WaitP95; f < 100*time.Second {
			t.Errorf("%s P95 wait under fifo is %v, want hundreds of seconds", name, f)
		}
	}
	_ = pri

	// Fairness costs the flood nothing but the others' own work. Under FIFO
	// the flood (all in by 5 s) runs before everything the other tenants
	// send later, so FIFO's data_batch makespan is shorter than any policy
	// that serves them first can reach, by their work / capacity (about
	// 30 s, 3%). The bound is therefore against the time FIFO takes to
	// drain all the work, which no work-conserving policy can beat.
	batch := wfq.Row("data_batch").Makespan
	if d := relDiff(float64(batch), float64(fifo.Overall.Makespan)); d > 0.01 {
		t.Errorf("data_batch makespan %v under wfq-tokens vs %v for fifo to drain everything: %.2f%% > 1%%",
			batch, fifo.Overall.Makespan, 100*d)
	}
	t.Logf("data_batch makespan: wfq-tokens %v, fifo %v (%.2f%% longer; the others' work is %v of capacity)",
		batch, fifo.Row("data_batch").Makespan,
		100*(float64(batch)/float64(fifo.Row("data_batch").Makespan)-1), otherWork(wfq, "data_batch"))
	if d := relDiff(wfq.Overall.TokPerSec, fifo.Overall.TokPerSec); d > 0.01 {
		t.Errorf("overall tok/s %.0f under wfq-tokens vs %.0f under fifo: %.2f%% > 1%%",
			wfq.Overall.TokPerSec, fifo.Overall.TokPerSec, 100*d)
	}
}

// otherWork is the service time of every tenant but one, over capacity.
func otherWork(res *Result, but string) time.Duration {
	var d time.Duration
	for id := range res.Requests {
		r := &res.Requests[id]
		if res.Scenario.Tenants[r.Tenant].Name != but {
			d += r.Service()
		}
	}
	return d / time.Duration(res.Scenario.Capacity())
}

func TestSeed002(t *testing.T) {
	r := runScenario(t, "seed002")
	logTables(t, r)
	wfq, fifo := r["wfq-tokens"], r["fifo"]

	// B starts as soon as a slot frees. The plain slot-free limit is out of
	// reach for any scheduler here (strict priority, the best B can get,
	// meets it for about 77%: B's requests pile up behind one another when
	// completions cluster), so the bound uses the in-order limit.
	b := wfq.Row("B")
	if b.AtOrderLimit < 0.99 {
		pb := r["priority"].Row("B")
		t.Errorf("engine policy: B started at its in-order slot-free limit for %.1f%% of requests under "+
			"wfq-tokens, want >= 99%% (priority: %.1f%%); P95 wait %v vs %v under priority",
			100*b.AtOrderLimit, 100*pb.AtOrderLimit, b.WaitP95, pb.WaitP95)
	}
	// As in seed000, FIFO runs all of A before B's later requests; the bound
	// is against FIFO's time to drain all the work.
	a := wfq.Row("A").Makespan
	if d := relDiff(float64(a), float64(fifo.Overall.Makespan)); d > 0.01 {
		t.Errorf("A makespan %v under wfq-tokens vs %v for fifo to drain everything: %.2f%% > 1%%",
			a, fifo.Overall.Makespan, 100*d)
	}
	t.Logf("A makespan: wfq-tokens %v, fifo %v (%.2f%% longer; B's work is %v of capacity)",
		a, fifo.Row("A").Makespan, 100*(float64(a)/float64(fifo.Row("A").Makespan)-1), otherWork(wfq, "A"))
	if d := relDiff(wfq.Overall.TokPerSec, fifo.Overall.TokPerSec); d > 0.01 {
		t.Errorf("overall tok/s %.0f under wfq-tokens vs %.0f under fifo: %.2f%% > 1%%",
			wfq.Overall.TokPerSec, fifo.Overall.TokPerSec, 100*d)
	}
	// B keeps arriving for as long as A is backlogged, under every policy.
	for name, res := range r {
		var lastB, lastA time.Duration
		for id := range res.Requests {
			req, rec := &res.Requests[id], &res.Records[id]
			if req.Tenant == 1 {
				lastB = max(lastB, req.Arrival)
			} else {
				lastA = max(lastA, rec.Dispatch)
			}
		}
		if lastB+time.Second <= lastA {
			t.Errorf("%s: B's last arrival %v, but A was backlogged until %v", name, lastB, lastA)
		}
	}
}

func TestWeights(t *testing.T) {
	r := runScenario(t, "weights")
	logTables(t, r)
	for _, name := range []string{"wfq-tokens", "drr-requests"} {
		res := r[name]
		sc := res.Scenario
		served := res.ServedBetween(0, sc.Duration)
		var total, wsum float64
		for i, s := range served {
			total += s
			wsum += sc.Tenants[i].Weight
		}
		for i, s := range served {
			share, want := s/total, sc.Tenants[i].Weight/wsum
			d := relDiff(share, want)
			t.Logf("%s: %s actual-token share %.4f, weighted share %.4f (%.2f%% off)",
				name, sc.Tenants[i].Name, share, want, 100*d)
			if name == "wfq-tokens" && d > 0.01 {
				t.Errorf("%s: %s share %.4f, want %.4f within 1%%", name, sc.Tenants[i].Name, share, want)
			}
		}
	}
	// The VTC bound between the two backlogged weight-30 tenants.
	o := r["wfq-tokens"].Overall
	if o.MaxDiff > 2*float64(o.MaxCost) {
		t.Errorf("max service difference %.0f tokens > 2 x largest request %d", o.MaxDiff, o.MaxCost)
	}
}

// TestMany runs the 1000-tenant scenario end to end. Under -race or -short
// it runs only wfq-tokens; it asserts correctness, never timing.
func TestMany(t *testing.T) {
	var r map[string]*Result
	if raceEnabled || testing.Short() {
		p, _ := PolicyByName("wfq-tokens")
		r = runScenario(t, "many", p)
	} else {
		r = runScenario(t, "many")
	}
	logTables(t, r)
	for name, res := range r {
		if n := len(res.Requests); n < 95000 || n > 105000 {
			t.Errorf("%s: %d requests, want about 100k", name, n)
		}
		for id := range res.Records {
			if res.Records[id].State != StateCompleted {
				t.Fatalf("%s: request %d ended in state %d", name, id, res.Records[id].State)
			}
		}
	}
}

func TestOutage(t *testing.T) {
	r := runScenario(t, "outage")
	logTables(t, r)
	for name, res := range r {
		// Capacity is 16 from 60 s to 120 s: the simulator's invariant
		// check (logTables) already fails on a dispatch above it; here the
		// reduction must also be visible in the records.
		inflightAt := func(at time.Duration) int {
			n := 0
			for id := range res.Records {
				rec := &res.Records[id]
				if rec.State == StateCompleted && rec.Dispatch <= at && at < rec.Complete {
					n++
				}
			}
			return n
		}
		if n := inflightAt(50 * time.Second); n != 32 {
			t.Errorf("%s: %d in flight at 50 s, want 32", name, n)
		}
		// Requests dispatched before 60 s finish within ~8 s.
		if n := inflightAt(90 * time.Second); n != 16 {
			t.Errorf("%s: %d in flight at 90 s, want 16", name, n)
		}
		if n := inflightAt(130 * time.Second); n != 32 {
			t.Errorf("%s: %d in flight at 130 s, want 32", name, n)
		}
	}
}

// pooledP95 runs scenario under one policy for seeds 1-5 and returns each
// tenant's P95 wait over all dispatched requests of the five runs.
func pooledP95(t *testing.T, scenario, policy string) map[string]time.Duration {
	t.Helper()
	p, ok := PolicyByName(policy)
	if !ok {
		t.Fatalf("no policy %q", policy)
	}
	waits := map[string][]time.Duration{}
	for seed := uint64(1); seed <= 5; seed++ {
		_, list := runSeed(t, scenario, seed, []Policy{p})
		res, sc := list[0], list[0].Scenario
		for i := range res.Requests {
			r, rec := &res.Requests[i], &res.Records[i]
			if rec.State != StateCompleted {
				continue
			}
			name := sc.Tenants[r.Tenant].Name
			waits[name] = append(waits[name], rec.Wait(r))
		}
	}
	out := map[string]time.Duration{}
	for name, ws := range waits {
		slices.Sort(ws)
		out[name] = percentile(ws, 0.95)
	}
	return out
}

// runSeed generates scenario name's requests for one seed and runs them
// under each policy: the results by policy name, and in policy order.
func runSeed(t testing.TB, name string, seed uint64, policies []Policy) (map[string]*Result, []*Result) {
	t.Helper()
	sc, ok := Lookup(name)
	if !ok {
		t.Fatalf("no scenario %q", name)
	}
	w, err := Generate(sc, seed)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*Result{}
	var list []*Result
	for _, p := range policies {
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Name()] = res
		list = append(list, res)
	}
	return out, list
}

// ServedBetween returns, per tenant, the actual tokens served in [from, to):
// each request's actual cost is spread evenly over its service time, so a
// request cut by the window counts in proportion.
func (res *Result) ServedBetween(from, to time.Duration) []float64 {
	out := make([]float64, len(res.Scenario.Tenants))
	for id := range res.Requests {
		rec := &res.Records[id]
		if rec.State != StateCompleted {
			continue
		}
		lo, hi := max(rec.Dispatch, from), min(rec.Complete, to)
		if hi <= lo {
			continue
		}
		r := &res.Requests[id]
		out[r.Tenant] += float64(r.Actual()) * float64(hi-lo) / float64(rec.Complete-rec.Dispatch)
	}
	return out
}
