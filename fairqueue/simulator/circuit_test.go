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
		shed, back := evs[0].At.Sub(epoch), evs[1].At.Sub(epoch)
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
