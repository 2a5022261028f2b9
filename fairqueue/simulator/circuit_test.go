package simulator

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// TestCircuit: at 1.5x capacity the circuit sheds low, and only low (what
// is left, 0.9x, fits under the trigger), never high; the refusals are
// low's alone; when demand falls to 0.8x, low is readmitted once, within
// the window plus the hold; nothing flaps. Seeds 1-3.
func TestCircuit(t *testing.T) {
	p, _ := PolicyByName("wfq-tokens")
	for seed := uint64(1); seed <= 3; seed++ {
		w, err := Generate(Circuit(), seed)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		evs := res.CircuitEvents
		if len(evs) != 2 || !evs[0].Up || evs[0].Tier != "low" || evs[1].Up || evs[1].Tier != "low" {
			var got []string
			for _, e := range evs {
				got = append(got, e.String())
			}
			t.Fatalf("seed %d: transitions %q, want exactly [shed low, readmit low]", seed, got)
		}
		shed, back := evs[0].At.Sub(Epoch), evs[1].At.Sub(Epoch)
		// The window must fill (10 s) and capacity be measured first.
		if shed > 12*time.Second {
			t.Errorf("seed %d: low shed at %v, want within 12 s of the overload (the window fills at 1.3/1.5 of 10 s)", seed, shed)
		}
		if back < CircuitOverloadEnd || back > CircuitOverloadEnd+12*time.Second {
			t.Errorf("seed %d: low readmitted at %v, want within 12 s of %v (the would-be ratio falls under 1.0 after 0.71 of the window)", seed, back, CircuitOverloadEnd)
		}
		if evs[0].Ratio <= 1.3 || len(evs[0].Callers) != 2 {
			t.Errorf("seed %d: shed event %v with callers %+v, want ratio > 1.3 naming low_a and low_b", seed, evs[0], evs[0].Callers)
		}
		refused := map[string]int{}
		for i, rec := range res.Records {
			if rec.Reason == fairqueue.ReasonCircuitOpen {
				refused[res.Scenario.Tenants[res.Requests[i].Tenant].Tier]++
			}
		}
		if refused["mid"] != 0 || refused["high"] != 0 || refused["low"] == 0 {
			t.Errorf("seed %d: circuit_open refusals by tier %v, want low's only", seed, refused)
		}
		t.Logf("seed %d: shed low at %v (%.3fx), readmitted at %v; refused %d low requests; callers %+v",
			seed, shed.Round(time.Millisecond), evs[0].Ratio, back.Round(time.Millisecond), refused["low"], evs[0].Callers)
	}
}

// TestCircuitMixShift: while low's requests turn into long documents with
// short answers (7x the tokens that chat was served at, half the slots'
// time) nothing is shed; a real 1.5x overload of the new mix sheds low
// within the window and a tenth (the window fills and the slots are
// saturated for 90% of it), never high; at 0.8x low is readmitted as
// fast. Exactly two transitions, low's refusals only between them, and
// the shed names the slots' busy time as the binding resource with the
// slots saturated. Seeds 1-3.
func TestCircuitMixShift(t *testing.T) {
	p, _ := PolicyByName("wfq-tokens")
	sc := CircuitMix()
	lag := sc.Circuit.Window + sc.Circuit.Window/10
	for seed := uint64(1); seed <= 3; seed++ {
		w, err := Generate(sc, seed)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		evs := res.CircuitEvents
		var got []string
		for _, e := range evs {
			got = append(got, e.String())
		}
		if len(evs) != 2 || !evs[0].Up || evs[0].Tier != "low" || evs[1].Up || evs[1].Tier != "low" {
			t.Fatalf("seed %d: transitions %q, want exactly [shed low, readmit low]", seed, got)
		}
		shed, back := evs[0].At.Sub(Epoch), evs[1].At.Sub(Epoch)
		if shed <= CircuitMixOverload || shed > CircuitMixOverload+lag {
			t.Errorf("seed %d: low shed at %v, want within %v of the overload at %v", seed, shed, lag, CircuitMixOverload)
		}
		if back <= CircuitMixCalm || back > CircuitMixCalm+lag {
			t.Errorf("seed %d: low readmitted at %v, want within %v of %v", seed, back, lag, CircuitMixCalm)
		}
		if e := evs[0]; e.Resource != fairqueue.ResourceSlots || e.Ratio <= 1.3 || e.Saturation < 0.9 || e.BacklogTrend <= 0 {
			t.Errorf("seed %d: shed %v (backlog trend %.1f/s), want the slots' demand over 1.3x, saturated >= 90%%, the backlog growing", seed, e, e.BacklogTrend)
		}
		for i, rec := range res.Records {
			if rec.Reason != fairqueue.ReasonCircuitOpen {
				continue
			}
			q := res.Requests[i]
			if name := res.Scenario.Tenants[q.Tenant].Name; name != "low" || q.Arrival < shed || q.Arrival > back {
				t.Fatalf("seed %d: %s's request at %v answered circuit_open outside [%v, %v]", seed, name, q.Arrival, shed, back)
			}
		}
		t.Logf("seed %d: %q at %v and %v", seed, got, shed, back)
	}
}
