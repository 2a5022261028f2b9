package simulator

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// TestProviderPeak: a 75 s peak at 1.75x a 60k TPM account. Whichever way
// the provider keeps its minute (a token bucket, a rolling minute, fixed
// minutes at any phase) it refuses nothing the gateway sends, and no 60 s
// holds more than the TPM; the account is used at >= 90% of its TPM over
// the peak (prompt + max_tokens, as providers count); VIP, reserved, is
// always served; and the requests the account cannot take in time are
// refused early: over seeds 1-5, at least 99% of the refusals within a
// quarter of the wait budget (a queue_timeout counts as late), and no
// seed above 3% (observed none late; TestProviderPeakCommitments holds
// twenty seeds to none).
func TestProviderPeak(t *testing.T) {
	p, _ := PolicyByName(WFQBudgets)
	refused, late := 0, 0
	for seed := uint64(1); seed <= 5; seed++ {
		w, err := Generate(ProviderPeak(), seed)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(w, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.ViolationCount != 0 {
			t.Fatalf("seed %d: %d invariant violations: %v", seed, res.ViolationCount, res.Violations)
		}
		var sends []Send
		var peak float64
		vip, vipServed, seedRefused, seedLate, timeouts := 0, 0, 0, 0, 0
		for i := range res.Requests {
			q, rec := &res.Requests[i], &res.Records[i]
			name := res.Scenario.Tenants[q.Tenant].Name
			served := rec.State == StateInflight || rec.State == StateCompleted
			if served {
				sends = append(sends, Send{At: rec.Dispatch, Tokens: float64(q.Estimate())})
				if rec.Dispatch < ProviderPeakSpan {
					peak += float64(q.Estimate())
				}
			}
			if name == "vip" {
				vip++
				if served {
					vipServed++
				}
			}
			if rec.State != StateExpired && rec.State != StateRejected {
				continue
			}
			seedRefused++
			if rec.Reason == fairqueue.ReasonQueueTimeout {
				timeouts++
			}
			if rec.Reason == fairqueue.ReasonQueueTimeout || rec.Left-q.Arrival > res.Scenario.Budget(q.Tenant)/4 {
				seedLate++
			}
		}
		for _, pw := range ProviderWindows() {
			if n := ProviderRefusals(sends, ProviderPeakTPM, ProviderPeakRPM, pw); n != 0 {
				t.Errorf("seed %d: a provider counting a %v minute would refuse %d of the gateway's requests", seed, pw, n)
			}
		}
		if m := MaxWindow(sends, time.Minute) / ProviderPeakTPM; m > 1 {
			t.Errorf("seed %d: a 60 s window held %.3f of the TPM", seed, m)
		}
		use := peak / (ProviderPeakTPM * ProviderPeakSpan.Minutes())
		if use < 0.9 {
			t.Errorf("seed %d: the account was used at %.1f%% of its TPM over the peak, want >= 90%%", seed, 100*use)
		}
		if vipServed != vip {
			t.Errorf("seed %d: VIP served %d of %d", seed, vipServed, vip)
		}
		if seedLate*100 > 3*seedRefused {
			t.Errorf("seed %d: %d of %d refusals late (after a quarter of the budget, or queue_timeout), want <= 3%%", seed, seedLate, seedRefused)
		}
		refused += seedRefused
		late += seedLate
		t.Logf("seed %d: account used %.1f%% of its TPM over the peak; VIP %d/%d; refused %d, %d late of which %d queue_timeout",
			seed, 100*use, vipServed, vip, seedRefused, seedLate, timeouts)
	}
	if late*100 > refused {
		t.Errorf("%d of %d refusals late over seeds 1-5, want <= 1%%", late, refused)
	}
}
