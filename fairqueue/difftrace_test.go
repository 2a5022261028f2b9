package fairqueue

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// TestDiffTrace runs random traces of every kind of operation (enqueue
// with and without a precheck, release, cancel, requeue, promote, ticks,
// clock jumps, health and slot changes, pauses, the account declared
// exhausted, SetQuotaWeight, cost models, reloads that declare and
// undeclare tenants, shared service) over 18 configurations, and logs
// every result: events, ticket times, rejections, Stats, the water level,
// the backlogged weight and the scheduler's virtual times and flows.
//
// It is the check that a change meant to keep behaviour (a faster data
// structure, a fast path) keeps it byte for byte, against the commit it
// starts from:
//
//	git archive BASE | tar -x -C /tmp/base   # then copy this file into it
//	(cd /tmp/base && FQ_TRACE_DIR=/tmp/tr FQ_TRACE_MODE=record go test -run TestDiffTrace ./fairqueue/)
//	FQ_TRACE_DIR=/tmp/tr FQ_TRACE_MODE=compare go test -run TestDiffTrace ./fairqueue/
//
// (6 seeds of 5,000 to 6,200 operations per configuration, about 1 GB of
// traces). Without FQ_TRACE_DIR it runs shorter traces twice each and
// fails if the two differ: the scheduler is deterministic on a virtual
// clock (Close, which ends the waiting tickets in map order, is logged
// sorted).
func TestDiffTrace(t *testing.T) {
	dir, mode := os.Getenv("FQ_TRACE_DIR"), os.Getenv("FQ_TRACE_MODE")
	seeds, ops := uint64(6), 5000
	if dir == "" {
		seeds, ops = 2, 300
	}
	for ci, mk := range traceConfigs() {
		for seed := uint64(1); seed <= seeds; seed++ {
			name := fmt.Sprintf("cfg%02d-seed%d", ci, seed)
			pool := 12
			if ci >= 16 {
				pool = 400 // deep heaps
			}
			run := func() string {
				var sb strings.Builder
				runTrace(t, &sb, mk(), seed+uint64(ci)*1000, ops+int(seed)*200, pool)
				return sb.String()
			}
			out := run()
			var want string
			switch {
			case dir == "":
				want = run()
			case mode == "record":
				if err := os.WriteFile(filepath.Join(dir, name), []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				want = out
			default:
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				want = string(b)
			}
			if want != out {
				wl, gl := strings.Split(want, "\n"), strings.Split(out, "\n")
				for i := range min(len(wl), len(gl)) {
					if wl[i] != gl[i] {
						t.Errorf("%s: line %d differs:\nwant %s\ngot  %s", name, i+1, wl[i], gl[i])
						break
					}
				}
				if len(wl) != len(gl) {
					t.Errorf("%s: %d lines, want %d", name, len(gl), len(wl))
				}
			}
			if dir != "" {
				t.Logf("%s: %d bytes, sha256 %x", name, len(out), sha256.Sum256([]byte(out)))
			}
		}
	}
}

func traceConfigs() []func() Config {
	base := func() Config {
		return Config{
			MaxInflight: 3,
			Classes: []ClassConfig{
				{Name: "interactive", WaitBudget: 5 * time.Second},
				{Name: "batch", WaitBudget: 60 * time.Second},
			},
			Tenants: map[string]TenantConfig{
				"d0": {Weight: 1, Class: "interactive"},
				"d1": {Weight: 2, Class: "batch"},
				"d2": {Weight: 0.5, Class: "batch", MaxQueue: 6, MaxInflight: 2},
			},
			Default:      TenantConfig{Weight: 1, Class: "batch", MaxInflight: 2},
			ExpiryMargin: 200 * time.Millisecond,
		}
	}
	lim := func(qps, tpm float64) *quota.Limits {
		return quota.MustCompile(quota.Config{QPS: qps, TokensPerMin: tpm})
	}
	return []func() Config{
		func() Config { return base() },
		func() Config { // caps
			c := base()
			c.MaxInflightTokens = 6000
			c.MaxQueue = 40
			c.MaxQueueTokens = 60000
			c.MaxQueueBytes = 200000
			c.DefaultPerTenantMaxQueue = 5
			c.Default.MaxQueue = 20
			return c
		},
		func() Config { // requests, equal weights: ties
			c := base()
			c.CostUnit = CostRequests
			for n, tc := range c.Tenants {
				tc.Weight = 1
				c.Tenants[n] = tc
			}
			return c
		},
		func() Config { c := base(); c.CostUnit = CostRequests; return c },
		func() Config { c := base(); c.CostUnit = CostLearned; return c },
		func() Config { // budgets
			c := base()
			c.Admission = DefaultBudgetConfig()
			c.Admission.Throughput.Prior = 2000
			return c
		},
		func() Config { // budgets, cold
			c := base()
			c.Admission = DefaultBudgetConfig()
			c.Admission.BoostShareMax = 0.5
			c.MaxInflight = 8
			return c
		},
		func() Config { // degrade ladder
			c := base()
			c.MaxQueue = 30
			c.MaxQueueTokens = 40000
			c.DegradeHold = 100 * time.Millisecond
			c.Degrade = []degrade.Step{
				{Name: "L1", Trigger: 0.3, Recover: 0.2, Action: degrade.Action{Kind: degrade.ActionPause, Class: "batch"}},
				{Name: "L2", Trigger: 0.5, Recover: 0.3, Action: degrade.Action{Kind: degrade.ActionThrottle, Class: "interactive",
					Rate: degrade.Rate{PerSecond: 20}}},
				{Name: "L3", Trigger: 0.7, Recover: 0.5, Action: degrade.Action{Kind: degrade.ActionLightMode, Class: "batch", MaxTokens: 100}},
			}
			return c
		},
		func() Config { // circuit
			c := base()
			c.Circuit = &degrade.CircuitConfig{Order: []string{"free", "paid"}, Window: time.Second, Hold: time.Second}
			c.Default.Tier = "free"
			tc := c.Tenants["d1"]
			tc.Tier = "paid"
			c.Tenants["d1"] = tc
			c.Admission.Throughput.Prior = 500
			return c
		},
		func() Config { // account
			c := base()
			c.UpstreamQuota = &UpstreamQuota{RPM: 600, TPM: 300000, Burst: 2 * time.Second}
			tc := c.Tenants["d1"]
			tc.Reserve = 0.3
			c.Tenants["d1"] = tc
			return c
		},
		func() Config { // fallback
			c := base()
			c.Fallback = &FallbackConfig{Tenants: []string{"d0", "u1"}, MaxInflight: 1,
				UpstreamQuota: &UpstreamQuota{RPM: 300, TPM: 200000}}
			c.UpstreamQuota = &UpstreamQuota{RPM: 1200, TPM: 600000}
			c.Admission = DefaultBudgetConfig()
			return c
		},
		func() Config { // tenant quotas
			c := base()
			c.Default.Quota = lim(5, 60000)
			c.Default.QuotaAutoWeight = true
			tc := c.Tenants["d0"]
			tc.Quota = lim(3, 30000)
			tc.QuotaAutoWeight = true
			c.Tenants["d0"] = tc
			c.Admission.FastFail = true
			return c
		},
		func() Config { // idle path: wide capacity, short forgetting
			c := base()
			c.MaxInflight = 40
			c.IdleForget = 2 * time.Second
			return c
		},
		func() Config { // one slot, tight token cap
			c := base()
			c.MaxInflight = 1
			c.MaxInflightTokens = 3000
			c.ExpiryMargin = time.Second
			return c
		},
		func() Config { // one class, undeclared only
			c := base()
			c.Classes = c.Classes[1:]
			c.Tenants = nil
			c.Default.MaxInflight = 0
			c.MaxInflight = 6
			return c
		},
		func() Config { // everything
			c := base()
			c.MaxInflightTokens = 8000
			c.MaxQueue = 50
			c.MaxQueueTokens = 80000
			c.MaxQueueBytes = 300000
			c.Admission = DefaultBudgetConfig()
			c.Default.Quota = lim(8, 100000)
			c.UpstreamQuota = &UpstreamQuota{RPM: 2000, TPM: 900000}
			c.DegradeHold = 100 * time.Millisecond
			c.Degrade = []degrade.Step{{Name: "L1", Trigger: 0.4, Recover: 0.2,
				Action: degrade.Action{Kind: degrade.ActionPause, Class: "batch"}}}
			c.IdleForget = 3 * time.Second
			return c
		},
		func() Config { // many tenants: deep heaps
			c := base()
			c.Default.MaxInflight = 0
			c.Admission = DefaultBudgetConfig()
			return c
		},
		func() Config { // many tenants, requests: deep heaps full of ties
			c := base()
			c.CostUnit = CostRequests
			c.Default.MaxInflight = 0
			return c
		},
	}
}

type tracer struct {
	tb   testing.TB
	w    *strings.Builder
	q    *Queue
	clk  *ManualClock
	rng  *rand.Rand
	cfg  Config
	ids  map[*Ticket]int
	live []*Ticket // admitted and not known to have ended, in admission order
	// state as the events tell it: 'q' queued, 'i' in flight, 'e' ended
	state map[*Ticket]byte
	fresh int
	pool  int // undeclared names in use
	// closing collects the events of Close, which ends the queued tickets
	// in map order: they are logged sorted.
	closing []string
	closed  bool
}

func (tr *tracer) id(tk *Ticket) int {
	if id, ok := tr.ids[tk]; ok {
		return id
	}
	id := len(tr.ids) + 1
	tr.ids[tk] = id
	return id
}

func (tr *tracer) logf(format string, args ...any) {
	fmt.Fprintf(tr.w, format, args...)
	tr.w.WriteByte('\n')
}

func (tr *tracer) tm(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return fmt.Sprint(t.Sub(t0).Nanoseconds())
}

func (tr *tracer) ticket(tk *Ticket) string {
	st, ok := tk.QuotaStatus()
	// Info says in one read what the accessors say one by one, wherever
	// the trace looks at a ticket: zero before dispatch and after one
	// that never came.
	want := DispatchInfo{}
	if d := tk.Dispatched(); !d.IsZero() {
		want = DispatchInfo{Dispatched: d, Wait: d.Sub(tk.Enqueued()), ETA: tk.ETA(),
			Boosted: tk.Boosted(), Fallback: tk.Fallback(), Quota: ok}
	}
	if got := tk.Info(); got != want {
		tr.tb.Fatalf("ticket #%d: Info() = %+v, the accessors say %+v", tr.id(tk), got, want)
	}
	return fmt.Sprintf("#%d %s/%s cost=%d tok=%d dl=%s enq=%s disp=%s eta=%d boost=%v fb=%v qw=%d qr=%s qs=%v/%+v err=%s",
		tr.id(tk), tk.Tenant(), tk.Class(), tk.Cost(), tk.Tokens(), tr.tm(tk.Deadline()), tr.tm(tk.Enqueued()),
		tr.tm(tk.Dispatched()), tk.ETA(), tk.Boosted(), tk.Fallback(), tk.QuotaWait(), tk.QuotaReason(), ok, st, errString(tk.Err()))
}

func errString(err error) string {
	if err == nil {
		return "-"
	}
	if r, ok := err.(*Rejection); ok {
		c := *r
		c.QuotaStatus = nil
		qs := "-"
		if r.QuotaStatus != nil {
			qs = fmt.Sprintf("%+v", *r.QuotaStatus)
		}
		return fmt.Sprintf("%+v qs=%s", c, qs)
	}
	return err.Error()
}

func (tr *tracer) observe(ev Event, tk *Ticket) {
	switch ev {
	case EventDispatched:
		tr.state[tk] = 'i'
	default:
		tr.state[tk] = 'e'
	}
	if tr.closed {
		tr.closing = append(tr.closing, fmt.Sprintf("  ev %d %s", ev, tr.ticket(tk)))
		return
	}
	tr.logf("  ev %d %s", ev, tr.ticket(tk))
}

func (tr *tracer) dump() {
	q := tr.q
	s := q.Stats(false)
	tr.logf("  stats %+v water=%v bw=%v lvl=%d idle=%v", s, q.Water(), q.BackloggedWeight(), q.DegradeLevel(), q.Idle())
	q.mu.Lock()
	g := q.group
	tr.logf("  vt V=%v G=%v/%v/%v seq=%d boostCost=%d busy=%v/%v rate=%+v", q.vfloor, g.vt, g.credit, g.vfloor, q.flowSeq,
		q.adm.boostCost, q.busyTold, q.busyWas, q.adm.rate.Stats(q.clock.Now(), q.healthy))
	names := make([]string, 0, len(q.tenants))
	for n := range q.tenants {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		t := q.tenants[n]
		fmt.Fprintf(tr.w, "  t %s vt=%v cr=%v q=%d i=%d out=%v idle=%d", n, t.vt, t.credit, t.queued, t.inflight, t.out, t.idleSince)
		for _, f := range t.flows {
			fmt.Fprintf(tr.w, " [%s seq=%d in=%d out=%d n=%d %+v]", f.cq.name, f.seq, f.in, f.out, f.q.n, f.drain)
		}
		tr.w.WriteByte('\n')
	}
	q.mu.Unlock()
	if c := q.Circuit(); c.Configured {
		tr.logf("  circuit %+v", c)
	}
	if u := q.Upstream(); u.Configured {
		tr.logf("  upstream %+v", u)
	}
}

func (tr *tracer) pick(want byte) *Ticket {
	var c []*Ticket
	for _, tk := range tr.live {
		if tr.state[tk] == want {
			c = append(c, tk)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[tr.rng.IntN(len(c))]
}

func (tr *tracer) tenant() string {
	r := tr.rng.IntN(100)
	switch {
	case r < 30:
		return fmt.Sprintf("d%d", tr.rng.IntN(4)) // d3 is declared by some reloads only
	case r < 90:
		return fmt.Sprintf("u%d", tr.rng.IntN(tr.pool))
	default:
		tr.fresh++
		return fmt.Sprintf("x%d", tr.fresh)
	}
}

func (tr *tracer) reload() {
	cfg := tr.cfg
	cfg.Tenants = map[string]TenantConfig{}
	names := slices.Sorted(maps.Keys(tr.cfg.Tenants))
	for _, n := range names {
		tc := tr.cfg.Tenants[n]
		if tr.rng.IntN(4) > 0 {
			if tr.rng.IntN(3) == 0 {
				tc.Weight = []float64{0.5, 1, 2, 3}[tr.rng.IntN(4)]
			}
			cfg.Tenants[n] = tc
		}
	}
	for _, n := range []string{"d3", "u0", "u1", "u2"} {
		if tr.rng.IntN(2) == 0 {
			tc := cfg.Default
			tc.Weight = []float64{1, 1.5, 4}[tr.rng.IntN(3)]
			tc.Reserve = 0
			cfg.Tenants[n] = tc
		}
	}
	if tr.rng.IntN(3) == 0 {
		cfg.Default.Weight = []float64{0.5, 1, 2}[tr.rng.IntN(3)]
	}
	if tr.rng.IntN(4) == 0 {
		cfg.MaxInflight = max(1, tr.cfg.MaxInflight+tr.rng.IntN(3)-1)
	}
	err := tr.q.Reconfigure(cfg)
	tr.logf("reload %v tenants=%d dw=%v mi=%d", err, len(cfg.Tenants), cfg.Default.Weight, cfg.MaxInflight)
}

func runTrace(tb testing.TB, w *strings.Builder, cfg Config, seed uint64, ops, pool int) {
	clk := NewManualClock(t0)
	q, err := New(cfg, clk)
	if err != nil {
		tb.Fatal(err)
	}
	tr := &tracer{tb: tb, w: w, q: q, clk: clk, cfg: cfg, rng: rand.New(rand.NewPCG(seed, 77)),
		ids: map[*Ticket]int{}, state: map[*Ticket]byte{}, pool: pool}
	q.SetObserver(tr.observe)
	q.SetDegradeObserver(func(t degrade.Transition) { tr.logf("  degrade %+v", t) })
	q.SetCircuitObserver(func(e CircuitEvent) { tr.logf("  circuit-ev %+v", e) })
	q.SetHealthy(2)
	if cfg.Fallback != nil {
		q.SetFallbackHealthy(1)
	}
	classes := []string{"", "", "", "interactive", "batch", "nope"}
	for op := 0; op < ops; op++ {
		rng := tr.rng
		r := rng.IntN(1000)
		// Phases of 300 operations: in every other one requests arrive
		// rarely, so the queue runs empty and the idle path is taken.
		if pool > 12 && r >= 380 && r < 600 && rng.IntN(3) > 0 && (op/1500)%2 == 0 {
			r = rng.IntN(380) // more arrivals than completions: a long backlog
		} else if (op/300)%2 == 1 && r < 380 && rng.IntN(4) > 0 {
			r = 380 + rng.IntN(220) // a release instead
		}
		now := clk.Now()
		switch {
		case r < 380:
			req := Request{Tenant: tr.tenant(), Class: classes[rng.IntN(len(classes))],
				Cost:  []int64{0, 1, 50, 300, 1000, 2500, 7000, 100000}[rng.IntN(8)] + rng.Int64N(50),
				Bytes: rng.Int64N(20000)}
			req.Prompt = rng.Int64N(req.Cost + 1)
			switch rng.IntN(5 + 3*min(tr.pool/100, 1)) {
			case 0, 1:
				req.Deadline = now.Add(time.Duration(rng.Int64N(int64(20 * time.Second))))
			case 2:
				req.Deadline = now.Add(-time.Duration(rng.Int64N(int64(time.Second))))
			}
			if rng.IntN(2) == 0 {
				rej := q.PrecheckRequest(Request{Tenant: req.Tenant, Class: req.Class, Bytes: req.Bytes})
				tr.logf("precheck %s %s: %s", req.Tenant, req.Class, errString(rejErr(rej)))
			}
			tr.logf("enqueue %+v", req)
			tk, err := q.Enqueue(req)
			if err != nil {
				tr.logf("  refused %s", errString(err))
				break
			}
			if _, ok := tr.state[tk]; !ok {
				tr.state[tk] = 'q'
			}
			tr.live = append(tr.live, tk)
			tr.logf("  admitted %s", tr.ticket(tk))
			if tr.state[tk] == 'i' && rng.IntN(2) == 0 {
				tr.logf("  wait %s", errString(tk.Wait(context.Background())))
			}
		case r < 600:
			if tk := tr.pick('i'); tk != nil {
				actual := []int64{tk.Cost(), UnknownCost, 0, tk.Cost() / 2, tk.Cost() * 3}[rng.IntN(5)]
				tr.logf("release #%d %d", tr.id(tk), actual)
				tk.Release(actual)
			}
		case r < 650:
			if tk := tr.pick('q'); tk != nil {
				tr.logf("cancel #%d", tr.id(tk))
				tk.Release(0)
			}
		case r < 680:
			if tk := tr.pick('i'); tk != nil {
				ok := tk.Requeue()
				if ok {
					tr.state[tk] = 'q'
				}
				tr.logf("requeue #%d %v", tr.id(tk), ok)
			}
		case r < 710:
			if tk := tr.pick('q'); tk != nil {
				tr.logf("promote #%d %v", tr.id(tk), q.Promote(tk))
			}
		case r < 860:
			d := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
			clk.Advance(d)
			tr.logf("tick +%d", d)
			q.Tick()
		case r < 880:
			d := time.Duration(rng.Int64N(int64(90 * time.Second)))
			clk.Advance(d)
			tr.logf("jump +%d", d)
			if rng.IntN(2) == 0 {
				q.Tick()
			}
		case r < 900:
			n := []int{0, 1, 2, 2, 3, 2, 3, 2, 4, 2}[rng.IntN(10)]
			tr.logf("healthy %d", n)
			q.SetHealthy(n)
		case r < 910:
			n := rng.IntN(8) - 1
			tr.logf("slotlimit %d", n)
			q.SetSlotLimit(n)
		case r < 930:
			cls, p := []string{"interactive", "batch"}[rng.IntN(2)], rng.IntN(2) == 0
			tr.logf("pause %s %v", cls, p)
			q.SetPaused(cls, p)
		case r < 940:
			until := now.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
			if tk := tr.pick('i'); tk != nil && rng.IntN(2) == 0 {
				tr.logf("tk-exhausted #%d %s", tr.id(tk), tr.tm(until))
				tk.AccountExhausted(until)
			} else {
				tr.logf("exhausted %s", tr.tm(until))
				q.AccountExhausted(until)
			}
		case r < 950:
			wq := []float64{0.5, 1, 2, 4}[rng.IntN(4)]
			tr.logf("quotaweight %v", wq)
			q.SetQuotaWeight(wq)
		case r < 960:
			o, p := float64(rng.IntN(300)), []float64{0.1, 0.3, 1}[rng.IntN(3)]
			tr.logf("costmodel %v %v", o, p)
			q.SetCostModel(o, p)
		case r < 975:
			tr.reload()
		case r < 982:
			if cfg.Fallback != nil {
				n := rng.IntN(3)
				tr.logf("fbhealthy %d", n)
				q.SetFallbackHealthy(n)
			}
		case r < 992:
			s := q.TakeServed(nil)
			tr.logf("served %+v", s)
			if rng.IntN(2) == 0 {
				in := []Served{{Tenant: tr.tenant(), Cost: float64(rng.IntN(3000) - 500)}}
				tr.logf("remote %+v %d", in, q.ChargeRemote(in))
			}
		default:
			if tk := tr.pick('i'); tk != nil {
				tr.logf("wait #%d %s", tr.id(tk), errString(tk.Wait(context.Background())))
			}
		}
		if op%8 == 0 || r >= 860 {
			tr.dump()
		}
		// Forget tickets known to have ended.
		live := tr.live[:0]
		for _, tk := range tr.live {
			if tr.state[tk] != 'e' {
				live = append(live, tk)
			}
		}
		clear(tr.live[len(live):])
		tr.live = live
	}
	for _, tk := range tr.live {
		tr.logf("final %s", tr.ticket(tk))
	}
	tr.dump()
	tr.closed = true
	q.Close("end of trace")
	slices.Sort(tr.closing)
	for _, l := range tr.closing {
		tr.logf("%s", l)
	}
	tr.closed = false
	for _, tk := range tr.live {
		tk.Release(UnknownCost)
	}
	tr.dump()
}

func rejErr(r *Rejection) error {
	if r == nil {
		return nil
	}
	return r
}
