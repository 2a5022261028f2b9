package simulator

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Seed 004 compares tenant quotas (package quota) that meter one dimension
// with the joint meter, on the seed's four callers, as an admission filter
// in front of the queue: a request over quota is refused on arrival, one
// within it is charged its estimate and reconciled with its actual tokens
// at arrival + service time (the pool is sized so that nothing queues).
//
// Every caller has a compute quota C in request-equivalents per second
// (compute = 1 + tokens x Seed004Weight, taken as the true cost). The
// limiters are calibrated from C as an operator without a joint meter
// would, assuming the fleet's average request of 1250 tokens:
//
//   - qps: C / 2 requests/s;
//   - tokens: 625 x C tokens/s;
//   - joint: qps C, joint_cap 1, tokens_per_min 60 x C / weight (never
//     binding first) and weight 0.0008.
//
// All three allow 0.2 above the rate for 10 s.

// Seed004Weight is the seed's token_to_qps_weight: 1250 tokens weigh as
// much as one request.
const Seed004Weight = 0.0008

// Seed004Duration is how long seed004's callers send.
const Seed004Duration = 30 * time.Minute

// The normal caller spikes to 1.15x its quota for 5 s every minute from
// 30 s on, and runs at 0.9x between spikes.
const (
	seed004SpikeEvery = time.Minute
	seed004SpikeLen   = 5 * time.Second
	seed004SpikeFirst = 30 * time.Second
)

// Seed004Quotas are the callers' compute quotas C, request-equivalents/s.
var Seed004Quotas = map[string]float64{
	"bigtok": 4,
	"tiny":   100,
	"normal": 50,
	"core":   100,
}

// Seed004 is seed document 004's callers: a low-QPS caller of ~20k-token
// requests (2x its compute quota), a high-QPS caller of tiny requests
// (0.8x), a normal caller at 0.9x with spikes, and a high-tier core caller
// of long-context requests (0.9x). The quota comparison is RunSeed004.
func Seed004() *Scenario {
	// Mean actual compute per request (prompt + 0.75 x max_tokens):
	// normal 1000 + 375 tokens = 2.1; core 4000 + 375 = 4.5.
	const normalCost, coreCost = 2.1, 4.5
	var phases []Phase
	base := 0.9 * Seed004Quotas["normal"] / normalCost
	spike := 1.15 * Seed004Quotas["normal"] / normalCost
	at := time.Duration(0)
	for s := seed004SpikeFirst; s < Seed004Duration; s += seed004SpikeEvery {
		phases = append(phases,
			Phase{Start: at, End: s, Rate: base},
			Phase{Start: s, End: s + seed004SpikeLen, Rate: spike})
		at = s + seed004SpikeLen
	}
	phases = append(phases, Phase{Start: at, End: Seed004Duration, Rate: base})
	return &Scenario{
		Name:        "seed004",
		Description: "quota callers: 20k-token low QPS, tiny high QPS, normal with 1.15x spikes, core long-context; quota comparison in RunSeed004; 20x16 slots",
		Upstreams:   20, Slots: 16,
		Classes:  defaultClasses,
		Policies: []string{"wfq-tokens"},
		Tenants: []TenantSpec{
			tenant("bigtok", 1, "batch", poisson(0.5, Seed004Duration), uniform(14000, 16000), constant(5000)),
			tenant("tiny", 1, "interactive", poisson(80, Seed004Duration), uniform(5, 30), constant(8)),
			tenant("normal", 1, "interactive", phased(phases...), uniform(500, 1500), constant(500)),
			tenant("core", 4, "realtime", poisson(0.9*Seed004Quotas["core"]/coreCost, Seed004Duration), uniform(3000, 5000), constant(500)),
		},
	}
}

// QuotaMode names a limiter of seed004.
type QuotaMode string

// The limiters compared.
const (
	QuotaQPSOnly    QuotaMode = "qps-only"
	QuotaTokensOnly QuotaMode = "tokens-only"
	QuotaJoint      QuotaMode = "joint"
)

// QuotaModes are the limiters in the order they are printed.
var QuotaModes = []QuotaMode{QuotaQPSOnly, QuotaTokensOnly, QuotaJoint}

// Seed004Config is the quota of a caller with compute quota c under mode.
func Seed004Config(mode QuotaMode, c float64) quota.Config {
	cfg := quota.Config{BurstWindow: 10 * time.Second, BurstAllow: 0.2}
	switch mode {
	case QuotaQPSOnly:
		cfg.QPS = c / 2
	case QuotaTokensOnly:
		cfg.TokensPerMin = 60 * 625 * c
	default:
		cfg.QPS = c
		cfg.JointCap = 1
		cfg.TokenToQPSWeight = Seed004Weight
		cfg.TokensPerMin = 60 * c / Seed004Weight
	}
	return cfg
}

// Seed004Tenant is one caller's outcome under one limiter.
type Seed004Tenant struct {
	Name        string
	Quota       float64 // C, request-equivalents/s
	Offered     float64 // actual compute offered per second
	Served      float64 // actual compute of admitted requests per second
	Requests    int
	Refused     int
	Reasons     map[quota.Dimension]int // refusals by binding dimension
	WithinQuota bool                    // Offered <= Quota
}

// Seed004Result is one limiter's run.
type Seed004Result struct {
	Mode    QuotaMode
	Tenants []Seed004Tenant
	// Misfire is refused / requests over the callers within their quota.
	Misfire float64
	// SpikeSurvival is the share of the normal caller's Spikes in which
	// all its requests were admitted; SpikeRequests the share admitted.
	Spikes        int
	SpikeSurvival float64
	SpikeRequests float64
	// BigServed and BigQuota are bigtok's served compute and quota.
	BigServed, BigQuota float64
}

type completion struct {
	at       time.Duration
	seq      int
	tenant   int
	est, act int64
}

func (c completion) less(o completion) bool {
	return c.at < o.at || c.at == o.at && c.seq < o.seq
}

// RunSeed004 replays w (seed004's workload) through one limiter.
func RunSeed004(w *Workload, mode QuotaMode) (*Seed004Result, error) {
	sc := w.Scenario
	rp := &quotaReplay{sc: sc, limits: make([]*quota.Limits, len(sc.Tenants)), spikes: map[int]spikeStat{},
		normal: indexOf(sc, "normal"), res: &Seed004Result{Mode: mode, Tenants: make([]Seed004Tenant, len(sc.Tenants))}}
	for i, t := range sc.Tenants {
		c, ok := Seed004Quotas[t.Name]
		if !ok {
			return nil, fmt.Errorf("seed004: tenant %s has no quota", t.Name)
		}
		l, err := Seed004Config(mode, c).Compile()
		if err != nil {
			return nil, fmt.Errorf("seed004: tenant %s: %w", t.Name, err)
		}
		rp.limits[i] = l
		rp.res.Tenants[i] = Seed004Tenant{Name: t.Name, Quota: c, Reasons: map[quota.Dimension]int{}}
	}
	epoch := time.Unix(0, 0)
	rp.store = quota.NewMemory(func() time.Time { return epoch.Add(rp.now) })
	for k := range w.Requests {
		if err := rp.arrive(k, &w.Requests[k]); err != nil {
			return nil, err
		}
	}
	rp.res.summarise(rp.spikes)
	return rp.res, nil
}

// quotaReplay runs requests through one limiter on a virtual clock.
type quotaReplay struct {
	sc     *Scenario
	limits []*quota.Limits // per tenant
	store  *quota.Memory
	now    time.Duration // the store's clock
	done   minHeap[completion]
	normal int // the tenant whose spikes are followed
	spikes map[int]spikeStat
	res    *Seed004Result
}

type spikeStat struct{ offered, admitted int }

func (rp *quotaReplay) arrive(k int, r *Request) error {
	ctx := context.Background()
	for len(rp.done) > 0 && rp.done[0].at <= r.Arrival {
		c := rp.done.pop()
		rp.now = c.at
		if _, err := rp.store.Reconcile(ctx, rp.sc.Tenants[c.tenant].Name, rp.limits[c.tenant], c.est, c.act); err != nil {
			return err
		}
	}
	rp.now = r.Arrival
	t := &rp.res.Tenants[r.Tenant]
	t.Requests++
	cost := 1 + float64(r.Actual())*Seed004Weight // the true cost
	t.Offered += cost
	d, err := rp.store.Charge(ctx, t.Name, rp.limits[r.Tenant], r.Estimate())
	if err != nil {
		return err
	}
	if d.Allowed {
		t.Served += cost
		rp.done.push(completion{at: r.Arrival + r.Service(), seq: k, tenant: r.Tenant, est: r.Estimate(), act: r.Actual()})
	} else {
		t.Refused++
		t.Reasons[d.Reason]++
	}
	if s, ok := spikeOf(r.Arrival); ok && r.Tenant == rp.normal {
		st := rp.spikes[s]
		st.offered++
		if d.Allowed {
			st.admitted++
		}
		rp.spikes[s] = st
	}
	return nil
}

// summarise turns the tenants' totals into rates and computes the measures.
func (res *Seed004Result) summarise(spikes map[int]spikeStat) {
	secs := Seed004Duration.Seconds()
	var within, refused, spikeOff, spikeAdm, survived int
	for i := range res.Tenants {
		t := &res.Tenants[i]
		t.Offered /= secs
		t.Served /= secs
		t.WithinQuota = t.Offered <= t.Quota
		if t.WithinQuota {
			within += t.Requests
			refused += t.Refused
		}
		if t.Name == "bigtok" {
			res.BigServed, res.BigQuota = t.Served, t.Quota
		}
	}
	if within > 0 {
		res.Misfire = float64(refused) / float64(within)
	}
	for _, s := range spikes {
		res.Spikes++
		spikeOff += s.offered
		spikeAdm += s.admitted
		if s.admitted == s.offered {
			survived++
		}
	}
	if res.Spikes > 0 {
		res.SpikeSurvival = float64(survived) / float64(res.Spikes)
		res.SpikeRequests = float64(spikeAdm) / float64(spikeOff)
	}
}

// spikeOf returns the index of the normal caller's spike containing t.
func spikeOf(t time.Duration) (int, bool) {
	if t < seed004SpikeFirst {
		return 0, false
	}
	k := int((t - seed004SpikeFirst) / seed004SpikeEvery)
	start := seed004SpikeFirst + time.Duration(k)*seed004SpikeEvery
	return k, t < start+seed004SpikeLen
}

// FormatSeed004 prints the limiters' measures and callers.
func FormatSeed004(out io.Writer, results []*Seed004Result) {
	for _, r := range results {
		fmt.Fprintf(out, "%s: misfire %.2f%%  spike survival %.1f%% (%d spikes, %.2f%% of spike requests)  bigtok served %.2f of quota %.2f req-eq/s (%+.1f%%)\n",
			r.Mode, 100*r.Misfire, 100*r.SpikeSurvival, r.Spikes, 100*r.SpikeRequests,
			r.BigServed, r.BigQuota, 100*(r.BigServed/r.BigQuota-1))
		fmt.Fprintf(out, "  %-8s %8s %9s %9s %8s %8s  %s\n", "caller", "quota", "offered", "served", "reqs", "refused", "reasons")
		for _, t := range r.Tenants {
			dims := make([]string, 0, len(t.Reasons))
			for d, n := range t.Reasons {
				dims = append(dims, fmt.Sprintf("%s=%d", d, n))
			}
			sort.Strings(dims)
			within := ""
			if t.WithinQuota {
				within = " (within)"
			}
			fmt.Fprintf(out, "  %-8s %8.1f %9.2f %9.2f %8d %8d  %v%s\n", t.Name, t.Quota, t.Offered, t.Served, t.Requests, t.Refused, dims, within)
		}
	}
}
