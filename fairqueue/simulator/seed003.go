package simulator

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Seed 003: a gateway in front of a model provider whose account allows
// 120k tokens and 600 requests per minute. At peak (60 s to 360 s) a
// marketing campaign triples the normal tenant's traffic while a batch
// summarization job of 300 long prompts arrives; the VIP tenant's realtime
// calls (15 s budget) go on throughout. Weights VIP : normal : batch are
// 70 : 20 : 10, and VIP reserves 20% of the account.
//
// Policies: fifo-budgets is FIFO behind the same account limiter (what the
// seed's customer had: a global limiter, first come first served);
// wfq-budgets is ours, with the reservation.
func Seed003() *Scenario {
	return &Scenario{
		Name:        "seed003",
		Description: "provider account 120k TPM / 600 RPM; peak 60-360 s: campaign x3.5 + batch job of 300 long prompts; VIP reserves 20%",
		Upstreams:   1,
		Slots:       64,
		Classes: []Class{{Name: "realtime", Budget: 15 * time.Second},
			{Name: "interactive", Budget: 30 * time.Second}, {Name: "batch", Budget: 30 * time.Minute}},
		Tenants: []TenantSpec{
			{Name: "vip", Weight: 70, Class: "realtime", Reserve: 0.2,
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 0.3, End: Seed003Duration},
				Prompt:   uniform(300, 900), MaxTokens: constant(300)},
			{Name: "normal", Weight: 20, Class: "interactive",
				Arrivals: Arrivals{Kind: ArrivalPhases, Phases: []Phase{
					{Start: 0, End: Seed003PeakStart, Rate: 0.4},
					{Start: Seed003PeakStart, End: Seed003PeakEnd, Rate: 1.4},
					{Start: Seed003PeakEnd, End: Seed003Duration, Rate: 0.4}}},
				Prompt: uniform(300, 900), MaxTokens: constant(300)},
			{Name: "batch", Weight: 10, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalBurst, N: 300, Start: Seed003PeakStart, End: Seed003PeakStart + 10*time.Second},
				Prompt:   uniform(2000, 4000), MaxTokens: constant(500)},
		},
		Duration:       Seed003Duration,
		EnforceBudgets: true,
		UpstreamQuota:  &fairqueue.UpstreamQuota{TPM: Seed003TPM, RPM: Seed003RPM},
		Policies:       []string{FIFOBudgets, WFQBudgets},
	}
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
	// (a bucket of one minute's allowance per dimension, refilled
	// continuously, charged prompt + max_tokens) would have refused.
	ProviderRefusals int
	// VIP at peak: requests arriving in [PeakStart, PeakEnd), those not
	// served within budget (expired or refused), and the P99 wait of the
	// served ones.
	VIPPeak, VIPFailed int
	VIPP99             time.Duration
	// Batch: requests, those served, and when the last one was dispatched.
	Batch, BatchServed int
	BatchDone          time.Duration
	// PeakUse is what the gateway drew on the account during the peak
	// (the actual tokens of the requests dispatched then: the estimate
	// pre-deducted, reconciled at completion) over what the account
	// allows in it.
	PeakUse float64
}

// VIPFailureRate is VIPFailed / VIPPeak.
func (r Seed003Report) VIPFailureRate() float64 { return frac(r.VIPFailed, r.VIPPeak) }

// Seed003Measure computes the report of one run.
func Seed003Measure(res *Result) Seed003Report {
	rep := Seed003Report{Policy: res.Policy}
	type dispatch struct {
		at     time.Duration
		tokens float64
	}
	var ds []dispatch
	var vipWaits []time.Duration
	var peakTokens float64
	for i := range res.Requests {
		q, rec := &res.Requests[i], &res.Records[i]
		name := res.Scenario.Tenants[q.Tenant].Name
		served := rec.State == StateInflight || rec.State == StateCompleted
		if served {
			ds = append(ds, dispatch{rec.Dispatch, float64(q.Estimate())})
			if rec.Dispatch >= Seed003PeakStart && rec.Dispatch < Seed003PeakEnd {
				peakTokens += float64(q.Actual())
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
	sort.Slice(vipWaits, func(i, j int) bool { return vipWaits[i] < vipWaits[j] })
	rep.VIPP99 = percentile(vipWaits, 0.99)
	sort.Slice(ds, func(i, j int) bool { return ds[i].at < ds[j].at })
	// The provider: full buckets at the start, refilled continuously.
	tok, req := float64(Seed003TPM), float64(Seed003RPM)
	var last time.Duration
	for _, d := range ds {
		dt := (d.at - last).Seconds()
		last = d.at
		tok = math.Min(Seed003TPM, tok+dt*Seed003TPM/60)
		req = math.Min(Seed003RPM, req+dt*Seed003RPM/60)
		if d.tokens > tok+1e-6 || 1 > req+1e-9 {
			rep.ProviderRefusals++
			continue
		}
		tok -= d.tokens
		req--
	}
	rep.PeakUse = peakTokens / (Seed003TPM * (Seed003PeakEnd - Seed003PeakStart).Minutes())
	return rep
}

// FormatSeed003 prints the reports side by side.
func FormatSeed003(w io.Writer, reps []Seed003Report) {
	fmt.Fprintf(w, "%-22s %14s %18s %10s %14s %12s %9s\n", "policy", "provider 429s", "VIP failed (peak)", "VIP p99", "batch served", "batch done", "peak use")
	for _, r := range reps {
		fmt.Fprintf(w, "%-22s %14d %11d/%d %4.2f%% %10v %9d/%d %12v %8.1f%%\n", r.Policy, r.ProviderRefusals,
			r.VIPFailed, r.VIPPeak, 100*r.VIPFailureRate(), r.VIPP99.Round(time.Millisecond), r.BatchServed, r.Batch,
			r.BatchDone.Round(time.Second), 100*r.PeakUse)
	}
}

// Seed003Outage is seed003 with the primary account out of quota for two
// minutes at peak (the provider's 429s say so from 120 s to 240 s), and,
// with fallback, a fallback account of 16 slots for VIP: the seed's
// "VIP degrade channel" that keeps its SLA above 99.9%.
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

// VIPSuccess is the share of the VIP requests arriving during the
// primary's outage that were served within their budget, and how many the
// fallback served.
func VIPSuccess(res *Result) (rate float64, n, fellBack int) {
	served := 0
	for i := range res.Requests {
		q := &res.Requests[i]
		if res.Scenario.Tenants[q.Tenant].Name != "vip" || q.Arrival < Seed003OutageStart || q.Arrival >= Seed003OutageEnd {
			continue
		}
		n++
		rec := &res.Records[i]
		if rec.State == StateInflight || rec.State == StateCompleted {
			served++
			if rec.Fallback {
				fellBack++
			}
		}
	}
	return frac(served, n), n, fellBack
}
