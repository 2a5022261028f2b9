package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

func TestCaddyfileProviderAccount(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		upstream_quota tpm 120000 rpm 600 burst 10s reserve_burst 4s
		tenant vip weight 70 class realtime reserve 20%
		tenant bulk weight 10 reserve 0.05
		fallback {
			tenants vip
			model_map gpt-4o gpt-4o-2024-08-06
			max_inflight 8
			upstream_quota tpm 30000
			reverse_proxy fb:1 {
				header_up Authorization "Bearer fallback-key"
			}
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if uq := h.UpstreamQuota; uq == nil || uq.TPM != 120000 || uq.RPM != 600 || uq.Burst != dur(10*time.Second) ||
		uq.ReserveBurst != dur(4*time.Second) {
		t.Fatalf("upstream_quota: %+v", uq)
	}
	if h.Tenants["vip"].Reserve != 0.2 || h.Tenants["bulk"].Reserve != 0.05 {
		t.Fatalf("reserve: %v %v", h.Tenants["vip"].Reserve, h.Tenants["bulk"].Reserve)
	}
	fb := h.Fallback
	if fb == nil || strings.Join(fb.Tenants, ",") != "vip" || fb.ModelMap["gpt-4o"] != "gpt-4o-2024-08-06" ||
		fb.MaxInflight != 8 || fb.UpstreamQuota.TPM != 30000 || !strings.Contains(string(fb.ProxyRaw), "fallback-key") {
		t.Fatalf("fallback: %+v %s", fb, fb.ProxyRaw)
	}
	for _, tc := range []struct{ input, want string }{
		{"upstream_quota", "at least one of them"},
		{"upstream_quota tpm x", `tpm "x" must be a positive number`},
		{"upstream_quota tpm 1 qpm 2", `unknown setting "qpm" (want tpm, rpm, burst or reserve_burst)`},
		{"upstream_quota tpm 1 reserve_burst soon", "reserve_burst"},
		{"tenant a reserve 150%", "between 0 and 1"},
		{"fallback {\ntenants a\n}", "want 'tenants <name>...' and a 'reverse_proxy"},
		{"fallback {\nmodel_map a\n}", "model_map <model> <fallback model>"},
		{"fallback {\nkeys a\n}", `unknown setting "keys"`},
	} {
		_, err := parseBlock("fair_queue {\nreverse_proxy a:1\n" + tc.input + "\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.input, err, tc.want)
		}
	}
}

// The fallback's body has its model mapped; other fields are kept.
func TestFallbackBody(t *testing.T) {
	h := &Handler{Fallback: &FallbackConfig{ModelMap: map[string]string{"m": "m-fallback"}}}
	a := parseAdmission(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	var got map[string]any
	if err := json.Unmarshal(h.fallbackBody(a), &got); err != nil {
		t.Fatal(err)
	}
	if got["model"] != "m-fallback" || got["max_tokens"] != 5.0 {
		t.Fatalf("fallback body %v", got)
	}
	a = parseAdmission(t, `{"model":"other","messages":[]}`)
	if string(h.fallbackBody(a)) != `{"model":"other","messages":[]}` {
		t.Fatal("an unmapped model's body was rewritten")
	}
}

// A provider's words on its account: a 429's Retry-After-Ms, Retry-After
// or reset, and on any response the reset of a dimension at 0.
func TestProviderWait(t *testing.T) {
	for _, tc := range []struct {
		hdr    map[string]string
		status int
		want   time.Duration
	}{
		{map[string]string{"Retry-After-Ms": "1500"}, 429, 1500 * time.Millisecond},
		{map[string]string{"Retry-After": "3"}, 429, 3 * time.Second},
		{map[string]string{}, 429, time.Second},
		{map[string]string{"X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "6m0s"}, 200, maxServedWait},
		{map[string]string{"X-Ratelimit-Remaining-Tokens": "10", "X-Ratelimit-Reset-Tokens": "6m0s"}, 200, 0},
		{map[string]string{"Retry-After": "86400"}, 429, maxProviderWait},
	} {
		h := http.Header{}
		for k, v := range tc.hdr {
			h.Set(k, v)
		}
		if got := providerWait(h, tc.status); got != tc.want {
			t.Errorf("%v %d: %v, want %v", tc.hdr, tc.status, got, tc.want)
		}
	}
}

func parseAdmission(t *testing.T, body string) *admission {
	t.Helper()
	req, err := llmapi.Parse("/v1/chat/completions", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &admission{body: []byte(body), req: req}
}

// TestProviderReport: what a provider's answer says is left of the
// account, each dimension with its reset; a value that is not a whole
// number >= 0 is not reported.
func TestProviderReport(t *testing.T) {
	h := http.Header{}
	if _, ok := providerReport(h); ok {
		t.Fatal("no headers reported something")
	}
	h.Set("X-Ratelimit-Remaining-Tokens", "1500")
	h.Set("X-Ratelimit-Reset-Tokens", "6m0s")
	h.Set("X-Ratelimit-Remaining-Requests", "-3")
	h.Set("X-Ratelimit-Reset-Requests", "1s")
	r, ok := providerReport(h)
	if !ok || r.RemainingTokens != 1500 || r.ResetTokens != 6*time.Minute || r.RemainingRequests != -1 || r.ResetRequests != 0 {
		t.Fatalf("report %+v ok %v; want 1500 tokens reset 6m, requests not reported", r, ok)
	}
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	h.Set("X-Ratelimit-Remaining-Tokens", "lots")
	r, ok = providerReport(h)
	if !ok || r.RemainingRequests != 0 || r.ResetRequests != time.Second || r.RemainingTokens != -1 {
		t.Fatalf("report %+v ok %v; want 0 requests reset 1s, tokens not reported", r, ok)
	}
}
