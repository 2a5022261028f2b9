package simulator

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// TestPeak drives the degrade ladder through three waves of load (water
// about 0.75, 0.90, 0.97) and checks that each level engages and releases
// in order, once per wave, that realtime keeps its budget throughout, and
// that the ladder is back at L0 on its own.
func TestPeak(t *testing.T) {
	sc, _ := Lookup("peak")
	w, err := Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := PolicyByName(WFQBudgets)
	res, err := Run(w, p)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	res.Format(&b)
	b.WriteString("\n")
	FormatTimeline(&b, res, 5*time.Second)
	t.Logf("\n%s", b.String())
	if res.ViolationCount > 0 {
		t.Errorf("%d invariant violations: %s", res.ViolationCount, strings.Join(res.Violations, "; "))
	}

	// Each wave walks up to its level and back down, one step at a time,
	// every step moving once each way: no flapping.
	want := [][]string{
		{"+L1", "-L1"},
		{"+L1", "+L2", "-L2", "-L1"},
		{"+L1", "+L2", "+L3", "-L3", "-L2", "-L1"},
	}
	peaks := [][2]float64{{0.70, 0.85}, {0.85, 0.95}, {0.95, 1.0}}
	eps := res.Episodes()
	if len(eps) != len(want) {
		t.Fatalf("%d waves, want %d", len(eps), len(want))
	}
	total := 0
	for i, e := range eps {
		var got []string
		for _, tr := range e.Transitions {
			sign := "-"
			if tr.Up {
				sign = "+"
			}
			got = append(got, sign+tr.Step)
		}
		total += len(got)
		if strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("wave %d: transitions %v, want %v", i+1, got, want[i])
		}
		if e.Peak <= peaks[i][0] || e.Peak >= peaks[i][1] {
			t.Errorf("wave %d: peak water %.3f, want in (%.2f, %.2f)", i+1, e.Peak, peaks[i][0], peaks[i][1])
		}
	}
	if total != len(res.Transitions) {
		t.Errorf("%d transitions in all, %d within the waves", len(res.Transitions), total)
	}
	// Back at L0 after the peak, by itself.
	if l := res.LevelAt(math.MaxInt64); l != 0 {
		t.Errorf("ladder at L%d after the peak, want L0", l)
	}
	if n := len(res.Timeline); n == 0 || res.Timeline[n-1].Level != 0 {
		t.Error("the timeline does not end at L0")
	}

	// Realtime keeps its budget throughout: overall, at every level at
	// arrival, and in every wave.
	for lvl, o := range res.ClassByLevel("realtime") {
		if o.N > 0 && o.MetFraction() < 0.99 {
			t.Errorf("realtime met its budget for %.2f%% of the %d requests arriving at L%d, want >= 99%%",
				100*o.MetFraction(), o.N, lvl)
		}
	}
	for i, e := range eps {
		n, met := 0, 0
		for id := range res.Requests {
			r, rec := &res.Requests[id], &res.Records[id]
			if sc.Tenants[r.Tenant].Class != "realtime" || r.Arrival < e.From || r.Arrival > e.To {
				continue
			}
			n++
			if rec.State == StateCompleted && rec.Wait(r) <= sc.Budget(r.Tenant) {
				met++
			}
		}
		if f := frac(met, n); !(f >= 0.99) {
			t.Errorf("wave %d: realtime met its budget for %d of %d requests, want >= 99%%", i+1, met, n)
		}
	}
	if row := res.Row("marketing"); row.MetBudget < 0.99 {
		t.Errorf("marketing met its budget for %.2f%%, want >= 99%%", 100*row.MetBudget)
	}

	// Light mode trims interactive requests exactly while L2 holds, and
	// the throttle's refusals are counted (realtime sends 2/s here, far
	// below 20/s, so there are none).
	light := 0
	for id := range res.Requests {
		r, rec := &res.Requests[id], &res.Records[id]
		if !rec.Light {
			continue
		}
		light++
		if sc.Tenants[r.Tenant].Class != "interactive" || res.LevelAt(r.Arrival) < 2 || r.Prompt > 2048 {
			t.Errorf("request %d trimmed at L%d: class %s, prompt %d", id, res.LevelAt(r.Arrival),
				sc.Tenants[r.Tenant].Class, r.Prompt)
		}
	}
	if light == 0 {
		t.Error("no interactive request was trimmed while L2 held")
	}
	throttled, full := 0, 0
	for id := range res.Records {
		switch res.Records[id].Reason {
		case fairqueue.ReasonClassThrottled:
			throttled++
		case fairqueue.ReasonQueueFull:
			full++
		}
	}
	t.Logf("light mode trimmed %d requests; %d refused class_throttled, %d queue_full", light, throttled, full)
	if full != 0 {
		t.Errorf("%d requests refused queue_full: the third wave should stay below max_queue", full)
	}
}
