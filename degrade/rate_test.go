package degrade

import (
	"math"
	"testing"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in    string
		want  Rate
		canon string // String() of the result
	}{
		{"20/s", Rate{PerSecond: 20}, "20/s"},
		{"1200/m", Rate{PerSecond: 20}, "20/s"},
		{"30/m", Rate{PerSecond: 0.5}, "30/m"}, // shorter than 0.5/s
		{"100/m", Rate{PerSecond: 100.0 / 60}, "100/m"},
		{"5000tok/s", Rate{PerSecond: 5000, Tokens: true}, "5000tok/s"},
		{"100tok/m", Rate{PerSecond: 100.0 / 60, Tokens: true}, "100tok/m"},
		{"0.25/s", Rate{PerSecond: 0.25}, "15/m"}, // shorter than 0.25/s
		{"0.1/s", Rate{PerSecond: 0.1}, "6/m"},
		{"1.5/s", Rate{PerSecond: 1.5}, "90/m"},
		{"2.5/s", Rate{PerSecond: 2.5}, "2.5/s"}, // tie: /s
		{"1e3tok/s", Rate{PerSecond: 1000, Tokens: true}, "1000tok/s"},
		{"7/m", Rate{PerSecond: 7.0 / 60}, "7/m"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRate(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("ParseRate = %+v, want %+v", got, tc.want)
			}
			if s := got.String(); s != tc.canon {
				t.Fatalf("String() = %q, want %q", s, tc.canon)
			}
			if back, err := ParseRate(got.String()); err != nil || back != got {
				t.Fatalf("round trip %q: %+v, %v", got.String(), back, err)
			}
		})
	}
}

func TestParseRateErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `rate "": missing unit: ` + rateForms},
		{"20", `rate "20": missing unit: ` + rateForms},
		{"20/h", `rate "20/h": unknown unit "/h": ` + rateForms},
		{"20/sec", `rate "20/sec": unknown unit "/sec": ` + rateForms},
		{"20tokens/s", `rate "20tokens/s": "20tokens" is not a number: ` + rateForms},
		{"/s", `rate "/s": missing number: ` + rateForms},
		{"tok/s", `rate "tok/s": missing number: ` + rateForms},
		{"abc/s", `rate "abc/s": "abc" is not a number: ` + rateForms},
		{"NaN/s", `rate "NaN/s": "NaN" is not a number: ` + rateForms},
		{"Inf/s", `rate "Inf/s": "Inf" is not a number: ` + rateForms},
		{"0/s", `rate "0/s": must be positive`},
		{"-5/m", `rate "-5/m": must be positive`},
		{"5e-324/m", `rate "5e-324/m": out of range`},
		{"1e400/s", `rate "1e400/s": "1e400" is not a number: ` + rateForms},
		{"20/s/s", `rate "20/s/s": unknown unit "/s/s": ` + rateForms},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			r, err := ParseRate(tc.in)
			if err == nil {
				t.Fatalf("ParseRate succeeded: %+v", r)
			}
			if err.Error() != tc.want {
				t.Fatalf("error\n got %q\nwant %q", err, tc.want)
			}
		})
	}
}

// TestRateStringRoundTrip: ParseRate(r.String()) == r for assorted valid
// rates, including ones no human would write.
func TestRateStringRoundTrip(t *testing.T) {
	vals := []float64{1, 0.1, 1.0 / 3, 2.0 / 60, 1e-9, 12345.678, 1e15, math.Nextafter(20, 21), math.MaxFloat64 / 61, 5e-324}
	for _, v := range vals {
		for _, tok := range []bool{false, true} {
			r := Rate{PerSecond: v, Tokens: tok}
			back, err := ParseRate(r.String())
			if err != nil || back != r {
				t.Errorf("%+v -> %q -> %+v, %v", r, r.String(), back, err)
			}
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"20/s", "1200/m", "5000tok/s", "100tok/m", "0.1/m", "1e300/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r.validate() != nil {
			t.Fatalf("%q parsed to invalid %+v", s, r)
		}
		back, err := ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, r, r.String(), back, err)
		}
	})
}
