package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

const placeholdersTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	log {
		output file {{.AccessLog}}
	}
	log_append fq_tenant {http.fair_queue.tenant}
	log_append fq_outcome {http.fair_queue.outcome}
	log_append fq_cost {http.fair_queue.cost}
	log_append fq_wait_ms {http.fair_queue.wait_ms}
	fair_queue {
		max_inflight 4
		reverse_proxy {{.Upstreams}} {
			header_down X-Seen-Tenant {http.fair_queue.tenant}
			header_down X-Seen-Cost {http.fair_queue.cost}
		}
	}
}
`

// TestPlaceholdersThroughBinary: the {http.fair_queue.*} placeholders, which
// the handler serves on demand from the request's admission, reach the
// inner proxy while the request is served (header_down) and Caddy's access
// log after the handler has returned (log_append), for a served request and
// for one refused before it was queued.
func TestPlaceholdersThroughBinary(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 1, "ph", harness.FakeOptions{Slots: 4})
	p := harness.Ports(t, "Admin", "Site")
	accessLog := filepath.Join(t.TempDir(), "access.log")
	startCaddy(t, placeholdersTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
		"AccessLog": accessLog, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	ctx := context.Background()

	served := send(ctx, defaultClient, base, chatReq{Tenant: "acme", TestID: "ph-served", MaxTokens: 8})
	expectServed(t, served)
	if got := served.Header.Get("X-Seen-Tenant"); got != "acme" {
		t.Errorf("header_down saw tenant %q, want acme", got)
	}
	if got, want := served.Header.Get("X-Seen-Cost"), served.Header.Get("X-Fair-Queue-Cost"); got != want {
		t.Errorf("header_down saw cost %q, the answer says %q", got, want)
	}
	refused := send(ctx, defaultClient, base, chatReq{Tenant: "acme", TestID: "ph-invalid", Body: []byte(`{"model":"m","messages":[`)})
	if refused.Err != nil || refused.Status != 400 {
		t.Fatalf("malformed body: %v, want 400", refused)
	}

	want := map[string]map[string]string{
		"ph-served": {"fq_tenant": "acme", "fq_outcome": "served",
			"fq_cost": served.Header.Get("X-Fair-Queue-Cost"), "fq_wait_ms": served.Header.Get("X-Fair-Queue-Wait-Ms")},
		"ph-invalid": {"fq_tenant": "acme", "fq_outcome": "invalid_request"},
	}
	var got map[string]map[string]any
	harness.WaitFor(t, "both requests in the access log", func() (bool, string) {
		got = accessLogFields(t, accessLog)
		return len(got) == len(want), fmt.Sprintf("%d of %d logged", len(got), len(want))
	})
	for id, fields := range want {
		for k, v := range fields {
			if s := fmt.Sprint(got[id][k]); s != v {
				t.Errorf("%s: access log %s = %q, want %q (entry %v)", id, k, s, v, got[id])
			}
		}
	}
}

// accessLogFields reads Caddy's JSON access log: each entry's top-level
// fields, by the request's X-Test-Id.
func accessLogFields(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e struct {
			Request struct {
				Headers map[string][]string `json:"headers"`
			} `json:"request"`
		}
		line := sc.Bytes()
		if json.Unmarshal(line, &e) != nil || len(e.Request.Headers["X-Test-Id"]) == 0 {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(line, &fields); err != nil {
			t.Fatal(err)
		}
		out[strings.Join(e.Request.Headers["X-Test-Id"], ",")] = fields
	}
	return out
}
