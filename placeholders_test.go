package caddyfairqueue

import (
	"fmt"
	"testing"
)

// TestPlaceholdersReachInnerProxy: the tenant, and the wait and cost known
// at dispatch, are there for the inner proxy's header_up, as docs/http-contract.md
// promises, through the lazy provider (placeholders.go).
func TestPlaceholdersReachInnerProxy(t *testing.T) {
	u := newFakeUpstream(t)
	proxy := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}],"headers":{"request":{"set":{`+
		`"X-Seen-Tenant":["{http.fair_queue.tenant}"],"X-Seen-Cost":["{http.fair_queue.cost}"],`+
		`"X-Seen-Wait":["{http.fair_queue.wait_ms}"],"X-Seen-Outcome":["{http.fair_queue.outcome}"]}}}}`, u.dial())
	h, _ := mustLoad(t, fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":%s}`, queueName(t), proxy))
	g := newGateway(t, h)
	res := g.post("acme", chatBody(""))
	wantOK(t, res)
	seen := u.requests()
	if len(seen) != 1 {
		t.Fatalf("%d requests reached the upstream", len(seen))
	}
	hdr := seen[0].header
	if hdr.Get("X-Seen-Tenant") != "acme" || hdr.Get("X-Seen-Cost") != res.header.Get(headerCost) ||
		hdr.Get("X-Seen-Wait") != res.header.Get(headerWaitMs) || hdr.Get("X-Seen-Outcome") != "{http.fair_queue.outcome}" {
		t.Errorf("the inner proxy saw tenant %q cost %q wait %q outcome %q; want acme, %s, %s and no outcome yet (left as written)",
			hdr.Get("X-Seen-Tenant"), hdr.Get("X-Seen-Cost"), hdr.Get("X-Seen-Wait"), hdr.Get("X-Seen-Outcome"),
			res.header.Get(headerCost), res.header.Get(headerWaitMs))
	}
	if e := g.entry(res); e.outcome != outcomeServed || e.tenant != "acme" {
		t.Errorf("access log: %+v", e)
	}
}
