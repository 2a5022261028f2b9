package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// tenantIDCaddyfile takes the tenant from the query string, where any byte
// can be sent, in front of a provider account with a reservation: the
// meters a hostile ID once reached.
const tenantIDCaddyfile = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		name ids
		tenant_key {http.request.uri.query.t}
		max_inflight 8
		upstream_quota tpm 6000000
		tenant vip weight 1 class interactive reserve 20%
		default_tenant weight 1 class interactive
		reverse_proxy {{.Upstreams}}
	}
}
http://127.0.0.1:{{.Header}} {
	fair_queue {
		name hdr
		reverse_proxy {{.Upstreams}}
	}
}
`

// TestHostileTenantIDs: through the binary, every tenant ID is either
// refused with 400 invalid_request saying it is not a valid tenant ID,
// and never reaches the upstream, or served as its own tenant, listed in
// the admin report under exactly its name; refused exactly when
// fairqueue.CheckTenantID refuses it. The IDs: the queue's internal meter
// names (which "?t=%00upstream" once shared), control characters, invalid
// UTF-8, invisible characters, names that look internal, and 300 random
// strings of a seeded generator. Header values with bytes HTTP forbids
// are refused too (by Go's server or by the gateway), never served.
func TestHostileTenantIDs(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 1, "ids", harness.FakeOptions{Slots: 8, TTFT: time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site", "Header")
	c := startCaddy(t, tenantIDCaddyfile, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Header": p["Header"],
		"Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])

	ids := []string{"\x00upstream", "\x00reserve\x00vip", "\x00fallback", "\x00probe", "acme\nlevel=error",
		"\x1b[31mred", "caf\xe9", "admin\u202e", "a\u200bb", strings.Repeat("t", 257),
		"upstream", "reserve", "vip", "slots", "shares", "{slots}", "{shares}", "_unknown", "a b", "ok 🙂", "Zürich-研究所"}
	rng := rand.New(rand.NewPCG(29, 5))
	alphabet := []string{"a", "Z", "0", " ", "-", "{", "}", "\x00", "\t", "\n", "\x7f", "\u0085", "é", "研", "🙂",
		"\u202e", "\u200b", "\xff", "\xc3", "%", "+", "&", "="}
	for range 300 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		ids = append(ids, b.String())
	}
	served := map[string]bool{}
	servedN := 0
	for i, id := range ids {
		testID := fmt.Sprintf("id-%d", i)
		r := send(context.Background(), defaultClient, base, chatReq{TestID: testID, MaxTokens: 4,
			Path: "/v1/chat/completions?t=" + url.QueryEscape(id)})
		if err := fairqueue.CheckTenantID(id); err != nil {
			e := expectError(t, r, http.StatusBadRequest, "invalid_request", "invalid_request_error", false)
			if !strings.Contains(e.Message, "is not a valid tenant ID: it has "+err.Error()) {
				t.Errorf("tenant %q: message %q does not say what is wrong (%v)", id, e.Message, err)
			}
			continue
		}
		expectServed(t, r)
		served[id] = true
		servedN++
	}
	recs := records(t, fakes...)
	for i, id := range ids {
		if _, reached := recs[fmt.Sprintf("id-%d", i)]; reached != served[id] {
			t.Errorf("tenant %q: reached the upstream %v, served %v", id, reached, served[id])
		}
	}
	// Every served ID is one tenant of its own, under its exact name.
	listed := reportTenants(t, c, "ids")
	for id := range served {
		if listed[id] <= 0 {
			t.Errorf("tenant %q was served but is not in the report with tokens of its own", id)
		}
	}
	if len(listed) != len(served) {
		t.Errorf("the report lists %d tenants, %d were served", len(listed), len(served))
	}

	// Headers, where tenant_key is the default X-Tenant-ID: bytes an HTTP
	// client would not send, through a raw socket.
	addr := fmt.Sprintf("127.0.0.1:%d", p["Header"])
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	for _, v := range []string{"\x01probe", "a\x7fb", "\xff\xfe", "caf\xe9"} {
		if resp := rawRequest(t, addr, v, int64(len(body)), "", body); resp.status != http.StatusBadRequest {
			t.Errorf("X-Tenant-ID %q: %d %s %v, want 400", v, resp.status, resp.body, resp.err)
		}
	}
	if resp := rawRequest(t, addr, "acme", int64(len(body)), "", body); resp.status != http.StatusOK {
		t.Errorf("X-Tenant-ID acme: %d %s %v, want 200", resp.status, resp.body, resp.err)
	}
	if st := fakes[0].Stats(); int(st.Received) != servedN+1 {
		t.Errorf("the upstream received %d requests, want the %d served", st.Received, servedN+1)
	}
}

// reportTenants reads every tenant of a queue from the admin report, page
// by page, with its served tokens.
func reportTenants(t *testing.T, c *harness.Caddy, queue string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	cursor := ""
	for {
		u := c.AdminURL() + "/fair_queue/report?queue=" + queue + "&limit=50"
		if cursor != "" {
			u += "&cursor=" + cursor
		}
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("report: %d %s", resp.StatusCode, body)
		}
		var report []struct {
			Tenants []struct {
				Name         string  `json:"name"`
				ServedTokens float64 `json:"served_tokens"`
			} `json:"tenants"`
			NextCursor string `json:"next_cursor"`
		}
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&report); err != nil || len(report) != 1 {
			t.Fatalf("report %s: %v", body, err)
		}
		for _, tr := range report[0].Tenants {
			out[tr.Name] = tr.ServedTokens
		}
		if cursor = report[0].NextCursor; cursor == "" {
			return out
		}
	}
}
