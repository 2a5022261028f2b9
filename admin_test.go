package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// adminCall runs the report route the way Caddy's admin mux would, and
// returns the status it would answer with (the APIError's, or 200).
func adminCall(t *testing.T, method, target string) (int, []byte) {
	t.Helper()
	mod, err := caddy.GetModule("admin.api.fair_queue")
	if err != nil {
		t.Fatalf("admin module not registered: %v", err)
	}
	router, ok := mod.New().(caddy.AdminRouter)
	if !ok {
		t.Fatalf("admin.api.fair_queue is not an AdminRouter")
	}
	var route *caddy.AdminRoute
	for i, r := range router.Routes() {
		if r.Pattern == "/fair_queue/report" {
			route = &router.Routes()[i]
		}
	}
	if route == nil {
		t.Fatalf("no /fair_queue/report route")
	}
	rec := httptest.NewRecorder()
	err = route.Handler.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	if err != nil {
		apiErr, ok := err.(caddy.APIError)
		if !ok {
			t.Fatalf("%s %s: error %v is not a caddy.APIError", method, target, err)
		}
		return apiErr.HTTPStatus, []byte(apiErr.Error())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	return rec.Code, rec.Body.Bytes()
}

func TestAdminModuleLoadedWithAdminAPI(t *testing.T) {
	// Caddy's admin server instantiates every module in the admin.api
	// namespace; being there is what makes the route exist.
	found := false
	for _, m := range caddy.GetModules("admin.api") {
		if m.ID == "admin.api.fair_queue" {
			found = true
		}
	}
	if !found {
		t.Fatal("admin.api.fair_queue is not in the admin.api namespace")
	}
}

func TestAdminReport(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u,
		`"tenants":{"alpha":{"weight":3},"beta":{"weight":1}},"default_tenant":{"weight":2}`))
	g := newGateway(t, h)
	for i, tenant := range []string{"alpha", "beta", "alpha", "stranger", "beta", "alpha"} {
		res := g.post(tenant, chatBody(""))
		if res.err != nil || res.status != http.StatusOK {
			t.Fatalf("request %d (%s): status %d err %v body %s", i, tenant, res.status, res.err, res.body)
		}
		g.entry(res) // the handler returned: served is back-filled
	}

	status, body := adminCall(t, http.MethodGet, "/fair_queue/report?queue="+name)
	if status != http.StatusOK {
		t.Fatalf("GET report: status %d: %s", status, body)
	}
	var reports []queueReport
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&reports); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if len(reports) != 1 || reports[0].Name != name {
		t.Fatalf("want exactly queue %q, got %s", name, body)
	}
	qr := reports[0]
	if qr.HealthyUpstreams != 1 || qr.Capacity != 16 || qr.Queued != 0 || qr.Inflight != 0 || qr.DegradeLevel != 0 {
		t.Errorf("queue fields: %+v", qr)
	}

	// The raw JSON carries every documented key.
	var raw []map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "healthy_upstreams", "capacity", "token_capacity", "queued",
		"queued_tokens", "inflight", "boosted_inflight", "water", "degrade_level", "tenants"} {
		if _, ok := raw[0][k]; !ok {
			t.Errorf("queue key %q missing: %s", k, body)
		}
	}
	tenantsRaw, _ := raw[0]["tenants"].([]any)
	if len(tenantsRaw) == 0 {
		t.Fatalf("no tenants: %s", body)
	}
	for _, k := range []string{"name", "declared", "weight", "queued", "queued_tokens", "inflight",
		"served_tokens", "share", "weighted_fair_share", "virtual_time"} {
		if _, ok := tenantsRaw[0].(map[string]any)[k]; !ok {
			t.Errorf("tenant key %q missing: %s", k, body)
		}
	}

	want := map[string]struct {
		declared bool
		weight   float64
	}{"alpha": {true, 3}, "beta": {true, 1}, "stranger": {false, 2}}
	if len(qr.Tenants) != len(want) {
		t.Fatalf("tenants = %+v, want %v", qr.Tenants, want)
	}
	if !sort.SliceIsSorted(qr.Tenants, func(i, j int) bool { return qr.Tenants[i].Name < qr.Tenants[j].Name }) {
		t.Errorf("tenants not sorted: %+v", qr.Tenants)
	}
	var share, fair, served float64
	for _, tr := range qr.Tenants {
		w, ok := want[tr.Name]
		if !ok {
			t.Errorf("unexpected tenant %q", tr.Name)
			continue
		}
		if tr.Declared != w.declared || tr.Weight != w.weight {
			t.Errorf("tenant %s: declared=%v weight=%v, want %v %v", tr.Name, tr.Declared, tr.Weight, w.declared, w.weight)
		}
		if tr.ServedTokens <= 0 || tr.Queued != 0 || tr.Inflight != 0 {
			t.Errorf("tenant %s: %+v", tr.Name, tr)
		}
		if wantFair := w.weight / 6; math.Abs(tr.WeightedFairShare-wantFair) > 1e-9 {
			t.Errorf("tenant %s: weighted_fair_share %v, want %v", tr.Name, tr.WeightedFairShare, wantFair)
		}
		share += tr.Share
		fair += tr.WeightedFairShare
		served += tr.ServedTokens
	}
	if math.Abs(share-1) > 1e-9 || math.Abs(fair-1) > 1e-9 {
		t.Errorf("shares sum to %v, fair shares to %v; want 1", share, fair)
	}
	for _, tr := range qr.Tenants {
		if math.Abs(tr.Share-tr.ServedTokens/served) > 1e-9 {
			t.Errorf("tenant %s: share %v != served %v / %v", tr.Name, tr.Share, tr.ServedTokens, served)
		}
	}

	// Without ?queue, every live queue is listed, sorted, ours among them.
	status, body = adminCall(t, http.MethodGet, "/fair_queue/report")
	if status != http.StatusOK {
		t.Fatalf("GET all: status %d: %s", status, body)
	}
	var all []queueReport
	if err := json.Unmarshal(body, &all); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(all))
	for _, q := range all {
		names = append(names, q.Name)
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("queues not sorted: %v", names)
	}
	if i := sort.SearchStrings(names, name); i == len(names) || names[i] != name {
		t.Errorf("queue %q missing from %v", name, names)
	}
}

func TestAdminReportErrors(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	mustLoad(t, fqConfig(name, u, ""))
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		if status, _ := adminCall(t, m, "/fair_queue/report?queue="+name); status != http.StatusMethodNotAllowed {
			t.Errorf("%s: status %d, want 405", m, status)
		}
	}
	if status, _ := adminCall(t, http.MethodGet, "/fair_queue/report?queue=no_such_queue"); status != http.StatusNotFound {
		t.Errorf("unknown queue: status %d, want 404", status)
	}
}

// The report pages a queue's tenants: ?limit= of them (100 by default),
// sorted by name, and next_cursor for the rest; shares stay those of all
// the tenants, whichever page lists them.
func TestAdminReportPagesTenants(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, ""))
	g := newGateway(t, h)
	const n = 105
	for i := range n {
		res := g.post(fmt.Sprintf("t%03d", i), chatBody(""))
		if res.err != nil || res.status != http.StatusOK {
			t.Fatalf("request %d: %d %v %s", i, res.status, res.err, res.body)
		}
		g.entry(res)
	}
	get := func(query string) queueReport {
		t.Helper()
		status, body := adminCall(t, http.MethodGet, "/fair_queue/report?queue="+name+query)
		if status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", query, status, body)
		}
		var reports []queueReport
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&reports); err != nil || len(reports) != 1 {
			t.Fatalf("%s: %v: %s", query, err, body)
		}
		if reports[0].TenantsTotal != n {
			t.Errorf("%s: tenants_total %d, want %d", query, reports[0].TenantsTotal, n)
		}
		return reports[0]
	}
	if qr := get(""); len(qr.Tenants) != reportDefaultLimit || qr.NextCursor == "" {
		t.Errorf("by default: %d tenants, next_cursor %q; want %d and a cursor", len(qr.Tenants), qr.NextCursor, reportDefaultLimit)
	}
	var names []string
	var share float64
	cursor := ""
	for page := 0; ; page++ {
		q := "&limit=40"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		qr := get(q)
		if want := min(40, n-40*page); len(qr.Tenants) != want {
			t.Fatalf("page %d: %d tenants, want %d", page, len(qr.Tenants), want)
		}
		for _, tr := range qr.Tenants {
			names = append(names, tr.Name)
			share += tr.Share
		}
		if cursor = qr.NextCursor; cursor == "" {
			break
		}
	}
	if len(names) != n || !sort.StringsAreSorted(names) || names[0] != "t000" || names[n-1] != "t104" {
		t.Errorf("the pages listed %d tenants %v..., want t000..t104 once each, sorted", len(names), names[:3])
	}
	if math.Abs(share-1) > 1e-9 {
		t.Errorf("shares over every page sum to %v, want 1", share)
	}
	for _, q := range []string{"&limit=0", "&limit=-3", "&limit=x", "&limit=1001", "&cursor=%21%21"} {
		if status, body := adminCall(t, http.MethodGet, "/fair_queue/report?queue="+name+q); status != http.StatusBadRequest {
			t.Errorf("%s: status %d %s, want 400", q, status, body)
		}
	}
	if status, body := adminCall(t, http.MethodGet, "/fair_queue/report?cursor=dDAwMQ"); status != http.StatusBadRequest ||
		!bytes.Contains(body, []byte("name the queue")) {
		t.Errorf("a cursor without a queue: %d %s, want 400 asking for the queue", status, body)
	}
}
