package budget

import (
	"math"
	"testing"
	"time"
)

func TestETA(t *testing.T) {
	cases := []struct {
		work, rate float64
		want       time.Duration
	}{
		{1000, 100, 10 * time.Second},
		{1, 3, 333333334 * time.Nanosecond}, // rounded up
		{0, 100, 0},
		{-5, 100, 0},
		{0, 0, 0}, // nothing ahead: dispatch now even with no rate
		{math.NaN(), 1, 0},
		{100, 0, Never},
		{100, -1, Never},
		{100, math.NaN(), Never},
		{1e30, 1e-3, Never}, // too large
		{math.Inf(1), 1, Never},
	}
	for _, c := range cases {
		if got := ETA(c.work, c.rate); got != c.want {
			t.Errorf("ETA(%v, %v) = %v, want %v", c.work, c.rate, got, c.want)
		}
	}
	// Never has headroom.
	almost := Never - 1
	if Never+almost < 0 || t0.Add(Never).Before(t0) {
		t.Error("Never overflows")
	}
	if got := BoostETA(300, 100, 100); got != 4*time.Second {
		t.Errorf("BoostETA = %v, want 4s", got)
	}
	if got := BoostETA(-1, 0, 100); got != 0 {
		t.Errorf("BoostETA(nothing) = %v, want 0", got)
	}
	// The method form agrees.
	tp := NewThroughput(ThroughputConfig{Prior: 50})
	if got := tp.ETA(t0, 500, 2); got != 5*time.Second {
		t.Errorf("Throughput.ETA = %v, want 5s", got)
	}
	if got := tp.ETA(t0, 500, 0); got != Never {
		t.Errorf("Throughput.ETA(no healthy) = %v, want Never", got)
	}
}

func TestBudget(t *testing.T) {
	s := time.Second
	cases := []struct {
		class, tenant, req, want time.Duration
	}{
		{15 * s, 0, 0, 15 * s},
		{15 * s, 30 * s, 0, 30 * s}, // tenant override replaces
		{15 * s, 5 * s, 0, 5 * s},   // ...also downwards
		{15 * s, 0, 2 * s, 2 * s},   // header shortens
		{15 * s, 0, 60 * s, 15 * s}, // never lengthens
		{15 * s, 30 * s, 20 * s, 20 * s},
		{15 * s, 0, -1, 15 * s},
	}
	for _, c := range cases {
		if got := Budget(c.class, c.tenant, c.req); got != c.want {
			t.Errorf("Budget(%v, %v, %v) = %v, want %v", c.class, c.tenant, c.req, got, c.want)
		}
	}
}

func TestDecide(t *testing.T) {
	s := time.Second
	dl := t0.Add(10 * s)
	cases := []struct {
		name string
		in   Input
		want Decision
	}{
		{"meets", Input{Now: t0, Deadline: dl, ETA: 5 * s}, Wait},
		{"exactly at deadline", Input{Now: t0, Deadline: dl, ETA: 10 * s}, Wait},
		{"exactly at deadline-margin", Input{Now: t0, Deadline: dl, ETA: 9 * s, Margin: s}, Wait},
		{"margin makes it miss, no boost", Input{Now: t0, Deadline: dl, ETA: 9*s + 1, Margin: s}, Reject},
		{"late, boost fits", Input{Now: t0, Deadline: dl, ETA: 20 * s, BoostETA: 2 * s, BoostAllowed: true, Margin: s}, Boost},
		{"late, boost fits exactly", Input{Now: t0, Deadline: dl, ETA: 20 * s, BoostETA: 9 * s, BoostAllowed: true, Margin: s}, Boost},
		{"late, boost too slow", Input{Now: t0, Deadline: dl, ETA: 20 * s, BoostETA: 9*s + 1, BoostAllowed: true, Margin: s}, Reject},
		{"late, boost not allowed", Input{Now: t0, Deadline: dl, ETA: 20 * s, BoostETA: 0, Margin: s}, Reject},
		{"wait preferred over boost", Input{Now: t0, Deadline: dl, ETA: 5 * s, BoostETA: 0, BoostAllowed: true}, Wait},
		{"never", Input{Now: t0, Deadline: dl, ETA: Never, BoostETA: Never, BoostAllowed: true}, Reject},
		{"never with far deadline", Input{Now: t0, Deadline: t0.Add(200 * 365 * 24 * time.Hour), ETA: Never}, Reject},
		{"negative eta is 0", Input{Now: t0, Deadline: dl, ETA: -s}, Wait},
		{"negative margin is 0", Input{Now: t0, Deadline: dl, ETA: 10 * s, Margin: -5 * s}, Wait},
		{"queued past deadline-margin", Input{Now: dl.Add(-s / 2), Deadline: dl, ETA: 0, Margin: s}, Reject},
		{"queued past deadline, boost cannot help", Input{Now: dl.Add(s), Deadline: dl, ETA: 0, BoostAllowed: true}, Reject},
		{"no deadline", Input{Now: t0, ETA: Never}, Wait},
	}
	for _, c := range cases {
		if got := Decide(c.in); got != c.want {
			t.Errorf("%s: Decide = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDecisionString(t *testing.T) {
	for d, want := range map[Decision]string{Wait: "wait", Boost: "boost", Reject: "reject", Decision(9): "unknown"} {
		if got := d.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(d), got, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	s := time.Second
	cases := []struct {
		eta, want time.Duration
	}{
		{-s, s},
		{0, s},
		{time.Millisecond, s},
		{s, s},
		{s + 1, 2 * s},
		{2500 * time.Millisecond, 3 * s},
		{59 * s, 59 * s},
		{59*s + 1, 60 * s},
		{60 * s, 60 * s},
		{10 * time.Minute, MaxRetryAfter},
		{Never, MaxRetryAfter},
	}
	for _, c := range cases {
		if got := RetryAfter(c.eta); got != c.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", c.eta, got, c.want)
		}
		if got := RetryAfterSeconds(c.eta); got != int(c.want/s) {
			t.Errorf("RetryAfterSeconds(%v) = %d", c.eta, got)
		}
	}
}

func TestRetryAfterJitter(t *testing.T) {
	tests := []struct {
		eta  time.Duration
		u    float64
		want time.Duration
	}{
		{0, 0, time.Second},        // floor
		{0, 0.99, 2 * time.Second}, // spread over JitterMin
		{10 * time.Second, 0, 10 * time.Second},
		{10 * time.Second, 0.5, 13 * time.Second}, // + half of eta/2
		{10 * time.Second, 0.999, 15 * time.Second},
		{50 * time.Second, 0.9, MaxRetryAfter}, // capped
		{Never, 0.3, MaxRetryAfter},
		{-time.Second, -1, time.Second},
	}
	for _, tc := range tests {
		if got := RetryAfterJitter(tc.eta, tc.u); got != tc.want {
			t.Errorf("RetryAfterJitter(%v, %v) = %v, want %v", tc.eta, tc.u, got, tc.want)
		}
	}
}
