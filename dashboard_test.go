package caddyfairqueue

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/history"
)

// loadDashboard provisions a dashboard module the way a config load does.
func loadDashboard(tb testing.TB, cfg string) *Dashboard {
	tb.Helper()
	ctx, cancel := configContext(tb)
	tb.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.fair_queue_dashboard", json.RawMessage(cfg))
	if err != nil {
		tb.Fatalf("provisioning fair_queue_dashboard: %v", err)
	}
	return mod.(*Dashboard)
}

// dashCall serves one request through d and returns what Caddy would
// answer: the handler's error status, or what it wrote.
func dashCall(tb testing.TB, d *Dashboard, method, target string) (int, http.Header, []byte) {
	tb.Helper()
	rec := httptest.NewRecorder()
	err := d.ServeHTTP(rec, httptest.NewRequest(method, target, nil), nil)
	if err != nil {
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) {
			tb.Fatalf("%s %s: error %v is not a caddyhttp.HandlerError", method, target, err)
		}
		return he.StatusCode, rec.Header(), nil
	}
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

// stateJSON is the part of api/state the tests read.
type stateJSON struct {
	Queue        string   `json:"queue"`
	Queues       []string `json:"queues"`
	Window       string   `json:"window"`
	WindowSecs   float64  `json:"window_seconds"`
	Jain         float64  `json:"jain"`
	JainTenants  int      `json:"jain_tenants"`
	MemoryBytes  int      `json:"history_memory_bytes"`
	BucketBounds []float64
	RefreshMS    int64 `json:"refresh_ms"`
	Gateway      struct {
		Capacity int `json:"capacity"`
		Healthy  int `json:"healthy_upstreams"`
		Ladder   []struct {
			Name    string  `json:"name"`
			Trigger float64 `json:"trigger"`
			Recover float64 `json:"recover"`
			Action  string  `json:"action"`
		} `json:"ladder"`
		Circuit struct {
			Configured bool `json:"configured"`
		} `json:"circuit"`
		BoostBudgetHourly    int       `json:"boost_budget_hourly"`
		CostUnit             string    `json:"cost_unit"`
		LearnedWeightTenants *[]string `json:"learned_weight_tenants"`
	} `json:"gateway"`
	Tenants []struct {
		Name          string           `json:"name"`
		Declared      bool             `json:"declared"`
		Weight        float64          `json:"weight"`
		Requests      int64            `json:"requests"`
		Served        int64            `json:"served"`
		Outcomes      map[string]int64 `json:"outcomes"`
		SuccessRate   float64          `json:"success_rate"`
		ServedTokens  int64            `json:"served_tokens"`
		Share         float64          `json:"share"`
		FairShare     float64          `json:"fair_share"`
		WaitHistogram []uint64         `json:"wait_histogram"`
		Wait          struct {
			Count int64   `json:"count"`
			P50   float64 `json:"p50"`
		} `json:"wait"`
		Quota struct {
			QPSLimit            float64                      `json:"qps_limit"`
			TokensPerMinLimit   float64                      `json:"tokens_per_min_limit"`
			JointLimit          float64                      `json:"joint_limit"`
			TokenWeight         float64                      `json:"token_to_qps_weight"`
			PerCaller           bool                         `json:"per_caller"`
			ChargedTokensPerMin float64                      `json:"charged_tokens_per_min"`
			QPSOccupancy        float64                      `json:"qps_occupancy"`
			Hits                map[string]history.QuotaHits `json:"hits"`
		} `json:"quota"`
		QuotaNow []dashMeter `json:"quota_now"`
	} `json:"tenants"`
	Series      []history.Point      `json:"series"`
	Transitions []history.Transition `json:"transitions"`
}

func getState(tb testing.TB, d *Dashboard, target string) stateJSON {
	tb.Helper()
	status, hdr, body := dashCall(tb, d, http.MethodGet, target)
	if status != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		tb.Fatalf("GET %s: %d %s %s", target, status, hdr.Get("Content-Type"), body)
	}
	var st stateJSON
	if err := json.Unmarshal(body, &st); err != nil {
		tb.Fatalf("GET %s: %v\n%s", target, err, body)
	}
	return st
}

func TestDashboardCaddyfile(t *testing.T) {
	var d Dashboard
	if err := d.UnmarshalCaddyfile(caddyfile.NewTestDispenser("fair_queue_dashboard {\nqueue gpu\nrefresh 2s\n}")); err != nil {
		t.Fatal(err)
	}
	if d.Queue != "gpu" || time.Duration(d.Refresh) != 2*time.Second {
		t.Fatalf("parsed %+v", d)
	}
	for _, c := range []struct{ in, want string }{
		{"fair_queue_dashboard extra", "takes no arguments"},
		{"fair_queue_dashboard {\nnope 1\n}", `unknown option "nope"; valid options are queue and refresh`},
		{"fair_queue_dashboard {\nrefresh soon\n}", "not a positive duration"},
		{"fair_queue_dashboard {\nqueue a b\n}", "queue takes one argument"},
		{"fair_queue_dashboard {\nqueue a\nqueue b\n}", "queue given twice"},
	} {
		var d Dashboard
		err := d.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
}

// Written after fair_queue in a site, the dashboard's route still comes
// first (fair_queue answers every request it matches), and its options
// reach the JSON.
func TestDashboardCaddyfileDirectiveOrder(t *testing.T) {
	routes, adapted := adaptRoutes(t, `:8080 {
	fair_queue {
		reverse_proxy localhost:8001
	}
	fair_queue_dashboard /fair-queue/* {
		queue default
		refresh 5s
	}
}
`)
	if len(routes) != 2 {
		t.Fatalf("want 2 routes, got %s", adapted)
	}
	if !strings.Contains(string(routes[0]), `"handler":"fair_queue_dashboard","queue":"default","refresh":5000000000`) ||
		!strings.Contains(string(routes[1]), `"handler":"fair_queue"`) {
		t.Errorf("routes out of order or options lost:\n%s\n%s", routes[0], routes[1])
	}
}

func TestDashboardPageAndAssets(t *testing.T) {
	d := loadDashboard(t, `{}`)
	if time.Duration(d.Refresh) != defaultRefresh {
		t.Errorf("default refresh %v", time.Duration(d.Refresh))
	}
	for _, c := range []struct {
		target, ctype, contains string
	}{
		{"/", "text/html; charset=utf-8", `<script src="app.js" defer></script>`},
		{"/fair-queue/", "text/html; charset=utf-8", `id="chart-water"`},
		{"/fair-queue/app.js", "text/javascript; charset=utf-8", `"api/state?"`},
		{"/style.css", "text/css; charset=utf-8", ".line-trigger"},
	} {
		status, hdr, body := dashCall(t, d, http.MethodGet, c.target)
		if status != http.StatusOK || hdr.Get("Content-Type") != c.ctype || !strings.Contains(string(body), c.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", c.target, status, hdr.Get("Content-Type"), c.contains,
				strings.Contains(string(body), c.contains))
		}
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: CSP %q", c.target, csp)
		}
	}
	// Nothing on the page may load from elsewhere.
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := dashboardFiles.ReadFile("dashboard/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if s := string(b); strings.Contains(s, "http://") && !strings.Contains(s, `"http://www.w3.org/2000/svg"`) ||
			strings.Contains(s, "https://") || strings.Contains(s, "//cdn") {
			t.Errorf("%s refers to an external URL", name)
		}
	}
	if status, _, _ := dashCall(t, d, http.MethodGet, "/nope.txt"); status != http.StatusNotFound {
		t.Errorf("GET /nope.txt: %d, want 404", status)
	}
	if status, hdr, _ := dashCall(t, d, http.MethodPost, "/api/state"); status != http.StatusMethodNotAllowed || hdr.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d Allow %q, want 405 GET, HEAD", status, hdr.Get("Allow"))
	}
	if status, _, body := dashCall(t, d, http.MethodGet, "/api/state?window=7d"); status != http.StatusBadRequest ||
		!strings.Contains(string(body), "use 5m, 1h or 24h") {
		t.Errorf("window 7d: %d %s", status, body)
	}
	if status, _, body := dashCall(t, d, http.MethodGet, "/api/state?queue=no_such_queue"); status != http.StatusNotFound ||
		!strings.Contains(string(body), `no live fair_queue named \"no_such_queue\"`) {
		t.Errorf("unknown queue: %d %s", status, body)
	}
}

// The state endpoint reports what went through the handler: outcomes by
// tenant (undeclared ones under _unknown), served tokens and shares,
// quota refusals by meter, the ladder's lines and the gateway.
func TestDashboardState(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":4,
		"tenants":{"alpha":{"weight":3},"beta":{"weight":1,"class":"realtime","quota":{"tokens_per_min":60,"burst_allow":0}}},
		"default_tenant":{"weight":1,"quota":{"qps":50,"token_to_qps_weight":0.001}},
		"degrade":{"steps":[{"name":"L1","trigger":0.7,"recover":0.6,"action":"pause","class":"batch"}]}`))
	g := newGateway(t, h)
	served := map[string]int{}
	quotaRefused := 0
	for i, tenant := range []string{"alpha", "alpha", "beta", "alpha", "stranger", "beta", "beta", "other"} {
		res := g.post(tenant, chatBody(""))
		g.entry(res)
		switch {
		case res.status == http.StatusOK:
			served[tenant]++
		case res.status == http.StatusTooManyRequests && strings.Contains(string(res.body), "quota_exceeded"):
			quotaRefused++
		default:
			t.Fatalf("request %d (%s): %d %s", i, tenant, res.status, res.body)
		}
	}
	if quotaRefused == 0 {
		t.Fatalf("no request was refused by beta's 60 tokens/min quota (served %v)", served)
	}
	// One malformed request: an outcome that is not served.
	if res := g.post("alpha", []byte(`{"model":`)); res.status != http.StatusBadRequest {
		t.Fatalf("malformed body: %d", res.status)
	}

	d := loadDashboard(t, `{"refresh":"2s"}`)
	st := getState(t, d, "/fair-queue/api/state?window=1h&queue="+name)
	if st.Queue != name || st.Window != "1h" || st.WindowSecs != 3600 || st.RefreshMS != 2000 {
		t.Errorf("queue %q window %q (%gs) refresh %dms", st.Queue, st.Window, st.WindowSecs, st.RefreshMS)
	}
	if st.Gateway.Capacity != 4 || st.Gateway.Healthy != 1 {
		t.Errorf("gateway capacity %d healthy %d, want 4 and 1", st.Gateway.Capacity, st.Gateway.Healthy)
	}
	if len(st.Gateway.Ladder) != 1 || st.Gateway.Ladder[0].Trigger != 0.7 || st.Gateway.Ladder[0].Recover != 0.6 ||
		st.Gateway.Ladder[0].Action != "pause batch" {
		t.Errorf("ladder %+v", st.Gateway.Ladder)
	}
	if st.Gateway.Circuit.Configured || st.Gateway.BoostBudgetHourly != 200 {
		t.Errorf("circuit configured %v, boost budget %d", st.Gateway.Circuit.Configured, st.Gateway.BoostBudgetHourly)
	}
	// alpha, beta and _unknown rings: the fixed part and three tenants.
	if st.MemoryBytes != history.FixedBytes+3*history.TenantBytes {
		t.Errorf("history memory %d, want %d", st.MemoryBytes, history.FixedBytes+3*history.TenantBytes)
	}
	byName := map[string]int{}
	for i, tr := range st.Tenants {
		byName[tr.Name] = i
	}
	if len(st.Tenants) != 3 {
		t.Fatalf("tenants %v, want alpha, beta, _unknown", byName)
	}
	tokensPer := int64(u.prompt + u.completion)
	alpha, beta, unknown := st.Tenants[byName["alpha"]], st.Tenants[byName["beta"]], st.Tenants[byName[unknownTenantLabel]]
	if alpha.Served != 3 || alpha.Requests != 4 || alpha.Outcomes["invalid_request"] != 1 || alpha.SuccessRate != 0.75 ||
		alpha.ServedTokens != 3*tokensPer || alpha.Wait.Count != 3 || len(alpha.WaitHistogram) != history.NumBuckets {
		t.Errorf("alpha %+v, want 3 of 4 served (one invalid_request), %d tokens", alpha, 3*tokensPer)
	}
	if unknown.Served != 2 || unknown.Declared || unknown.ServedTokens != 2*tokensPer {
		t.Errorf("_unknown %+v, want the 2 undeclared tenants' requests served", unknown)
	}
	if int(beta.Served) != served["beta"] || int(beta.Outcomes["quota_exceeded"]) != quotaRefused ||
		beta.Quota.Hits["tokens"].Refused != int64(quotaRefused) || beta.Quota.TokensPerMinLimit != 60 ||
		beta.Quota.ChargedTokensPerMin <= 0 || beta.Quota.JointLimit != 0 || beta.Quota.PerCaller {
		t.Errorf("beta %+v, want %d served and %d quota_exceeded (tokens) against 60 tokens/min", beta, served["beta"], quotaRefused)
	}
	// Its standing now: the token meter, 60 a minute, in debt.
	if len(beta.QuotaNow) != 1 || beta.QuotaNow[0].Meter != "tokens" || beta.QuotaNow[0].LimitPerMin != 60 || beta.QuotaNow[0].ResetSeconds <= 0 {
		t.Errorf("beta's quota now %+v, want the token meter at 60/min with a debt", beta.QuotaNow)
	}
	// The undeclared tenants' quota binds each caller: its limits (the
	// joint one at qps x joint_cap 1.0), no occupancy, no standing now.
	if q := unknown.Quota; q.QPSLimit != 50 || q.JointLimit != 50 || q.TokenWeight != 0.001 || !q.PerCaller || q.QPSOccupancy != 0 || unknown.QuotaNow != nil {
		t.Errorf("_unknown quota %+v (now %+v), want qps and joint 50 per caller, weight 0.001, no occupancy", q, unknown.QuotaNow)
	}
	if g := st.Gateway; g.CostUnit != "estimated_tokens" || g.LearnedWeightTenants == nil || len(*g.LearnedWeightTenants) != 0 {
		t.Errorf("gateway cost unit %q, learned-weight tenants %v; want estimated_tokens and an empty list", g.CostUnit, g.LearnedWeightTenants)
	}
	// One request at a time: nobody ever waited, so each tenant was owed
	// what it used, whatever the weights (its fair share is its share),
	// once the queue's tick (50 ms) has settled the last request.
	eventually(t, "the tick to settle the fair shares", func() bool {
		st = getState(t, d, "/fair-queue/api/state?window=1h&queue="+name)
		return st.JainTenants == 3
	})
	total := float64((alpha.Served + beta.Served + unknown.Served) * tokensPer)
	for _, tr := range st.Tenants {
		want := float64(int64(served[tr.Name])*tokensPer) / total
		if tr.Name == unknownTenantLabel {
			want = float64(unknown.Served*tokensPer) / total
		}
		if tr.Name == "alpha" {
			want = float64(3*tokensPer) / total
		}
		if math.Abs(tr.Share-want) > 1e-12 || math.Abs(tr.FairShare-want) > 1e-12 {
			t.Errorf("%s share %g, fair share %g; want both %g", tr.Name, tr.Share, tr.FairShare, want)
		}
	}
	if math.Abs(st.Jain-1) > 1e-12 {
		t.Errorf("Jain %g over %d, want 1: nobody waited for anybody", st.Jain, st.JainTenants)
	}

	// Transitions reach the timeline through the handler's hooks.
	at := time.Now()
	h.onTransition(degrade.Transition{Step: "L1", From: 0, To: 1, Up: true, Water: 0.71, At: at})
	h.onCircuit(fairqueue.CircuitEvent{CircuitTransition: degrade.CircuitTransition{Tier: "low", From: 0, To: 1, Up: true, Ratio: 1.4, At: at}})
	// The queue's tick samples the gateway (every 50 ms).
	eventually(t, "a gateway sample", func() bool {
		st = getState(t, d, "/api/state?queue="+name)
		return len(st.Series) > 0
	})
	if len(st.Transitions) != 2 || st.Transitions[0].Kind != "degrade" || st.Transitions[0].Value != 0.71 ||
		st.Transitions[1].Kind != "circuit" || st.Transitions[1].Name != "low" {
		t.Errorf("transitions %+v", st.Transitions)
	}
	if st.Window != "5m" || len(st.Series) == 0 || st.Series[len(st.Series)-1].Capacity != 4 {
		t.Errorf("5m window %q, series %+v: want per-second samples from the tick with capacity 4", st.Window, st.Series)
	}
}

// The history lives with the queue: a reload that keeps the queue's name
// keeps what it recorded, and follows the new config's tenants.
func TestDashboardHistorySurvivesReload(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h1, stop1 := mustLoad(t, fqConfig(name, u, `"tenants":{"alpha":{"weight":1},"beta":{"weight":1}}`))
	g := newGateway(t, h1)
	for range 3 {
		g.entry(g.post("alpha", chatBody("")))
	}
	g.entry(g.post("beta", chatBody("")))
	h2, _ := mustLoad(t, fqConfig(name, u, `"tenants":{"alpha":{"weight":2}}`))
	stop1()
	if h2.shared != h1.shared {
		t.Fatal("the reload made a new queue")
	}
	d := loadDashboard(t, `{}`)
	st := getState(t, d, "/api/state?window=24h&queue="+name)
	var names []string
	for _, tr := range st.Tenants {
		names = append(names, tr.Name)
		if tr.Name == "alpha" && (tr.Served != 3 || tr.Weight != 2) {
			t.Errorf("alpha after reload: served %d weight %g, want 3 and the new weight 2", tr.Served, tr.Weight)
		}
	}
	// beta is no longer declared: its ring is dropped.
	if fmt.Sprint(names) != fmt.Sprint([]string{unknownTenantLabel, "alpha"}) {
		t.Errorf("tenants after reload %v, want [_unknown alpha]", names)
	}
}

// Observed cost of one poll over 24 hours of history, ten tenants and
// _unknown: the query merges 11 x 1440 minutes.
func BenchmarkDashboardState(b *testing.B) {
	u := newFakeUpstream(b)
	name := queueName(b)
	tenants := make([]string, 10)
	var cfg []string
	for i := range tenants {
		tenants[i] = fmt.Sprintf("t%d", i)
		cfg = append(cfg, fmt.Sprintf(`"t%d":{"weight":%d}`, i, i+1))
	}
	h, _ := mustLoad(b, fqConfig(name, u, `"tenants":{`+strings.Join(cfg, ",")+`}`))
	clock := time.Now().Add(-24 * time.Hour)
	hist := history.New(func() time.Time { return clock }, tenants)
	for m := range history.Minutes {
		clock = clock.Add(time.Minute)
		for i, tn := range append(tenants, "someone") {
			hist.Outcome(tn, history.Answer{Code: "served", Wait: time.Duration(m%100+i) * time.Millisecond, Tokens: 100})
		}
		hist.Sample(history.Sample{Capacity: 16, Healthy: 1, Water: 0.1})
	}
	// The queue's own history runs on the real clock; a copy of its
	// shared state carries the filled one.
	s := &sharedQueue{name: name, q: h.shared.q, hist: hist, cost: h.shared.cost}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		st := dashboardState(s, 24*time.Hour)
		if err := json.NewEncoder(io.Discard).Encode(st); err != nil {
			b.Fatal(err)
		}
	}
}

// A request's dispatch facts (boost, promised wait) reach the history with
// its outcome, in the one record of its answer; a request answered without
// a dispatch records neither.
func TestHistoryRecordsDispatchWithOutcome(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"tenants":{"alpha":{"weight":1}}`))
	served := &admission{tenant: "alpha", label: "alpha", m: h.metrics.of("alpha"),
		boosted: true, eta: 2 * time.Second}
	h.record(served, outcomeServed, time.Second)
	gone := &admission{tenant: "alpha", label: "alpha", m: h.metrics.of("alpha"),
		eta: time.Second}
	h.record(gone, outcomeClientGone, 2*time.Second)
	refused := &admission{tenant: "alpha", label: "alpha", m: h.metrics.of("alpha")}
	h.record(refused, "queue_timeout", 3*time.Second)

	r := h.history().Query(time.Hour, nil)
	if len(r.Tenants) != 1 {
		t.Fatalf("tenants %+v, want alpha", r.Tenants)
	}
	a := r.Tenants[0]
	// ETA ratios 2/1 and 1/2: mean 1.25, mean |ln| ln 2.
	if a.Requests != 3 || a.Served != 1 || a.Boosts != 1 || a.ETA.Count != 2 ||
		math.Abs(a.ETA.MeanRatio-1.25) > 1e-12 || math.Abs(a.ETA.MeanAbsLogError-math.Ln2) > 1e-12 {
		t.Errorf("alpha %+v: want 3 requests, 1 served, 1 boost, ETA over the 2 dispatched (mean ratio 1.25)", a)
	}
}
