package simulator

import (
	"testing"
	"time"
)

// Every problem Validate finds names the scenario, the tenant (or phase,
// or health entry) and what is wrong, with the first problem reported.
func TestScenarioValidateNamesTheProblem(t *testing.T) {
	phases := func(ph ...Phase) Arrivals { return Arrivals{Kind: ArrivalPhases, Phases: ph} }
	for _, tc := range []struct {
		edit func(sc *Scenario)
		want string
	}{
		{func(sc *Scenario) { sc.Upstreams = 0 }, "scenario tiny: upstreams and slots must be positive"},
		{func(sc *Scenario) { sc.Slots = -1 }, "scenario tiny: upstreams and slots must be positive"},
		{func(sc *Scenario) { sc.Tenants = nil }, "scenario tiny: no tenants"},
		{func(sc *Scenario) { sc.Tenants[0].Name = "" }, `scenario tiny: tenant 0: empty or duplicate name ""`},
		{func(sc *Scenario) { sc.Tenants[1].Name = "x" }, `scenario tiny: tenant 1: empty or duplicate name "x"`},
		{func(sc *Scenario) { sc.Tenants[0].Weight = 0 }, "scenario tiny: tenant x: weight must be positive"},
		{func(sc *Scenario) { sc.Tenants[0].Class = "gold" }, `scenario tiny: tenant x: unknown class "gold"`},
		{func(sc *Scenario) { sc.Tenants[0].Prompt = constant(-1) }, "scenario tiny: tenant x: prompt: negative constant -1"},
		{func(sc *Scenario) { sc.Tenants[0].Prompt = uniform(5, 4) }, "scenario tiny: tenant x: prompt: bad uniform range [5, 4]"},
		{func(sc *Scenario) { sc.Tenants[0].MaxTokens = Dist{Kind: DistChoice} }, "scenario tiny: tenant x: max_tokens: empty choice"},
		{func(sc *Scenario) { sc.Tenants[0].MaxTokens = pareto(0, 10, 1) }, "scenario tiny: tenant x: max_tokens: bad pareto scale 0 shape 1"},
		{func(sc *Scenario) { sc.Tenants[0].MaxTokens = Dist{} }, "scenario tiny: tenant x: max_tokens: unknown distribution kind 0"},
		{func(sc *Scenario) { sc.Tenants[0].Arrivals.N = 0 }, "scenario tiny: tenant x: burst needs N > 0"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals.Interval = 0 }, "scenario tiny: tenant y: rate or interval must be positive"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals = Arrivals{Kind: ArrivalPoisson, End: time.Second} },
			"scenario tiny: tenant y: rate or interval must be positive"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals.End = 0 }, "scenario tiny: tenant y: needs End > Start or Alongside"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals = phases() }, "scenario tiny: tenant y: phases needs phases and no alongside"},
		{func(sc *Scenario) {
			sc.Tenants[1].Arrivals = phases(Phase{End: time.Second, Rate: 1})
			sc.Tenants[1].Arrivals.Alongside = "x"
		}, "scenario tiny: tenant y: phases needs phases and no alongside"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals = phases(Phase{End: time.Second}) },
			"scenario tiny: tenant y: phase 0: bad rate or span, or overlaps"},
		{func(sc *Scenario) {
			sc.Tenants[1].Arrivals = phases(Phase{Start: time.Second, End: time.Second, Rate: 1})
		},
			"scenario tiny: tenant y: phase 0: bad rate or span, or overlaps"},
		{func(sc *Scenario) {
			sc.Tenants[1].Arrivals = phases(Phase{End: 2 * time.Second, Rate: 1}, Phase{Start: time.Second, End: 3 * time.Second, Rate: 1})
		}, "scenario tiny: tenant y: phase 1: bad rate or span, or overlaps"},
		{func(sc *Scenario) {
			sc.Tenants[1].Arrivals = phases(Phase{End: time.Second, Rate: 1, MaxTokens: uniform(3, 1)})
		}, "scenario tiny: tenant y: phase 0: bad uniform range [3, 1]"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals = Arrivals{Kind: ArrivalBacklogged, Queue: 2} },
			"scenario tiny: tenant y: backlogged needs Queue > 0 and a scenario Duration"},
		{func(sc *Scenario) {
			sc.Duration = time.Minute
			sc.Tenants[1].Arrivals = Arrivals{Kind: ArrivalBacklogged}
		}, "scenario tiny: tenant y: backlogged needs Queue > 0 and a scenario Duration"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals.Kind = 0 }, "scenario tiny: tenant y: unknown arrival kind"},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals.Alongside = "nobody" }, `scenario tiny: tenant y: alongside unknown tenant "nobody"`},
		{func(sc *Scenario) { sc.Tenants[1].Arrivals.Alongside = "y" }, `scenario tiny: tenant y: alongside unknown tenant "y"`},
		{func(sc *Scenario) {
			sc.Duration = time.Minute
			sc.Tenants[0].Arrivals = Arrivals{Kind: ArrivalBacklogged, Queue: 2}
			sc.Tenants[1].Arrivals.Alongside = "x"
		}, `scenario tiny: tenant y: alongside "x" needs a plain open-loop tenant`},
		{func(sc *Scenario) {
			sc.Tenants = append(sc.Tenants, sc.Tenants[1])
			sc.Tenants[2].Name = "z"
			sc.Tenants[1].Arrivals.Alongside = "x"
			sc.Tenants[2].Arrivals.Alongside = "y"
		}, `scenario tiny: tenant z: alongside "y" needs a plain open-loop tenant`},
		{func(sc *Scenario) { sc.Health = []HealthChange{{At: time.Second, Healthy: 2}} },
			"scenario tiny: health timeline entry 0 out of order or range"},
		{func(sc *Scenario) { sc.Health = []HealthChange{{At: time.Second}, {At: 0, Healthy: 1}} },
			"scenario tiny: health timeline entry 1 out of order or range"},
		{func(sc *Scenario) {
			// The first problem wins: a tenant's before the health timeline's.
			sc.Tenants[1].Arrivals.Alongside = "nobody"
			sc.Health = []HealthChange{{Healthy: -1}}
		}, `scenario tiny: tenant y: alongside unknown tenant "nobody"`},
	} {
		sc := tiny()
		tc.edit(sc)
		err := sc.Validate()
		if err == nil || err.Error() != tc.want {
			t.Errorf("Validate() = %v\nwant %s", err, tc.want)
		}
	}
	sc := tiny()
	sc.Health = []HealthChange{{At: time.Second, Healthy: 0}, {At: time.Second, Healthy: 1}}
	sc.Tenants[1].Arrivals = Arrivals{Kind: ArrivalPoisson, Rate: 1, Alongside: "x"}
	if err := sc.Validate(); err != nil {
		t.Errorf("valid scenario: %v", err)
	}
}
