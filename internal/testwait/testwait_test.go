package testwait

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for v, want := range map[string]float64{"": 1, "1": 1, "2.5": 2.5, "1000": 1000} {
		if got, err := Parse(v); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"0", "0.5", "-2", "x", "NaN", "Inf", "1001"} {
		if got, err := Parse(v); err == nil || !strings.Contains(err.Error(), Env) {
			t.Errorf("Parse(%q) = %v, %v; want an error naming %s", v, got, err, Env)
		}
	}
}
