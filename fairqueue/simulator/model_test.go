package simulator

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestServiceTime(t *testing.T) {
	r := Request{Prompt: 1000, MaxTokens: 200, Output: 100}
	if got, want := r.Service(), 30*time.Millisecond+50*time.Millisecond+1500*time.Millisecond; got != want {
		t.Errorf("service %v, want %v", got, want)
	}
	if r.Estimate() != 1200 || r.Actual() != 1100 {
		t.Errorf("estimate %d actual %d", r.Estimate(), r.Actual())
	}
}

// tiny is one upstream with one slot, three requests of 1.58 s to 3.08 s
// at t=0 from tenant x, and one short request from tenant y at 0.5 s.
func tiny() *Scenario {
	return &Scenario{
		Name: "tiny", Upstreams: 1, Slots: 1, Classes: defaultClasses,
		Tenants: []TenantSpec{
			{Name: "x", Weight: 1, Class: "batch", Arrivals: Arrivals{Kind: ArrivalBurst, N: 3},
				Prompt: constant(1000), MaxTokens: constant(200)},
			{Name: "y", Weight: 1, Class: "realtime",
				Arrivals: Arrivals{Kind: ArrivalPeriodic, Interval: time.Hour, Start: time.Second / 2, End: time.Second},
				Prompt:   constant(100), MaxTokens: constant(10)},
		},
	}
}

func TestSlotModel(t *testing.T) {
	w, err := Generate(tiny(), 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 4 {
		t.Fatalf("%d requests, want 4", len(w.Requests))
	}
	for _, p := range Policies() {
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.ViolationCount > 0 {
			t.Fatalf("%s: %v", p.Name(), res.Violations)
		}
		x0, x1, x2, y := &res.Requests[0], &res.Requests[1], &res.Requests[2], &res.Requests[3]
		r0, r1, r2, ry := &res.Records[0], &res.Records[1], &res.Records[2], &res.Records[3]
		// x0 starts at once and holds the only slot for its service time.
		if r0.Dispatch != 0 || r0.Complete != x0.Service() || r0.Limit != 0 || r0.OrderLimit != 0 {
			t.Errorf("%s: x0 %+v", p.Name(), *r0)
		}
		// x1 and x2 find the slot busy: the next slot frees when x0 ends;
		// x2 also has x1 ahead of it, so its in-order limit is one more.
		if r1.Limit != x0.Service() || r1.OrderLimit != x0.Service() {
			t.Errorf("%s: x1 limits %v %v, want %v", p.Name(), r1.Limit, r1.OrderLimit, x0.Service())
		}
		if r2.Limit != x0.Service() {
			t.Errorf("%s: x2 limit %v, want %v", p.Name(), r2.Limit, x0.Service())
		}
		// y arrives at 0.5 s during x0. priority, drr-requests and
		// wfq-tokens serve it at the next free slot (its class, or its
		// smaller finish tag: y was lifted to the start tag of x0 while x's
		// next request starts after x0) and fifo serves it last.
		if ry.Limit != x0.Service()-y.Arrival {
			t.Errorf("%s: y limit %v", p.Name(), ry.Limit)
		}
		s0, s1, s2, sy := x0.Service(), x1.Service(), x2.Service(), y.Service()
		var want []time.Duration // dispatch of y, x1, x2
		switch p.Name() {
		case "fifo":
			want = []time.Duration{s0 + s1 + s2, s0, s0 + s1}
		default:
			want = []time.Duration{s0, s0 + sy, s0 + sy + s1}
		}
		got := []time.Duration{ry.Dispatch, r1.Dispatch, r2.Dispatch}
		if !reflect.DeepEqual(got, want) {
			msg := ""
			if p.Name() == "wfq-tokens" {
				msg = " (engine policy: x0's completion back-fills x's virtual time below the " +
					"value y was lifted to on arrival, so x1 wins the freed slot)"
			}
			t.Errorf("%s: dispatch y, x1, x2 at %v, want %v%s", p.Name(), got, want, msg)
		}
		if r2.Complete != r2.Dispatch+x2.Service() {
			t.Errorf("%s: x2 completes at %v", p.Name(), r2.Complete)
		}
	}
}

func TestHealthTimeline(t *testing.T) {
	// Three requests of 7.5 s to 15 s at t=0; one of two upstreams healthy
	// until 5 s.
	sc := &Scenario{
		Name: "health", Upstreams: 2, Slots: 1, Classes: defaultClasses,
		Health: []HealthChange{{At: 0, Healthy: 1}, {At: 5 * time.Second, Healthy: 2}},
		Tenants: []TenantSpec{{Name: "x", Weight: 1, Class: "batch",
			Arrivals: Arrivals{Kind: ArrivalBurst, N: 3}, Prompt: constant(0), MaxTokens: constant(1000)}},
	}
	w, err := Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Policies() {
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.ViolationCount > 0 {
			t.Fatalf("%s: %v", p.Name(), res.Violations)
		}
		r0, r1, r2 := &res.Records[0], &res.Records[1], &res.Records[2]
		// The raise at 5 s is the first slot to free after x1 and x2
		// arrive; x1 takes it. x2's in-order limit is the next one: x0's end.
		if r0.Dispatch != 0 || r1.Dispatch != 5*time.Second || r1.Limit != 5*time.Second ||
			r2.Limit != 5*time.Second || r2.OrderLimit != r0.Complete {
			t.Errorf("%s: x0 %+v, x1 %+v, x2 %+v", p.Name(), *r0, *r1, *r2)
		}
		if r2.Dispatch != min(r0.Complete, r1.Complete) {
			t.Errorf("%s: x2 dispatched at %v", p.Name(), r2.Dispatch)
		}
	}
}

func TestBudgetsExpire(t *testing.T) {
	sc := tiny()
	sc.EnforceBudgets = true
	sc.Classes = []Class{{Name: "realtime", Budget: 10 * time.Second}, {Name: "interactive"}, {Name: "batch", Budget: time.Second}}
	w, err := Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Policies() {
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.ViolationCount > 0 {
			t.Fatalf("%s: %v", p.Name(), res.Violations)
		}
		// x1 and x2 (batch, 1 s budget) cannot start before x0 ends (at
		// 1.58 s or later); a tick expires them ExpiryMargin before the
		// deadline.
		if res.Overall.Expired != 2 {
			t.Errorf("%s: %d expired, want 2", p.Name(), res.Overall.Expired)
		}
		for _, id := range []int{1, 2} {
			rec := &res.Records[id]
			if rec.State != StateExpired || rec.Left > time.Second {
				t.Errorf("%s: request %d state %d left at %v", p.Name(), id, rec.State, rec.Left)
			}
		}
		if rec := &res.Records[3]; rec.State != StateCompleted {
			t.Errorf("%s: y state %d", p.Name(), rec.State)
		}
	}
}

func TestDeterministic(t *testing.T) {
	sc, _ := Lookup("seed002")
	w1, _ := Generate(sc, 3)
	w2, _ := Generate(sc, 3)
	w3, _ := Generate(sc, 4)
	if !reflect.DeepEqual(w1.Requests, w2.Requests) {
		t.Fatal("same seed, different workloads")
	}
	if reflect.DeepEqual(w1.Requests[:100], w3.Requests[:100]) {
		t.Fatal("different seeds, same workload")
	}
	p, _ := PolicyByName("wfq-tokens")
	a, _ := Run(w1, p)
	b, _ := Run(w1, p)
	if !reflect.DeepEqual(a.Records, b.Records) || a.String() != b.String() {
		t.Fatal("same workload and policy, different runs")
	}
}

func TestClosedLoopKeepsQueue(t *testing.T) {
	sc := Weights()
	sc.Duration = 5 * time.Minute
	w, err := Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := PolicyByName("wfq-tokens")
	res, err := Run(w, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Duration{time.Second + 1, time.Minute + 1, 4*time.Minute + 1} {
		queued := make([]int, len(sc.Tenants))
		for id := range res.Requests {
			r, rec := &res.Requests[id], &res.Records[id]
			if r.Arrival <= at && at < rec.Left {
				queued[r.Tenant]++
			}
		}
		for i, n := range queued {
			if n != 50 {
				t.Errorf("%v: %s has %d queued, want 50", at, sc.Tenants[i].Name, n)
			}
		}
	}
	// Same tenant, same k-th request in another policy's run.
	q, _ := PolicyByName("fifo")
	res2, _ := Run(w, q)
	first := func(res *Result, tenant, k int) Request {
		for id := range res.Requests {
			if r := res.Requests[id]; r.Tenant == tenant {
				if k == 0 {
					return r
				}
				k--
			}
		}
		t.Fatal("not enough requests")
		return Request{}
	}
	a, b := first(res, 1, 120), first(res2, 1, 120)
	if a.Prompt != b.Prompt || a.MaxTokens != b.MaxTokens || a.Output != b.Output {
		t.Errorf("beta's 120th request differs between policies: %+v vs %+v", a, b)
	}
}

func TestWaterfill(t *testing.T) {
	demand := []float64{1, 10, 10}
	weight := []float64{1, 1, 2}
	fair := make([]float64, 3)
	waterfill(demand, weight, 9, fair, make([]int, 3))
	want := []float64{1, 8.0 / 3, 16.0 / 3}
	for i := range want {
		if math.Abs(fair[i]-want[i]) > 1e-9 {
			t.Fatalf("fair %v, want %v", fair, want)
		}
	}
	// Enough capacity for everybody: everybody gets its demand.
	waterfill(demand, weight, 21, fair, make([]int, 3))
	if !reflect.DeepEqual(fair, demand) {
		t.Fatalf("fair %v, want %v", fair, demand)
	}
}

func TestPercentile(t *testing.T) {
	v := make([]time.Duration, 100)
	for i := range v {
		v[i] = time.Duration(i + 1)
	}
	if percentile(v, 0.95) != 95 || percentile(v, 0.5) != 50 || percentile(v, 0.99) != 99 {
		t.Fatal("nearest-rank percentile")
	}
}

func TestScenariosValid(t *testing.T) {
	for _, n := range Names() {
		sc, _ := Lookup(n)
		if err := sc.Validate(); err != nil {
			t.Error(err)
		}
	}
	bad := tiny()
	bad.Tenants[1].Arrivals.Alongside = "nobody"
	if bad.Validate() == nil {
		t.Error("alongside an unknown tenant validated")
	}
}

// BenchmarkMany runs the 1000-tenant, 100k-request scenario end to end
// (generation and every policy) and reports the wall time of a run.
func BenchmarkMany(b *testing.B) {
	sc, _ := Lookup("many")
	start := time.Now()
	var reqs int
	for b.Loop() {
		w, err := Generate(sc, 1)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range Policies() {
			res, err := Run(w, p)
			if err != nil {
				b.Fatal(err)
			}
			reqs += len(res.Requests)
		}
	}
	wall := time.Since(start).Seconds()
	b.ReportMetric(wall/float64(b.N), "wall-s/run")
	b.ReportMetric(float64(reqs)/wall, "sim-requests/s")
}

// String returns Format's output.
func (res *Result) String() string {
	var b strings.Builder
	res.Format(&b)
	return b.String()
}
