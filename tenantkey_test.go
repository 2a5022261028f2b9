package caddyfairqueue

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestTenantOfMatchesReplacer: reading a one-header tenant_key from the
// request gives what Caddy's replacer gives for the key, for a header
// absent, given once or more, and a key spelled in any case; other keys
// still go through the replacer.
func TestTenantOfMatchesReplacer(t *testing.T) {
	for _, key := range []string{"{http.request.header.X-Tenant-ID}", "{http.request.header.x-tenant-id}",
		"{http.request.header.X-Tenant-ID}-{http.request.method}", "{http.request.method}"} {
		h := &Handler{TenantKey: key, tenantHeader: headerPlaceholder(key)}
		for _, vals := range [][]string{nil, {"acme"}, {""}, {"a", "b"}, {"a", "", "c"}} {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			for _, v := range vals {
				r.Header.Add("X-Tenant-Id", v)
			}
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), &caddyhttp.Server{})
			if got, want := h.tenantOf(r, repl), repl.ReplaceAll(key, ""); got != want {
				t.Errorf("key %s, header %q: tenant %q, the replacer says %q", key, vals, got, want)
			}
		}
	}
	if headerPlaceholder("{http.request.header.X-Tenant-ID}-{http.request.method}") != "" {
		t.Error("a key of two placeholders was taken for one header")
	}
}
