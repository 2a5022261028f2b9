package simulator

import (
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// TestProviderPeakCommitments: the provider peak over twenty seeds, with
// the campaign and the batch job arriving as Poisson processes (the
// scenario) and, as the end-to-end test sends them, every 400 ms and
// every second from a seed-dependent phase. Behind the account a request
// is refused at its decision point or committed to (commit.go), so no
// refusal comes after a quarter of its budget and none ends in
// queue_timeout: 0 of about 2,000 refusals each way, where deciding again
// on the share after the decision point, without the rescue, left 27 and
// 26 late (15 and 14 of them queue_timeout). The account stays used at
// >= 90% of its TPM over the peak, as in TestProviderPeak.
func TestProviderPeakCommitments(t *testing.T) {
	p, _ := PolicyByName(WFQBudgets)
	for _, periodic := range []bool{false, true} {
		refused, late := 0, 0
		for seed := uint64(1); seed <= 20; seed++ {
			sc := ProviderPeak()
			if periodic {
				sc.Tenants[1].Arrivals = Arrivals{Kind: ArrivalPeriodic, Interval: 400 * time.Millisecond,
					Start: time.Duration(seed) * 37 * time.Millisecond, End: ProviderPeakSpan}
				sc.Tenants[2].Arrivals = Arrivals{Kind: ArrivalPeriodic, Interval: time.Second,
					Start: time.Duration(seed) * 53 * time.Millisecond, End: ProviderPeakSpan}
			}
			w, err := Generate(sc, seed)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(w, p)
			if err != nil {
				t.Fatal(err)
			}
			var peak float64
			for i := range res.Requests {
				q, rec := &res.Requests[i], &res.Records[i]
				if (rec.State == StateInflight || rec.State == StateCompleted) && rec.Dispatch < ProviderPeakSpan {
					peak += float64(q.Estimate())
				}
				if rec.State != StateExpired && rec.State != StateRejected {
					continue
				}
				refused++
				if rec.Reason == fairqueue.ReasonQueueTimeout || rec.Left-q.Arrival > res.Scenario.Budget(q.Tenant)/4 {
					late++
					t.Errorf("periodic=%v seed %d: %s arriving at %v refused after %v (%v)", periodic, seed,
						res.Scenario.Tenants[q.Tenant].Name, q.Arrival, rec.Left-q.Arrival, rec.Reason)
				}
			}
			if use := peak / (ProviderPeakTPM * ProviderPeakSpan.Minutes()); use < 0.9 {
				t.Errorf("periodic=%v seed %d: the account was used at %.1f%% of its TPM over the peak, want >= 90%%", periodic, seed, 100*use)
			}
		}
		t.Logf("periodic=%v: %d refusals over seeds 1-20, %d late", periodic, refused, late)
		if refused < 1000 {
			t.Errorf("periodic=%v: only %d refusals at 1.75x the account", periodic, refused)
		}
	}
}
