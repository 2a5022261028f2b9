package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// postQuery sends a chat completion with the query string q.
func (g *gateway) postQuery(q string) result {
	g.tb.Helper()
	r := g.newRequest(context.Background(), "", chatBody(""))
	r.URL.RawQuery = q
	return g.do(r)
}

// last is the latest access entry.
func (g *gateway) last() accessEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entries[len(g.entries)-1]
}

// A tenant ID with a control character, invalid UTF-8 or an invisible
// character is refused with 400 before anything is queued or charged:
// with tenant_key from the query, "?t=%00upstream" was served on the
// provider account's own meter.
func TestTenantIDWithControlCharactersRefused(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"tenant_key":"{http.request.uri.query.t}",`+
		`"upstream_quota":{"rpm":600},"default_tenant":{"quota":{"qps":100}}`))
	g := newGateway(t, h)
	for _, c := range []struct{ id, what string }{
		{"\x00upstream", "a control character (U+0000) at byte 0"},
		{"\x00reserve\x00vip", "a control character (U+0000)"},
		{"\x00fallback", "a control character (U+0000)"},
		{"\x00probe", "a control character (U+0000)"},
		{"acme\nlevel=error msg=forged", "a control character (U+000A) at byte 4"},
		{"\x1b[31mred", "a control character (U+001B)"},
		{"caf\xe9", "not UTF-8 at byte 3"},
		{"admin\u202e", "an invisible or unassigned character (U+202E)"},
		{strings.Repeat("t", fairqueue.MaxTenantIDLen+1), "longer than 256 bytes"},
	} {
		res := g.postQuery("t=" + url.QueryEscape(c.id))
		body := wantError(t, res, http.StatusBadRequest, outcomeInvalid)
		msg := body.Error.Message
		if !strings.Contains(msg, "not a valid tenant ID: it has "+c.what) {
			t.Errorf("tenant %q: message %q does not say what is wrong (%s)", c.id, msg, c.what)
		}
		if !strings.Contains(msg, "tenant_key {http.request.uri.query.t}") {
			t.Errorf("tenant %q: message %q does not say where the ID comes from", c.id, msg)
		}
		if len(c.id) > 8 && strings.Contains(msg, c.id) {
			t.Errorf("tenant %q: the message echoes the ID", c.id)
		}
	}
	if n := u.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests of refused tenants", n)
	}
	st := h.shared.q.Stats(true)
	if len(st.Tenants) != 0 {
		t.Errorf("the queue remembers %d tenants of refused requests: %+v", len(st.Tenants), st.Tenants)
	}
	if pool := h.shared.q.Upstream().Pool; pool.Requests.Reset != 0 || pool.Tokens.Reset != 0 {
		t.Errorf("the provider account was charged for refused requests: %+v", pool)
	}
	wantOK(t, g.postQuery("t=acme"))
	if pool := h.shared.q.Upstream().Pool; pool.Requests.Reset == 0 {
		t.Error("a served request left the provider account's meter at rest: the test reads the wrong meter")
	}
}

// The same rule holds for the names a config declares, and the label
// every undeclared tenant shares in metrics is no declared tenant's name.
func TestDeclaredTenantNamesChecked(t *testing.T) {
	u := newFakeUpstream(t)
	for extra, want := range map[string]string{
		`"tenants":{"\u0000upstream":{}}`: "not a valid tenant ID",
		`"tenants":{"a\tb":{}}`:           "not a valid tenant ID",
		`"tenants":{"_unknown":{}}`:       "metrics label of every undeclared tenant",
		`"tenants":{"vip":{}},"fallback":{"tenants":["vip","\u0000fallback"],"proxy":` + proxyJSON(u) + `}`: "fallback: tenant",
	} {
		ctx, cancel := configContext(t)
		_, err := loadHandler(ctx, fqConfig(queueName(t), u, extra))
		cancel()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", extra, err, want)
		}
	}
}

// FuzzTenantHeader: any X-Tenant-ID value (set in memory, so bytes no HTTP
// client would send get through too) is either refused with 400
// invalid_request whose message says the tenant ID is not valid, with
// nothing sent upstream, or served as exactly that tenant, unaltered;
// refused exactly when fairqueue.CheckTenantID refuses it. What an
// accepted ID is isolated from, the queue's own meters, is
// fairqueue.FuzzTenantKeys's.
func FuzzTenantHeader(f *testing.F) {
	for _, s := range []string{"", "acme", "\x00upstream", "\x00reserve\x00vip", "\x00fallback", "\x00probe",
		"slots", "shares", "_unknown", "a\r\nX-Injected: 1", "\x1b[2J", "\xff\xfe", "\u202eevil", "a\u200bb",
		"ok 🙂", "{x}", strings.Repeat("t", 256), strings.Repeat("t", 257)} {
		f.Add(s)
	}
	u := newFakeUpstream(f)
	h, _ := mustLoad(f, fqConfig("fuzz_tenant_header", u,
		`"upstream_quota":{"rpm":1000000},"tenants":{"vip":{"reserve":0.1}}`))
	g := newGateway(f, h)
	f.Fuzz(func(t *testing.T, id string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody("")))
		r.Header["X-Tenant-Id"] = []string{id}
		r.Header.Set("Content-Type", "application/json")
		before := u.hits.Load()
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		entry := g.last()
		valid := fairqueue.CheckTenantID(id) == nil
		switch {
		case valid && w.Code == http.StatusOK:
			if entry.tenant != id {
				t.Fatalf("tenant %q was served as %q", id, entry.tenant)
			}
			if u.hits.Load() != before+1 {
				t.Fatalf("tenant %q: served, but not by the upstream", id)
			}
		case !valid && w.Code == http.StatusBadRequest:
			var body apiErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("tenant %q: the 400's body is not the OpenAI error shape: %v: %q", id, err, w.Body)
			}
			if body.Error.Code != outcomeInvalid || !strings.Contains(body.Error.Message, "The X-Tenant-ID header is not a valid tenant ID") {
				t.Fatalf("tenant %q: 400 %s %q, want invalid_request saying the tenant ID is not valid", id, body.Error.Code, body.Error.Message)
			}
			if u.hits.Load() != before {
				t.Fatalf("tenant %q: refused, yet sent upstream", id)
			}
		default:
			t.Fatalf("tenant %q (valid %v): %d %s", id, valid, w.Code, w.Body)
		}
	})
}
