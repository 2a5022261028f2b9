package caddyfairqueue

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// A request a provider refused for want of quota (429, Retry-After 30)
// goes back to the queue; when its budget then runs out, the answer says
// it reached the provider, not "It was not sent upstream", and its
// Retry-After is the account's wait (30 s), not the queue's guess (1-2 s).
func TestRequeuedRequestAnsweredWithAccountWait(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "30")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`)
	}))
	t.Cleanup(up.Close)
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","upstream_quota":{"tpm":600000},`+
		`"proxy":{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}}`, queueName(t), strings.TrimPrefix(up.URL, "http://")))
	g := newGateway(t, h)
	res := g.post("acme", chatBody(""), "X-Wait-Budget", "1s")
	if res.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d %s, want 503", res.status, res.body)
	}
	if hits.Load() != 1 {
		t.Fatalf("the provider got %d requests, want 1 (refused, then the account waits 30 s)", hits.Load())
	}
	body := string(res.body)
	if strings.Contains(body, "not sent upstream") || !strings.Contains(body, "The model provider refused this request for want of quota") {
		t.Errorf("the answer does not say the provider refused the request: %s", body)
	}
	if ra, _ := strconv.Atoi(res.header.Get("Retry-After")); ra < 29 || ra > 30 {
		t.Errorf("Retry-After %q, want the account's wait, 29-30 s", res.header.Get("Retry-After"))
	}
	if res.header.Get("X-Fair-Queue-Channel") != "" || res.header.Get("X-Fair-Queue-Wait-Ms") != "" {
		t.Errorf("the gateway's answer carries the refused attempt's headers: %v", res.header)
	}
}
