package caddyfairqueue

import (
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/history"
)

func init() {
	caddy.RegisterModule(Dashboard{})
	httpcaddyfile.RegisterHandlerDirective("fair_queue_dashboard", parseDashboardCaddyfile)
	// Before fair_queue, which answers every request it matches.
	httpcaddyfile.RegisterDirectiveOrder("fair_queue_dashboard", httpcaddyfile.After, "metrics")
}

// dashboardFiles is the page: HTML, script and style, no external assets.
//
//go:embed dashboard
var dashboardFiles embed.FS

// defaultRefresh is how often the page polls its state.
const defaultRefresh = 3 * time.Second

// Dashboard serves a live page of the fair queues' state and history.
// Mount it behind your own authentication:
//
//	handle_path /fair-queue/* {
//	    fair_queue_dashboard
//	}
//
// It answers GET <base>/ (the page) and GET <base>/api/state?queue=NAME&window=5m|1h|24h
// (the JSON the page polls).
type Dashboard struct {
	// Queue is the queue shown when a request names none. Default: the
	// only live queue, or "default" when there are several.
	Queue string `json:"queue,omitempty"`
	// Refresh is how often the page polls. Default: 3s.
	Refresh caddy.Duration `json:"refresh,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Dashboard) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue_dashboard",
		New: func() caddy.Module { return new(Dashboard) },
	}
}

// Provision sets defaults.
func (d *Dashboard) Provision(caddy.Context) error {
	if d.Refresh <= 0 {
		d.Refresh = caddy.Duration(defaultRefresh)
	}
	return nil
}

// UnmarshalCaddyfile sets up the dashboard from Caddyfile tokens. Syntax:
//
//	fair_queue_dashboard [<matcher>] {
//	    queue   <name>      # the queue shown when the page names none
//	    refresh <duration>  # how often the page polls; default 3s
//	}
func (d *Dashboard) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next() // the directive
	if disp.NextArg() {
		return disp.Errf("fair_queue_dashboard takes no arguments; options go in its block (queue, refresh)")
	}
	p := &cfParser{d: disp}
	return p.block("fair_queue_dashboard", func(opt string) error {
		if opt != "queue" && opt != "refresh" {
			return disp.Errf("fair_queue_dashboard: unknown option %q; valid options are queue and refresh", opt)
		}
		if !disp.NextArg() {
			return disp.ArgErr()
		}
		if opt == "queue" {
			d.Queue = disp.Val()
		} else {
			dur, err := caddy.ParseDuration(disp.Val())
			if err != nil || dur <= 0 {
				return disp.Errf("fair_queue_dashboard: refresh %q is not a positive duration such as 3s", disp.Val())
			}
			d.Refresh = caddy.Duration(dur)
		}
		if disp.NextArg() {
			return disp.Errf("fair_queue_dashboard: %s takes one argument", opt)
		}
		return nil
	})
}

func parseDashboardCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(Dashboard)
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

// ServeHTTP answers the page, its assets and its state, by relative URLs
// under any base path that ends in a slash; anything else is 404.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("the dashboard answers GET only"))
	}
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "+
		"img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'")
	p := r.URL.Path
	switch {
	case strings.HasSuffix(p, "/api/state"):
		return d.serveState(w, r)
	case p == "" || strings.HasSuffix(p, "/"):
		return serveAsset(w, r, "index.html")
	}
	switch name := path.Base(p); name {
	case "app.js", "style.css":
		return serveAsset(w, r, name)
	}
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no dashboard page at %s", p))
}

// serveAsset writes one embedded file.
func serveAsset(w http.ResponseWriter, r *http.Request, name string) error {
	b, err := fs.ReadFile(dashboardFiles, "dashboard/"+name)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	ct := map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
		".css": "text/css; charset=utf-8"}[path.Ext(name)]
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Method == http.MethodHead {
		return nil
	}
	_, err = w.Write(b)
	return err
}

// dashState is the JSON of GET <base>/api/state: the queue's live state
// and its history over the window.
type dashState struct {
	history.Report
	Queue  string   `json:"queue"`
	Queues []string `json:"queues"`
	// WindowName is the window asked for: 5m, 1h or 24h.
	WindowName  string       `json:"window"`
	Now         time.Time    `json:"now"`
	RefreshMS   int64        `json:"refresh_ms"`
	MemoryBytes int          `json:"history_memory_bytes"`
	Gateway     dashGateway  `json:"gateway"`
	Tenants     []dashTenant `json:"tenants"`
	Outcomes    []string     `json:"outcome_codes"`
	QuotaReason []string     `json:"quota_reasons"`
}

// dashTenant is one tenant row: its history over the window and its live
// state now.
type dashTenant struct {
	history.TenantReport
	Declared bool   `json:"declared"`
	Class    string `json:"class"`
	Tier     string `json:"tier,omitempty"`
	Queued   int    `json:"queued"`
	Inflight int    `json:"inflight"`
	// QuotaNow is each meter of the tenant's quota now; absent without
	// one and for _unknown, whose callers each have their own.
	QuotaNow []dashMeter `json:"quota_now,omitempty"`
	// QuotaWeightLearned: token_to_qps_weight auto.
	QuotaWeightLearned bool      `json:"quota_weight_learned,omitempty"`
	QuotaBurst         dashBurst `json:"quota_burst"`
}

// dashMeter is one quota meter (qps, tokens or joint) now, as the
// x-ratelimit-* headers report it.
type dashMeter struct {
	Meter        string  `json:"meter"`
	LimitPerMin  int64   `json:"limit_per_min"`
	Remaining    int64   `json:"remaining"`
	ResetSeconds float64 `json:"reset_seconds"`
}

// dashBurst is a quota's burst allowance.
type dashBurst struct {
	Allow         float64 `json:"allow"`
	WindowSeconds float64 `json:"window_seconds"`
}

// dashGateway is the gateway now.
type dashGateway struct {
	Capacity             int             `json:"capacity"`
	TokenCapacity        int64           `json:"token_capacity"`
	HealthyUpstreams     int             `json:"healthy_upstreams"`
	Queued               int             `json:"queued"`
	Inflight             int             `json:"inflight"`
	BoostedInflight      int             `json:"boosted_inflight"`
	Water                float64         `json:"water"`
	DegradeLevel         int             `json:"degrade_level"`
	Ladder               []dashStep      `json:"ladder"`
	Circuit              dashCircuit     `json:"circuit"`
	CostModel            costModelReport `json:"cost_model"`
	CostUnit             string          `json:"cost_unit"`
	LearnedWeightTenants []string        `json:"learned_weight_tenants"` // token_to_qps_weight auto
	BoostShareMax        float64         `json:"boost_share_max"`
	BoostBudgetHourly    int             `json:"boost_budget_hourly"`
}

// dashStep is one degrade ladder step with its lines.
type dashStep struct {
	Name    string  `json:"name"`
	Trigger float64 `json:"trigger"`
	Recover float64 `json:"recover"`
	Action  string  `json:"action"`
	Engaged bool    `json:"engaged"`
}

// dashCircuit is the circuit breaker now.
type dashCircuit struct {
	Configured bool       `json:"configured"`
	Level      int        `json:"level"`
	Trigger    float64    `json:"trigger"`
	Recover    float64    `json:"recover"`
	Capacity   float64    `json:"capacity"`
	Tierless   float64    `json:"tierless_demand"`
	Tiers      []dashTier `json:"tiers"`
}

// dashTier is one circuit tier.
type dashTier struct {
	Name   string  `json:"name"`
	Shed   bool    `json:"shed"`
	Demand float64 `json:"demand"`
}

// serveState answers the page's poll.
func (d *Dashboard) serveState(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	winName := cmp.Or(q.Get("window"), "5m")
	window, err := history.ParseWindow(winName)
	if err != nil {
		return writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	}
	live := liveQueues()
	s := pickQueue(live, q.Get("queue"), d.Queue)
	if s == nil {
		return writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no live fair_queue named %q", q.Get("queue"))})
	}
	st := dashboardState(s, window)
	st.WindowName = winName
	st.RefreshMS = time.Duration(d.Refresh).Milliseconds()
	for _, l := range live {
		st.Queues = append(st.Queues, l.name)
	}
	return writeJSON(w, http.StatusOK, st)
}

// writeJSON answers v as uncached JSON.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// liveQueues lists the live queues by name.
func liveQueues() []*sharedQueue {
	var live []*sharedQueue
	queues.Range(func(_, v any) bool {
		if s, ok := v.(*sharedQueue); ok && s != nil {
			live = append(live, s)
		}
		return true
	})
	sort.Slice(live, func(i, j int) bool { return live[i].name < live[j].name })
	return live
}

// pickQueue is the queue named by the request, else the configured one,
// else the only one, else "default", else the first; nil when the named
// one is not live.
func pickQueue(live []*sharedQueue, asked, configured string) *sharedQueue {
	name := cmp.Or(asked, configured)
	if name == "" && len(live) == 1 {
		return live[0]
	}
	for _, s := range live {
		if s.name == cmp.Or(name, "default") {
			return s
		}
	}
	if name == "" && len(live) > 0 {
		return live[0]
	}
	return nil
}

// dashboardState reads one queue's live state and its history over
// window.
func dashboardState(s *sharedQueue, window time.Duration) dashState {
	cfg := s.q.Config()
	stats := s.q.Stats(true)
	circ := s.q.Circuit()
	level := s.q.DegradeLevel()

	params := map[string]history.TenantParams{unknownTenantLabel: tenantParams(cfg.Default, true)}
	learned := []string{}
	for name, tc := range cfg.Tenants {
		params[name] = tenantParams(tc, false)
		if tc.Quota != nil && tc.QuotaAutoWeight {
			learned = append(learned, name)
		}
	}
	sort.Strings(learned)
	rep := s.hist.Query(window, params)

	now := loadByLabel(stats.Tenants)
	st := dashState{Report: rep, Queue: s.name, Now: time.Now().UTC(), MemoryBytes: s.hist.MemoryBytes(),
		Outcomes: history.Outcomes[:], QuotaReason: history.QuotaReasons[:]}
	st.Tenants = make([]dashTenant, 0, len(rep.Tenants))
	for _, tr := range rep.Tenants {
		tc, declared := cfg.Tenants[tr.Name]
		if !declared {
			tc = cfg.Default
		}
		dt := dashTenant{TenantReport: tr, Declared: declared, Class: tc.Class, Tier: tc.Tier}
		if l := now[tr.Name]; l != nil {
			dt.Queued, dt.Inflight = l.queued, l.inflight
		}
		if tc.Quota != nil {
			qc := tc.Quota.Config()
			dt.QuotaWeightLearned = tc.QuotaAutoWeight
			dt.QuotaBurst = dashBurst{Allow: qc.BurstAllow, WindowSeconds: qc.BurstWindow.Seconds()}
			if declared {
				dt.QuotaNow = quotaNow(s.q, tr.Name)
			}
		}
		st.Tenants = append(st.Tenants, dt)
	}
	st.Report.Tenants = nil // replaced by st.Tenants

	g := dashGateway{Capacity: stats.Capacity, TokenCapacity: stats.TokenCapacity,
		HealthyUpstreams: stats.Healthy, Queued: stats.Queued, Inflight: stats.Inflight,
		BoostedInflight: stats.BoostedInflight, Water: stats.Water, DegradeLevel: level,
		Ladder: []dashStep{}, BoostShareMax: cfg.Admission.BoostShareMax,
		BoostBudgetHourly: cfg.Admission.PerTenantBoostHourly, CostModel: newCostModelReport(s.cost.Fit()),
		CostUnit: cfg.CostUnit.String(), LearnedWeightTenants: learned}
	for i, step := range cfg.Degrade {
		g.Ladder = append(g.Ladder, dashStep{Name: step.Name, Trigger: step.Trigger, Recover: step.Recover,
			Action: step.Action.String(), Engaged: i < level})
	}
	g.Circuit = dashCircuit{Configured: circ.Configured, Level: circ.Level, Capacity: circ.Capacity,
		Tierless: circ.Tierless, Tiers: []dashTier{}}
	if cc := cfg.Circuit; cc != nil {
		g.Circuit.Trigger = cmp.Or(cc.Trigger, degrade.DefaultCircuitTrigger)
		g.Circuit.Recover = cmp.Or(cc.Recover, degrade.DefaultCircuitRecover)
	}
	for i, tier := range circ.Tiers {
		g.Circuit.Tiers = append(g.Circuit.Tiers, dashTier{Name: tier, Shed: circ.Shed[i], Demand: circ.Demand[i]})
	}
	st.Gateway = g
	return st
}

// tenantParams is what the history needs of a tenant's settings: its
// weight and its quota's limits, per caller for default_tenant's.
func tenantParams(tc fairqueue.TenantConfig, perCaller bool) history.TenantParams {
	p := history.TenantParams{Weight: tc.Weight, PerCaller: perCaller}
	if tc.Quota != nil {
		qc := tc.Quota.Config()
		p.QPS, p.TokensPerMin, p.TokenWeight = qc.QPS, qc.TokensPerMin, qc.TokenToQPSWeight
		if qc.JointCap > 0 {
			p.JointPerSec = qc.QPS * qc.JointCap
		}
	}
	return p
}

// quotaNow is tenant's standing on each meter of its quota now.
func quotaNow(q *fairqueue.Queue, tenant string) []dashMeter {
	st, ok := q.QuotaStatus(tenant)
	if !ok {
		return nil
	}
	var out []dashMeter
	for _, d := range quotaDims {
		if m := st.Meter(d); m.Enabled {
			out = append(out, dashMeter{Meter: string(d), LimitPerMin: m.Limit, Remaining: m.Remaining,
				ResetSeconds: m.Reset.Seconds()})
		}
	}
	return out
}

// history is the record the dashboard shows of h's queue; nil (which
// ignores records) before h is provisioned.
func (h *Handler) history() *history.History {
	if h.shared == nil {
		return nil
	}
	return h.shared.hist
}

// declaredTenants lists cfg's declared tenants, the ones the history
// keeps under their own names.
func declaredTenants(cfg fairqueue.Config) []string { return slices.Collect(maps.Keys(cfg.Tenants)) }

// sampler holds the tick's buffers for the backlogged tenants, reused
// from tick to tick (only the tick goroutine samples).
type sampler struct {
	names  []string
	owners []history.Backlogged
}

// sample records the gateway's state in the history, on every tick, with
// the tenants that have work waiting (for the fair shares). h is the
// handler whose config is in force (nil: none yet).
func (s *sharedQueue) sample(h *Handler) {
	st := s.q.Stats(false)
	smp := &s.sampler
	smp.owners = smp.owners[:0]
	if h != nil {
		var undeclared bool
		smp.names, undeclared = s.q.AppendBacklogged(smp.names[:0])
		for _, name := range smp.names {
			if tc, ok := h.qcfg.Tenants[name]; ok {
				smp.owners = append(smp.owners, history.Backlogged{Tenant: name, Weight: tc.Weight})
			}
		}
		if undeclared {
			smp.owners = append(smp.owners, history.Backlogged{Tenant: unknownTenantLabel, Weight: h.qcfg.Default.Weight})
		}
	}
	s.hist.Sample(history.Sample{Capacity: st.Capacity, Healthy: st.Healthy, Water: st.Water,
		DegradeLevel: s.q.DegradeLevel(), CircuitLevel: s.q.Circuit().Level, Backlogged: smp.owners})
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Dashboard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Dashboard)(nil)
	_ caddyfile.Unmarshaler       = (*Dashboard)(nil)
)
