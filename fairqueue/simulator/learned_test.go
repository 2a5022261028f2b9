package simulator

import (
	"testing"
	"time"
)

// busyFairness compares each tenant's share of the upstream time served to
// requests dispatched in [from, to) with its max-min fair share of that
// time (weights and each tenant's demand: the upstream time of its
// requests arriving then), and returns the shares and Jain's index of
// share / fair share.
func busyFairness(res *Result, from, to time.Duration) (shares []float64, index float64) {
	sc := res.Scenario
	demand := make([]float64, len(sc.Tenants))
	weights := make([]float64, len(sc.Tenants))
	for i := range sc.Tenants {
		weights[i] = sc.Tenants[i].Weight
	}
	for i := range res.Requests {
		if q := &res.Requests[i]; q.Arrival >= from && q.Arrival < to {
			demand[q.Tenant] += q.Service().Seconds()
		}
	}
	shares = busyShares(res, from, to)
	capacity := float64(sc.Capacity()) * (to - from).Seconds()
	fair := make([]float64, len(demand))
	waterfill(demand, weights, capacity, fair, make([]int, 0, len(demand)))
	total := 0.0
	for _, f := range fair {
		total += f
	}
	ratios := make([]float64, len(fair))
	for i := range fair {
		ratios[i] = shares[i] / (fair[i] / total)
	}
	return shares, jain(ratios)
}

// busyShares is each tenant's share of the upstream time served to
// requests dispatched in [from, to).
func busyShares(res *Result, from, to time.Duration) []float64 {
	busy := make([]float64, len(res.Scenario.Tenants))
	total := 0.0
	for i := range res.Requests {
		q, rec := &res.Requests[i], &res.Records[i]
		if (rec.State != StateInflight && rec.State != StateCompleted) || rec.Dispatch < from || rec.Dispatch >= to {
			continue
		}
		s := q.Service().Seconds()
		busy[q.Tenant] += s
		total += s
	}
	for i := range busy {
		busy[i] /= total
	}
	return busy
}

func jain(xs []float64) float64 {
	sum, sq := 0.0, 0.0
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// TestLearnedCostSharesBusyTime: on costmix (a prompt-heavy, an
// output-heavy and a chat tenant of equal weight; the prompt-heavy one asks
// for less than a third of the upstream time, the others for more), with
// cost_unit learned the tenants' shares of true upstream busy time match
// their max-min fair shares (Jain's index of share / fair share >= 0.99),
// while with estimated tokens they do not: the prompt-heavy tenant pays for
// prompt tokens that cost the upstream little. Seeds 1-3.
func TestLearnedCostSharesBusyTime(t *testing.T) {
	tokens, _ := PolicyByName("wfq-tokens")
	learned, _ := PolicyByName(WFQLearned)
	for seed := uint64(1); seed <= 3; seed++ {
		w, err := Generate(CostMix(), seed)
		if err != nil {
			t.Fatal(err)
		}
		var j [2]float64
		for k, p := range []Policy{tokens, learned} {
			res, err := Run(w, p)
			if err != nil {
				t.Fatal(err)
			}
			if res.ViolationCount != 0 {
				t.Fatalf("seed %d %s: %d violations: %v", seed, p.Name(), res.ViolationCount, res.Violations)
			}
			// From the first minute (the model warms up on ~1000
			// completions) to the end of arrivals.
			var shares []float64
			shares, j[k] = busyFairness(res, time.Minute, 10*time.Minute)
			t.Logf("seed %d %-12s busy-time shares %.3f (prefill, decode, chat), Jain of share/fair share %.4f", seed, p.Name(), shares, j[k])
		}
		if j[1] < 0.99 {
			t.Errorf("seed %d: learned: Jain's index of busy-time shares %.4f, want >= 0.99", seed, j[1])
		}
		if j[0] >= 0.99 {
			t.Errorf("seed %d: tokens: Jain %.4f: the scenario does not show what tokens miss", seed, j[0])
		}
	}
}
