package simulator

import (
	"strings"
	"testing"
)

// TestSeed004 runs seed004's callers through the three limiters, on seeds
// 1 to 5 (30 min, 30 spikes each), and asserts issue 10's figures for the
// joint one: misfire <= 2% and the big-token caller's served compute <= its
// quota + 5% on every seed, spike survival >= 90% over the 150 spikes (one
// seed's 30 spikes are too few for a share near 95%: seeds range 87-100%);
// and that QPS-only and tokens-only each fail one of them on every seed.
func TestSeed004(t *testing.T) {
	sc, ok := Lookup("seed004")
	if !ok {
		t.Fatal("seed004 not registered")
	}
	fails := func(r *Seed004Result) []string {
		var f []string
		if r.Misfire > 0.02 {
			f = append(f, "misfire")
		}
		if r.SpikeSurvival < 0.90 {
			f = append(f, "spike survival")
		}
		if r.BigServed > 1.05*r.BigQuota {
			f = append(f, "big-token compute")
		}
		return f
	}
	var spikes, survived float64
	for seed := uint64(1); seed <= 5; seed++ {
		w, err := Generate(sc, seed)
		if err != nil {
			t.Fatal(err)
		}
		res := map[QuotaMode]*Seed004Result{}
		var all []*Seed004Result
		for _, m := range QuotaModes {
			r, err := RunSeed004(w, m)
			if err != nil {
				t.Fatal(err)
			}
			res[m] = r
			all = append(all, r)
		}
		if seed == 1 {
			var b strings.Builder
			FormatSeed004(&b, all)
			t.Log("seed 1\n" + b.String())
		}

		// The workload is what the scenario says: every caller but bigtok
		// within its quota, bigtok above it.
		for _, tn := range res[QuotaJoint].Tenants {
			if want := tn.Name != "bigtok"; tn.WithinQuota != want {
				t.Errorf("seed %d: %s offers %.2f req-eq/s for a quota of %.2f: within = %v, want %v", seed, tn.Name, tn.Offered, tn.Quota, tn.WithinQuota, want)
			}
		}

		j := res[QuotaJoint]
		t.Logf("seed %d: joint misfire %.3f%%, spike survival %.1f%%, bigtok %.2f of %.2f", seed, 100*j.Misfire, 100*j.SpikeSurvival, j.BigServed, j.BigQuota)
		if j.Misfire > 0.02 || j.BigServed > 1.05*j.BigQuota {
			t.Errorf("seed %d: joint: misfire %.2f%% (want <= 2%%), bigtok %.2f for quota %.2f (want <= +5%%)", seed, 100*j.Misfire, j.BigServed, j.BigQuota)
		}
		if j.Spikes != 30 {
			t.Errorf("seed %d: %d spikes measured, want the 30 of the run", seed, j.Spikes)
		}
		spikes += float64(j.Spikes)
		survived += j.SpikeSurvival * float64(j.Spikes)

		// Each single-dimension limiter fails, for the reason the seed
		// gives: qps-only lets the big-token caller eat compute and kills
		// the tiny caller, tokens-only refuses long-context callers within
		// quota.
		q := res[QuotaQPSOnly]
		if f := fails(q); !contains(f, "big-token compute") || !contains(f, "misfire") {
			t.Errorf("seed %d: qps-only fails %v, want big-token compute and misfire (misfire %.2f%%, bigtok %.2f for %.2f)", seed, f, 100*q.Misfire, q.BigServed, q.BigQuota)
		}
		k := res[QuotaTokensOnly]
		if f := fails(k); !contains(f, "misfire") {
			t.Errorf("seed %d: tokens-only fails %v, want misfire (misfire %.2f%%)", seed, f, 100*k.Misfire)
		}
	}
	if s := survived / spikes; s < 0.90 {
		t.Errorf("joint spike survival %.1f%% over %.0f spikes, want >= 90%%", 100*s, spikes)
	} else {
		t.Logf("joint spike survival %.1f%% over %.0f spikes", 100*s, spikes)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
