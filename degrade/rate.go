package degrade

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Rate is a throttle rate: PerSecond requests per second, or, when Tokens is
// set, PerSecond estimated tokens per second. A valid Rate has a finite
// PerSecond > 0.
type Rate struct {
	PerSecond float64
	Tokens    bool
}

// rateForms is quoted by every ParseRate error.
const rateForms = "want <n>/s, <n>/m, <n>tok/s or <n>tok/m, e.g. 20/s, 1200/m, 5000tok/s, 100tok/m"

// ParseRate parses a throttle rate: "<n>/s" or "<n>/m" (requests per second
// or per minute) and "<n>tok/s" or "<n>tok/m" (estimated tokens). n is a
// positive decimal number.
func ParseRate(s string) (Rate, error) {
	num, unit, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: missing unit: %s", s, rateForms)
	}
	var per float64
	switch unit {
	case "s":
		per = 1
	case "m":
		per = 60
	default:
		return Rate{}, fmt.Errorf("rate %q: unknown unit %q: %s", s, "/"+unit, rateForms)
	}
	var r Rate
	if n, found := strings.CutSuffix(num, "tok"); found {
		num, r.Tokens = n, true
	}
	if num == "" {
		return Rate{}, fmt.Errorf("rate %q: missing number: %s", s, rateForms)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return Rate{}, fmt.Errorf("rate %q: %q is not a number: %s", s, num, rateForms)
	}
	if v <= 0 {
		return Rate{}, fmt.Errorf("rate %q: must be positive", s)
	}
	r.PerSecond = v / per
	if r.PerSecond <= 0 || math.IsInf(r.PerSecond, 0) {
		return Rate{}, fmt.Errorf("rate %q: out of range", s)
	}
	return r, nil
}

// String formats r so that ParseRate(r.String()) == r, in the shorter of
// the per-second and the exact per-minute form ("20/s", "100tok/m").
func (r Rate) String() string {
	unit := ""
	if r.Tokens {
		unit = "tok"
	}
	best := strconv.FormatFloat(r.PerSecond, 'f', -1, 64) + unit + "/s"
	if finitePositive(r.PerSecond) {
		m := strconv.FormatFloat(r.PerSecond*60, 'f', -1, 64)
		if v, err := strconv.ParseFloat(m, 64); err == nil && v/60 == r.PerSecond {
			if alt := m + unit + "/m"; len(alt) < len(best) {
				best = alt
			}
		}
	}
	return best
}

// validate reports whether r is usable: PerSecond finite and > 0.
func (r Rate) validate() error {
	if !finitePositive(r.PerSecond) {
		return fmt.Errorf("rate %s: must be a finite number > 0 per second", strconv.FormatFloat(r.PerSecond, 'g', -1, 64))
	}
	return nil
}

// MarshalText implements encoding.TextMarshaler (the String form), so a Rate
// is a JSON string such as "20/s".
func (r Rate) MarshalText() ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	return []byte(r.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseRate.
func (r *Rate) UnmarshalText(b []byte) error {
	v, err := ParseRate(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}
