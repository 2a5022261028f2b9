package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// TestReportThroughAdminAPI reads the per-tenant fairness report from the
// binary's own admin API: the module is loaded with the admin server, with
// no configuration, and reports what the queue served.
func TestReportThroughAdminAPI(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 1, "rp", harness.FakeOptions{Slots: 2, TTFT: time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		name reports
		max_inflight 2
		tenant alpha weight 3 class interactive
		tenant beta weight 1 class interactive
		reverse_proxy {{.Upstreams}}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	for i, tenant := range []string{"alpha", "alpha", "beta"} {
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: tenant,
			TestID: fmt.Sprintf("report-%d", i), MaxTokens: 8, IgnoreEOS: true})
		expectServed(t, r)
	}

	resp, err := http.Get(c.AdminURL() + "/fair_queue/report?queue=reports")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("report: %d %s", resp.StatusCode, body)
	}
	var report []struct {
		Name     string `json:"name"`
		Capacity int    `json:"capacity"`
		Tenants  []struct {
			Name         string  `json:"name"`
			Declared     bool    `json:"declared"`
			Weight       float64 `json:"weight"`
			ServedTokens float64 `json:"served_tokens"`
			Share        float64 `json:"share"`
			FairShare    float64 `json:"weighted_fair_share"`
		} `json:"tenants"`
	}
	if err := json.Unmarshal(body, &report); err != nil {
		t.Fatalf("report is not the documented JSON: %v\n%s", err, body)
	}
	if len(report) != 1 || report[0].Name != "reports" || report[0].Capacity != 2 {
		t.Fatalf("report: %s", body)
	}
	sum := 0.0
	seen := map[string]bool{}
	for _, tn := range report[0].Tenants {
		seen[tn.Name] = true
		sum += tn.Share
		if !tn.Declared || tn.ServedTokens <= 0 {
			t.Errorf("tenant %+v: want declared with served tokens", tn)
		}
		want := map[string]float64{"alpha": 0.75, "beta": 0.25}[tn.Name]
		if math.Abs(tn.FairShare-want) > 1e-9 {
			t.Errorf("tenant %s: weighted fair share %v, want %v", tn.Name, tn.FairShare, want)
		}
	}
	if !seen["alpha"] || !seen["beta"] || math.Abs(sum-1) > 1e-9 {
		t.Errorf("report tenants %v, shares sum %v: %s", seen, sum, body)
	}
	t.Logf("report: %s", body)

	// Unknown queue: 404 from the admin API.
	resp2, err := http.Get(c.AdminURL() + "/fair_queue/report?queue=nope")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound {
		t.Errorf("unknown queue: status %d, want 404", resp2.StatusCode)
	}
}
