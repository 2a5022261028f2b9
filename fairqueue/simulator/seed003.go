package simulator

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Seed003 is a provider account of 120k tokens and 600 requests per
// minute. At peak (60 s to 360 s) a campaign triples the normal tenant's
// traffic while a batch job of 300 long prompts arrives; VIP's realtime
// calls go on throughout, and VIP reserves 20% of the account.
// fifo-budgets is what the seed's customer had: a global limiter, first
// come first served.
func Seed003() *Scenario {
	return &Scenario{
		Name:        "seed003",
		Description: "provider account 120k TPM / 600 RPM; peak 60-360 s: campaign x3.5 + batch job of 300 long prompts; VIP reserves 20%",
		Upstreams:   1,
		Slots:       64,
		Classes:     classes(15*time.Second, 30*time.Second, 30*time.Minute),
		Tenants: []TenantSpec{
			vip(poisson(0.3, Seed003Duration), uniform(300, 900), constant(300)),
			tenant("normal", 20, "interactive", phased(
				Phase{Start: 0, End: Seed003PeakStart, Rate: 0.4},
				Phase{Start: Seed003PeakStart, End: Seed003PeakEnd, Rate: 1.4},
				Phase{Start: Seed003PeakEnd, End: Seed003Duration, Rate: 0.4}),
				uniform(300, 900), constant(300)),
			tenant("batch", 10, "batch", burst(300, Seed003PeakStart, Seed003PeakStart+10*time.Second), uniform(2000, 4000), constant(500)),
		},
		Duration:       Seed003Duration,
		EnforceBudgets: true,
		UpstreamQuota:  &fairqueue.UpstreamQuota{TPM: Seed003TPM, RPM: Seed003RPM},
		Policies:       []string{FIFOBudgets, WFQBudgets},
	}
}

// vip is the provider scenarios' realtime caller, which reserves 20% of
// the account.
func vip(a Arrivals, prompt, maxTokens Dist) TenantSpec {
	t := tenant("vip", 70, "realtime", a, prompt, maxTokens)
	t.Reserve = 0.2
	return t
}

// Seed003's account and phases.
const (
	Seed003TPM       = 120000
	Seed003RPM       = 600
	Seed003PeakStart = 60 * time.Second
	Seed003PeakEnd   = 360 * time.Second
	Seed003Duration  = 25 * time.Minute
)

// Seed003Report is what seed 003 measures of one run.
type Seed003Report struct {
	Policy string
	// ProviderRefusals counts dispatches a provider enforcing the account
	// would have refused, the most over ProviderWindows;
	// RollingRefusals is the rolling minute's alone.
	ProviderRefusals, RollingRefusals int
	// WindowMax is the most any 60 s window held over the account's TPM.
	WindowMax float64
	// VIP requests arriving at peak, those not served, and the P99 wait of
	// the served ones.
	VIPPeak, VIPFailed int
	VIPP99             time.Duration
	// Batch requests, those served, and when the last was dispatched.
	Batch, BatchServed int
	BatchDone          time.Duration
	// PeakUse is the tokens dispatched at peak over what the account
	// allows in it.
	PeakUse float64
}

// VIPFailureRate is VIPFailed / VIPPeak.
func (r Seed003Report) VIPFailureRate() float64 { return frac(r.VIPFailed, r.VIPPeak) }

// Seed003Measure computes the report of one run.
func Seed003Measure(res *Result) Seed003Report {
	rep := Seed003Report{Policy: res.Policy}
	var ds []Send
	var vipWaits []time.Duration
	var peakTokens float64
	for i := range res.Requests {
		q, rec := &res.Requests[i], &res.Records[i]
		name := res.Scenario.Tenants[q.Tenant].Name
		served := rec.Served()
		if served && !rec.Fallback {
			ds = append(ds, Send{At: rec.Dispatch, Tokens: float64(q.Estimate())})
			if rec.Dispatch >= Seed003PeakStart && rec.Dispatch < Seed003PeakEnd {
				peakTokens += float64(q.Estimate())
			}
		}
		switch {
		case name == "vip" && q.Arrival >= Seed003PeakStart && q.Arrival < Seed003PeakEnd:
			rep.VIPPeak++
			if !served {
				rep.VIPFailed++
			} else {
				vipWaits = append(vipWaits, rec.Dispatch-q.Arrival)
			}
		case name == "batch":
			rep.Batch++
			if served {
				rep.BatchServed++
				rep.BatchDone = max(rep.BatchDone, rec.Dispatch)
			}
		}
	}
	slices.Sort(vipWaits)
	rep.VIPP99 = percentile(vipWaits, 0.99)
	acct := res.Scenario.UpstreamQuota
	for _, w := range ProviderWindows() {
		n := ProviderRefusals(ds, acct.TPM, acct.RPM, w)
		rep.ProviderRefusals = max(rep.ProviderRefusals, n)
		if w.Kind == WindowRolling {
			rep.RollingRefusals = n
		}
	}
	rep.WindowMax = MaxWindow(ds, time.Minute) / acct.TPM
	rep.PeakUse = peakTokens / (acct.TPM * (Seed003PeakEnd - Seed003PeakStart).Minutes())
	return rep
}

// Send is one request sent to a provider account: when, and the tokens
// it counts (prompt + max_tokens).
type Send struct {
	At     time.Duration
	Tokens float64
}

// WindowKind is how a provider keeps its minute.
type WindowKind int

// The provider windows.
const (
	WindowBucket  WindowKind = iota + 1 // a minute's allowance, refilled continuously
	WindowRolling                       // the last 60 s
	WindowFixed                         // minutes starting at Offset
)

// ProviderWindow is one way a provider counts, for ProviderRefusals.
type ProviderWindow struct {
	Kind   WindowKind
	Offset time.Duration // WindowFixed: where its minutes start
}

func (w ProviderWindow) String() string {
	switch w.Kind {
	case WindowBucket:
		return "bucket"
	case WindowRolling:
		return "rolling"
	}
	return fmt.Sprintf("fixed+%v", w.Offset)
}

// ProviderWindows lists a bucket, a rolling minute, and fixed minutes
// starting at 0, 15, 30 and 45 s.
func ProviderWindows() []ProviderWindow {
	ws := []ProviderWindow{{Kind: WindowBucket}, {Kind: WindowRolling}}
	for off := time.Duration(0); off < time.Minute; off += 15 * time.Second {
		ws = append(ws, ProviderWindow{Kind: WindowFixed, Offset: off})
	}
	return ws
}

// ProviderRefusals counts the sends a provider with these limits per
// minute (0: none), counting its minute as w does, would refuse; a refused
// send takes nothing.
func ProviderRefusals(sends []Send, tpm, rpm float64, w ProviderWindow) int {
	sends = slices.Clone(sends)
	slices.SortStableFunc(sends, func(a, b Send) int { return cmp.Compare(a.At, b.At) })
	refused := 0
	fits := func(used, n, limit float64) bool { return limit == 0 || used+n <= limit+1e-6 }
	switch w.Kind {
	case WindowBucket:
		tok, req := tpm, rpm
		var last time.Duration
		for _, d := range sends {
			dt := (d.At - last).Seconds()
			last = d.At
			tok = math.Min(tpm, tok+dt*tpm/60)
			req = math.Min(rpm, req+dt*rpm/60)
			if !fits(tpm-tok, d.Tokens, tpm) || !fits(rpm-req, 1, rpm) {
				refused++
				continue
			}
			tok -= d.Tokens
			req--
		}
	case WindowRolling:
		var taken []Send
		head := 0
		tok, req := 0.0, 0.0
		for _, d := range sends {
			for head < len(taken) && taken[head].At <= d.At-time.Minute {
				tok -= taken[head].Tokens
				req--
				head++
			}
			if !fits(tok, d.Tokens, tpm) || !fits(req, 1, rpm) {
				refused++
				continue
			}
			taken = append(taken, d)
			tok += d.Tokens
			req++
		}
	case WindowFixed:
		minute := int64(math.MinInt64)
		tok, req := 0.0, 0.0
		for _, d := range sends {
			if m := int64((d.At - w.Offset + time.Hour) / time.Minute); m != minute {
				minute, tok, req = m, 0, 0
			}
			if !fits(tok, d.Tokens, tpm) || !fits(req, 1, rpm) {
				refused++
				continue
			}
			tok += d.Tokens
			req++
		}
	}
	return refused
}

// MaxWindow is the most tokens sent in any window of length w.
func MaxWindow(sends []Send, w time.Duration) float64 {
	sends = slices.Clone(sends)
	slices.SortStableFunc(sends, func(a, b Send) int { return cmp.Compare(a.At, b.At) })
	best, sum, head := 0.0, 0.0, 0
	for _, d := range sends {
		sum += d.Tokens
		for sends[head].At <= d.At-w {
			sum -= sends[head].Tokens
			head++
		}
		best = max(best, sum)
	}
	return best
}

// FormatSeed003 prints the reports side by side.
func FormatSeed003(w io.Writer, reps []Seed003Report) {
	fmt.Fprintf(w, "%-22s %14s %11s %18s %10s %14s %12s %9s\n", "policy", "provider 429s", "window max", "VIP failed (peak)", "VIP p99", "batch served", "batch done", "peak use")
	for _, r := range reps {
		fmt.Fprintf(w, "%-22s %14d %10.1f%% %11d/%d %4.2f%% %10v %9d/%d %12v %8.1f%%\n", r.Policy, r.ProviderRefusals, 100*r.WindowMax,
			r.VIPFailed, r.VIPPeak, 100*r.VIPFailureRate(), r.VIPP99.Round(time.Millisecond), r.BatchServed, r.Batch,
			r.BatchDone.Round(time.Second), 100*r.PeakUse)
	}
}

// Seed003Outage is seed003 with the primary account exhausted from 120 s
// to 240 s, and, with fallback, a fallback account of 16 slots for VIP.
func Seed003Outage(fallback bool) *Scenario {
	sc := Seed003()
	sc.Name = "seed003-outage"
	sc.Description = "seed003 with the primary account exhausted 120-240 s"
	sc.Exhausted = []Exhaustion{{At: Seed003OutageStart, For: Seed003OutageEnd - Seed003OutageStart}}
	if fallback {
		sc.Name = "seed003-fallback"
		sc.Description += "; VIP falls back to a second account (16 slots)"
		sc.Fallback = &FallbackSpec{Slots: 16, Tenants: []string{"vip"}}
	}
	sc.Policies = []string{WFQBudgets}
	return sc
}

// The primary account's outage in Seed003Outage.
const (
	Seed003OutageStart = 120 * time.Second
	Seed003OutageEnd   = 240 * time.Second
)

// ProviderPeak is the end-to-end test's load (TestProviderWindowsNeverExceeded)
// on a virtual clock: a 60k TPM / 600 RPM account at 1.75x for 75 s; VIP
// reserves 20%, a campaign sends the account's whole rate, a batch job
// 0.65x.
func ProviderPeak() *Scenario {
	return &Scenario{
		Name:        "provider-peak",
		Description: "a 75 s peak at 1.75x a 60k TPM account: VIP reserves 20%, a campaign at 1x, a batch job at 0.65x",
		Upstreams:   1,
		Slots:       64,
		Classes:     classes(5*time.Second, 15*time.Second, 15*time.Second),
		Tenants: []TenantSpec{
			vip(Arrivals{Kind: ArrivalPeriodic, Interval: 3 * time.Second, End: ProviderPeakSpan}, constant(100), constant(200)),
			tenant("campaign", 20, "interactive", poisson(2.5, ProviderPeakSpan), constant(100), constant(300)),
			tenant("batch", 10, "batch", poisson(1, ProviderPeakSpan), constant(150), constant(500)),
		},
		Duration:       ProviderPeakSpan + 20*time.Second,
		EnforceBudgets: true,
		UpstreamQuota:  &fairqueue.UpstreamQuota{TPM: ProviderPeakTPM, RPM: ProviderPeakRPM},
		Policies:       []string{WFQBudgets},
	}
}

// ProviderPeak's account and span.
const (
	ProviderPeakTPM  = 60000
	ProviderPeakRPM  = 600
	ProviderPeakSpan = 75 * time.Second
)
