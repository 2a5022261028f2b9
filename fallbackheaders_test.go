package caddyfairqueue

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// callerCredentials are the headers a caller sends that the fallback must
// not get, with the values sent.
var callerCredentials = map[string]string{
	"Authorization":       "Bearer client-key",
	"Proxy-Authorization": "Basic cHJveHk6cHc=",
	"Cookie":              "session=client",
	"X-Api-Key":           "client-anthropic-key",
	"Api-Key":             "client-azure-key",
	"X-Goog-Api-Key":      "client-google-key",
	"Openai-Organization": "org-client",
	"Openai-Project":      "proj_client",
	"Forwarded":           "for=10.1.2.3",
	"X-Forwarded-For":     "10.1.2.3",
	"X-Real-Ip":           "10.1.2.3",
}

// fallbackRig is a primary provider that refuses everything for want of
// quota and a fallback that records what it gets; the gateway sends vip
// to the fallback once the primary refused. fallbackHeaders is the
// fallback proxy's header config (JSON of reverse_proxy's "headers").
func fallbackRig(t *testing.T, fallbackHeaders string) (*gateway, *fakeUpstream, *atomic.Int64) {
	var primaryHits atomic.Int64
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		primaryHits.Add(1)
		if r.Header.Get("Authorization") != "Bearer client-key" {
			t.Errorf("the primary did not get the caller's Authorization: %q", r.Header.Get("Authorization"))
		}
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(primary.Close)
	fb := newFakeUpstream(t)
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","upstream_quota":{"tpm":600000},
		"tenants":{"vip":{}},
		"fallback":{"tenants":["vip"],"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]%s}},
		"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}}`,
		queueName(t), fb.dial(), fallbackHeaders, strings.TrimPrefix(primary.URL, "http://")))
	return newGateway(t, h), fb, &primaryHits
}

// sendWithCredentials posts vip's request with every caller credential.
func sendWithCredentials(t *testing.T, g *gateway) result {
	hdr := []string{}
	for k, v := range callerCredentials {
		hdr = append(hdr, k, v)
	}
	res := g.post("vip", chatBody(""), hdr...)
	wantOK(t, res)
	if ch := res.header.Get(headerChannel); ch != "fallback" {
		t.Fatalf("served by %q, want the fallback", ch)
	}
	return res
}

// The fallback gets none of the caller's credentials, account names,
// forwarding headers or tenant header, and gets what its own header_up
// sets; the primary, tried first, got them all.
func TestFallbackStripsCallerCredentials(t *testing.T) {
	g, fb, primaryHits := fallbackRig(t, `,"headers":{"request":{"set":{"Authorization":["Bearer fallback-key"]}}}`)
	sendWithCredentials(t, g)
	if primaryHits.Load() != 1 {
		t.Fatalf("the primary got %d requests, want 1", primaryHits.Load())
	}
	seen := fb.requests()
	if len(seen) != 1 {
		t.Fatalf("the fallback got %d requests, want 1", len(seen))
	}
	got := seen[0].header
	for k, v := range callerCredentials {
		for _, have := range got.Values(k) {
			if strings.Contains(have, v) {
				t.Errorf("the fallback got the caller's %s: %q", k, have)
			}
		}
	}
	if v := got.Get("X-Tenant-Id"); v != "" {
		t.Errorf("the fallback got the tenant header %q", v)
	}
	if v := got.Get("Authorization"); v != "Bearer fallback-key" {
		t.Errorf("the fallback's own header_up Authorization: got %q", v)
	}
	if got.Get("Content-Type") != "application/json" {
		t.Errorf("an ordinary header was stripped: %v", got)
	}
}

// A header_up that names a caller's header passes it on: the one way to
// forward a credential to the fallback.
func TestFallbackPassesOnWhatHeaderUpSets(t *testing.T) {
	g, fb, _ := fallbackRig(t, `,"headers":{"request":{"set":{"Authorization":["{http.request.header.Authorization}"],"X-Tenant-Id":["{http.fair_queue.tenant}"]}}}`)
	sendWithCredentials(t, g)
	seen := fb.requests()
	if len(seen) != 1 {
		t.Fatalf("the fallback got %d requests, want 1", len(seen))
	}
	if v := seen[0].header.Get("Authorization"); v != "Bearer client-key" {
		t.Errorf("header_up Authorization {http.request.header.Authorization}: the fallback got %q", v)
	}
	if v := seen[0].header.Get("X-Tenant-Id"); v != "vip" {
		t.Errorf("header_up X-Tenant-Id {http.fair_queue.tenant}: the fallback got %q", v)
	}
	if v := seen[0].header.Get("Cookie"); v != "" {
		t.Errorf("a header header_up does not name passed: Cookie %q", v)
	}
}
