package caddyfairqueue

import (
	"context"
	"encoding/json"
	"testing"
)

// A request that lowers its class with X-Fair-Queue-Class stays under its
// tenant's class's light mode: with "light_mode interactive max_tokens 8"
// engaged, an interactive tenant's request saying class batch is trimmed
// (X-Fair-Queue-Mode: light, max_tokens 8 upstream) like one that does
// not.
func TestLoweredClassStaysInLightMode(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"max_inflight":1,"max_queue":4,
		"tenants":{"chat":{"class":"interactive"},"bulk":{"class":"batch"}},
		"degrade":{"hold":"1ms","steps":[{"name":"L1","trigger":0.2,"recover":0.1,"action":"light_mode","class":"interactive","max_tokens":8}]}`))
	g := newGateway(t, h)
	arrived, release := u.hold("slot")
	defer release()
	held := g.async(g.newRequest(context.Background(), "bulk", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived
	queued := []<-chan result{
		g.async(g.newRequest(context.Background(), "bulk", chatBody(""))),
		g.async(g.newRequest(context.Background(), "bulk", chatBody(""))),
	}
	waitQueued(t, h, 2) // water 2/4 > 0.2: the ticker engages L1
	eventually(t, "light mode engaged", func() bool { return h.shared.q.DegradeLevel() == 1 })
	lowered := g.async(g.newRequest(context.Background(), "chat", chatBody(""), headerClass, "batch"))
	waitQueued(t, h, 3)
	release()
	for _, ch := range append(queued, held) {
		wantOK(t, <-ch)
	}
	res := <-lowered
	wantOK(t, res)
	if mode := res.header.Get(headerMode); mode != "light" {
		t.Errorf("a request lowered to batch by a tenant of class interactive: %s %q, want light", headerMode, mode)
	}
	for _, seen := range u.requests() {
		if seen.header.Get("X-Tenant-Id") != "chat" {
			continue
		}
		var body struct {
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.Unmarshal(seen.body, &body)
		if body.MaxTokens != 8 {
			t.Errorf("the upstream got max_tokens %d from the lowered request, want light mode's 8", body.MaxTokens)
		}
	}
}
