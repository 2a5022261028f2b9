package degrade

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParseStep(t *testing.T) {
	tests := []struct {
		line string
		want Step
		// canon is String()'s form when it differs from line.
		canon string
	}{
		{line: "L1 trigger 0.70 recover 0.60 pause batch",
			want: Step{Name: "L1", Trigger: 0.70, Recover: 0.60, Action: Action{Kind: ActionPause, Class: "batch"}}},
		{line: "L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048",
			want: Step{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxInputTokens: 2048}}},
		{line: "L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048 max_tokens 256",
			want: Step{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxInputTokens: 2048, MaxTokens: 256}}},
		{line: "L2 trigger 0.85 recover 0.75 light_mode interactive max_tokens 256 max_input_tokens 2048",
			want:  Step{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxInputTokens: 2048, MaxTokens: 256}},
			canon: "L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048 max_tokens 256"},
		{line: "L2b trigger 0.86 recover 0.75 light_mode interactive max_tokens 128",
			want: Step{Name: "L2b", Trigger: 0.86, Recover: 0.75, Action: Action{Kind: ActionLightMode, Class: "interactive", MaxTokens: 128}}},
		{line: "L3 trigger 0.95 recover 0.90 throttle realtime 20/s",
			want: Step{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 20}}}},
		{line: "L3 trigger 0.95 recover 0.90 throttle realtime 1200/m",
			want:  Step{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 20}}},
			canon: "L3 trigger 0.95 recover 0.90 throttle realtime 20/s"},
		{line: "hot trigger 1.5 recover 1 throttle realtime 100tok/m",
			want:  Step{Name: "hot", Trigger: 1.5, Recover: 1, Action: Action{Kind: ActionThrottle, Class: "realtime", Rate: Rate{PerSecond: 100.0 / 60, Tokens: true}}},
			canon: "hot trigger 1.50 recover 1.00 throttle realtime 100tok/m"},
		{line: "x trigger 0.333 recover 0.3 pause batch",
			want:  Step{Name: "x", Trigger: 0.333, Recover: 0.3, Action: Action{Kind: ActionPause, Class: "batch"}},
			canon: "x trigger 0.333 recover 0.30 pause batch"},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			got, err := ParseStep(strings.Fields(tc.line))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseStep = %+v\nwant %+v", got, tc.want)
			}
			canon := tc.canon
			if canon == "" {
				canon = tc.line
			}
			if s := got.String(); s != canon {
				t.Fatalf("String() = %q, want %q", s, canon)
			}
			again, err := ParseStep(strings.Fields(got.String()))
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip: %+v, %v", again, err)
			}
			// JSON round trip.
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back Step
			if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, got) {
				t.Fatalf("JSON round trip of %s: %+v, %v", b, back, err)
			}
		})
	}
}

func TestStepJSON(t *testing.T) {
	s := designSteps()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"name":"L1","trigger":0.7,"recover":0.6,"action":{"kind":"pause","class":"batch"}},` +
		`{"name":"L2","trigger":0.85,"recover":0.75,"action":{"kind":"light_mode","class":"interactive","max_input_tokens":2048}},` +
		`{"name":"L3","trigger":0.95,"recover":0.9,"action":{"kind":"throttle","class":"realtime","rate":"20/s"}}]`
	if string(b) != want {
		t.Fatalf("JSON\n got %s\nwant %s", b, want)
	}
	var a Action
	if err := json.Unmarshal([]byte(`{"kind":"stop","class":"x"}`), &a); err == nil ||
		!strings.Contains(err.Error(), `unknown degrade action "stop" (want pause, light_mode or throttle)`) {
		t.Fatalf("bad kind: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"kind":"throttle","class":"x","rate":"20/h"}`), &a); err == nil ||
		!strings.Contains(err.Error(), `rate "20/h": unknown unit "/h"`) {
		t.Fatalf("bad rate: %v", err)
	}
	if _, err := json.Marshal(Action{Class: "x"}); err == nil {
		t.Fatal("marshalled a zero ActionKind")
	}
}

func TestParseStepErrors(t *testing.T) {
	tests := []struct {
		line string
		want string
	}{
		{"", "degrade step: missing step name"},
		{"L1", `degrade step L1: missing "trigger"`},
		{"L1 trig 0.70", `degrade step L1: expected "trigger", got "trig"`},
		{"L1 recover 0.60 trigger 0.70 pause batch", `degrade step L1: expected "trigger", got "recover"`},
		{"L1 trigger", `degrade step L1: missing value after "trigger"`},
		{"L1 trigger seventy recover 0.60 pause batch", `degrade step L1: trigger "seventy" must be a finite number > 0`},
		{"L1 trigger -0.7 recover 0.60 pause batch", `degrade step L1: trigger "-0.7" must be a finite number > 0`},
		{"L1 trigger NaN recover 0.60 pause batch", `degrade step L1: trigger "NaN" must be a finite number > 0`},
		{"L1 trigger 0.70", `degrade step L1: missing "recover"`},
		{"L1 trigger 0.70 pause batch", `degrade step L1: expected "recover", got "pause"`},
		{"L1 trigger 0.70 recover 0 pause batch", `degrade step L1: recover "0" must be a finite number > 0`},
		{"L1 trigger 0.70 recover 0.60", `degrade step L1: missing action after recover 0.60 (want pause, light_mode or throttle)`},
		{"L1 trigger 0.70 recover 0.60 stop batch", `degrade step L1: unknown action "stop" (want pause, light_mode or throttle)`},
		{"L1 trigger 0.70 recover 0.60 pause", `degrade step L1: pause: missing class`},
		{"L1 trigger 0.70 recover 0.60 pause batch now", `degrade step L1: unexpected token "now" after "trigger 0.70 recover 0.60 pause batch"`},
		{"L2 trigger 0.85 recover 0.90 pause batch", `degrade step L2: recover 0.90 must be below trigger 0.85`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive", `degrade step L2: light_mode interactive: needs max_input_tokens and/or max_tokens`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive max_input 2048", `degrade step L2: light_mode interactive: unknown option "max_input" (want max_input_tokens or max_tokens)`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens", `degrade step L2: light_mode interactive: missing value after max_input_tokens`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2k", `degrade step L2: light_mode interactive: max_input_tokens "2k" must be a positive integer`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive max_tokens 0", `degrade step L2: light_mode interactive: max_tokens "0" must be a positive integer`},
		{"L2 trigger 0.85 recover 0.75 light_mode interactive max_tokens 1 max_tokens 2", `degrade step L2: light_mode interactive: max_tokens given twice`},
		{"L3 trigger 0.95 recover 0.90 throttle realtime", `degrade step L3: throttle realtime: missing rate (e.g. 20/s, 1200/m, 5000tok/s, 100tok/m)`},
		{"L3 trigger 0.95 recover 0.90 throttle realtime 20/h", `degrade step L3: throttle realtime: rate "20/h": unknown unit "/h": ` + rateForms},
		{"L3 trigger 0.95 recover 0.90 throttle realtime 20", `degrade step L3: throttle realtime: rate "20": missing unit: ` + rateForms},
		{"L3 trigger 0.95 recover 0.90 throttle realtime 20/s burst", `degrade step L3: unexpected token "burst" after "trigger 0.95 recover 0.90 throttle realtime 20/s"`},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			s, err := ParseStep(strings.Fields(tc.line))
			if err == nil {
				t.Fatalf("ParseStep succeeded: %+v", s)
			}
			if err.Error() != tc.want {
				t.Fatalf("error\n got %q\nwant %q", err, tc.want)
			}
		})
	}
}

// FuzzParseStep: whatever ParseStep accepts, String prints back to the same
// step.
func FuzzParseStep(f *testing.F) {
	for _, s := range []string{
		"L1 trigger 0.70 recover 0.60 pause batch",
		"L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048 max_tokens 256",
		"L3 trigger 0.95 recover 0.90 throttle realtime 20/s",
		"L3 trigger 1e-3 recover 1e-4 throttle realtime 7tok/m",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		s, err := ParseStep(strings.Fields(line))
		if err != nil {
			return
		}
		back, err := ParseStep(strings.Fields(s.String()))
		if err != nil || !reflect.DeepEqual(back, s) {
			t.Fatalf("%q -> %q -> %+v, %v", line, s.String(), back, err)
		}
	})
}
