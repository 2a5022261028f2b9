package simulator

import (
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// ProviderPeak is a provider account at 1.75x for a 75 s peak, the
// end-to-end test's load (TestProviderWindowsNeverExceeded) on a virtual
// clock: 60k TPM / 600 RPM; VIP reserves 20% (weight 70, realtime 5 s, a
// request every 3 s), a campaign sends the account's whole rate
// (weight 20, interactive 15 s), a batch job 0.65x (weight 10, 15 s
// budget). Checked against a provider that keeps a token bucket, a
// rolling minute or a fixed minute (Seed003Measure's windows).
func ProviderPeak() *Scenario {
	return &Scenario{
		Name:        "provider-peak",
		Description: "a 75 s peak at 1.75x a 60k TPM account: VIP reserves 20%, a campaign at 1x, a batch job at 0.65x",
		Upstreams:   1,
		Slots:       64,
		Classes: []Class{{Name: "realtime", Budget: 5 * time.Second},
			{Name: "interactive", Budget: 15 * time.Second}, {Name: "batch", Budget: 15 * time.Second}},
		Tenants: []TenantSpec{
			{Name: "vip", Weight: 70, Class: "realtime", Reserve: 0.2,
				Arrivals: Arrivals{Kind: ArrivalPeriodic, Interval: 3 * time.Second, End: ProviderPeakSpan},
				Prompt:   constant(100), MaxTokens: constant(200)},
			{Name: "campaign", Weight: 20, Class: "interactive",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 2.5, End: ProviderPeakSpan},
				Prompt:   constant(100), MaxTokens: constant(300)},
			{Name: "batch", Weight: 10, Class: "batch",
				Arrivals: Arrivals{Kind: ArrivalPoisson, Rate: 1, End: ProviderPeakSpan},
				Prompt:   constant(150), MaxTokens: constant(500)},
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
