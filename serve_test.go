package caddyfairqueue

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"

	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

// estimate is the cost the handler must charge for body (approx tokenizer,
// default_max_tokens 512).
func estimate(t *testing.T, body []byte) int {
	t.Helper()
	req, err := llmapi.Parse("/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := llmapi.NewCounter(llmapi.Approx)
	return llmapi.Estimate(req, c, 512).Total()
}

func wantOK(t *testing.T, res result) {
	t.Helper()
	if res.err != nil {
		t.Fatalf("transport error: %v", res.err)
	}
	if res.status != http.StatusOK {
		t.Fatalf("status = %d, want 200; body %s", res.status, res.body)
	}
}

// noFastFail makes queue timeouts deterministic: a request waits its whole
// budget instead of being refused at admission on an ETA guess.
const noFastFail = `"anti_starvation":{"fast_fail":false,"boost_share_max":0}`

func TestServeTenantFromPlaceholder(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u,
		`"tenant_key":"{http.request.header.X-Team}","tenants":{"acme":{"weight":3,"class":"interactive"}}`))
	g := newGateway(t, h)
	// Collectors are package-level: count from here (go test -count=N).
	acme0 := counterValue(requestsTotal, name, "acme", outcomeServed)
	unknown0 := counterValue(requestsTotal, name, unknownTenantLabel, outcomeServed)

	var res [3]result
	res[0] = g.post("", chatBody(""), "X-Team", "acme")
	res[1] = g.post("", chatBody(""), "X-Team", "stranger")
	// The default key's header means nothing under another tenant_key.
	res[2] = g.post("acme", chatBody(""))
	for i, want := range []string{"acme", "stranger", ""} {
		wantOK(t, res[i])
		if e := g.entry(res[i]); e.tenant != want || e.outcome != outcomeServed {
			t.Errorf("request %d: tenant %q outcome %q, want %q served", i, e.tenant, e.outcome, want)
		}
	}
	if got := counterValue(requestsTotal, name, "acme", outcomeServed) - acme0; got != 1 {
		t.Errorf("requests_total{tenant=acme,served} = %v, want 1", got)
	}
	// Unknown tenants share one metrics label, however many there are.
	if got := counterValue(requestsTotal, name, unknownTenantLabel, outcomeServed) - unknown0; got != 2 {
		t.Errorf("requests_total{tenant=%s,served} = %v, want 2", unknownTenantLabel, got)
	}
	for _, l := range seriesLabels(requestsTotal, name) {
		if l["tenant"] == "stranger" || l["tenant"] == "" {
			t.Errorf("unknown tenant leaked into a metrics label: %v", l)
		}
	}
	// ... but each still has its own sub-queue with its own settings.
	st := h.shared.q.Stats(true)
	got := map[string]bool{}
	for _, ts := range st.Tenants {
		got[ts.Name] = ts.Known
		if ts.Name == "acme" && ts.Weight != 3 {
			t.Errorf("acme weight %v, want 3", ts.Weight)
		}
	}
	if k, ok := got["acme"]; !ok || !k {
		t.Errorf("queue tenants %v: want acme known", got)
	}
	if k, ok := got["stranger"]; !ok || k {
		t.Errorf("queue tenants %v: want stranger unknown", got)
	}
}

func TestServeRejectUnknownTenant(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"reject_unknown_tenants":true,"tenants":{"acme":{}}`))
	g := newGateway(t, h)

	r1 := g.post("mallory", chatBody(""))
	body := wantError(t, r1, http.StatusForbidden, "unknown_tenant")
	if !strings.Contains(body.Error.Message, `"mallory"`) {
		t.Errorf("message %q does not name the tenant", body.Error.Message)
	}
	r2 := g.post("", chatBody(""))
	body = wantError(t, r2, http.StatusForbidden, "unknown_tenant")
	if !strings.Contains(body.Error.Message, "no tenant") {
		t.Errorf("message %q should say the request names no tenant", body.Error.Message)
	}
	wantOK(t, g.post("acme", chatBody("")))

	if n := u.hits.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1 (only acme's)", n)
	}
	if e := g.entry(r1); e.outcome != "unknown_tenant" || e.tenant != "mallory" {
		t.Errorf("access entry %+v", e)
	}
	if e := g.entry(r2); e.outcome != "unknown_tenant" || e.tenant != "" {
		t.Errorf("access entry %+v", e)
	}
}

func TestServeWaitBudgetHeader(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":1,`+noFastFail+
		`,"classes":[{"name":"tight","wait_budget":"300ms"}],"tenants":{"t":{"class":"tight"}}`))
	g := newGateway(t, h)

	t.Run("bad values", func(t *testing.T) {
		for _, v := range []string{"abc", "0", "0s", "-1s", "2 s", "1fortnight"} {
			body := wantError(t, g.post("b", chatBody(""), headerWaitBudget, v), http.StatusBadRequest, "invalid_request")
			if !strings.Contains(body.Error.Message, headerWaitBudget) {
				t.Errorf("%q: message %q does not name the header", v, body.Error.Message)
			}
		}
		if n := u.hits.Load(); n != 0 {
			t.Errorf("upstream saw %d requests", n)
		}
	})

	// Fill the only slot.
	arrived, release := u.hold("slot")
	holder := g.async(g.newRequest(context.Background(), "holder", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived

	// The budgets compared are a thousand times apart or more, so telling
	// them apart by the time an answer took stands any load: a 300ms
	// budget answered after a minute is not one.
	const apart = time.Minute
	t.Run("shortens", func(t *testing.T) {
		// batch's budget is 300s; the header cuts it to 300ms: the
		// request waits (queue_timeout, not a refusal at admission) until
		// then.
		start := time.Now()
		res := g.post("b", chatBody(""), headerWaitBudget, "300ms")
		el := time.Since(start)
		wantError(t, res, http.StatusServiceUnavailable, "queue_timeout")
		if el < 100*time.Millisecond || el > apart {
			t.Errorf("answered after %v, want the 300ms budget of the header, not batch's 300s", el)
		}
	})
	t.Run("never lengthens", func(t *testing.T) {
		start := time.Now()
		res := g.post("t", chatBody(""), headerWaitBudget, "1h")
		el := time.Since(start)
		wantError(t, res, http.StatusServiceUnavailable, "queue_timeout")
		if el > apart {
			t.Errorf("answered after %v: the header lengthened the class's 300ms budget to its 1h", el)
		}
	})
	release()
	wantOK(t, <-holder)
	if n := u.hits.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1: timed-out requests must never be sent", n)
	}
}

func TestServeClassHeader(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"max_inflight":1,`+noFastFail+
		`,"classes":[{"name":"tight","wait_budget":"300ms"}],"tenants":{"t":{"class":"tight"},"b":{"class":"batch"}}`))
	g := newGateway(t, h)

	body := wantError(t, g.post("b", chatBody(""), headerClass, "realtime"), http.StatusBadRequest, "invalid_request")
	if !strings.Contains(body.Error.Message, "only lower") {
		t.Errorf("raising: message %q should say a request may only lower its class", body.Error.Message)
	}
	wantError(t, g.post("b", chatBody(""), headerClass, "gold"), http.StatusBadRequest, "invalid_request")
	wantOK(t, g.post("t", chatBody(""), headerClass, "tight"))
	wantOK(t, g.post("t", chatBody(""), headerClass, "batch"))

	// Lowering takes effect: with the slot taken, tenant t's own class
	// times out after 300ms, while the same tenant lowered to batch waits.
	arrived, release := u.hold("slot")
	holder := g.async(g.newRequest(context.Background(), "b", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived
	wantError(t, g.post("t", chatBody("")), http.StatusServiceUnavailable, "queue_timeout")
	lowered := g.async(g.newRequest(context.Background(), "t", chatBody(""), headerClass, "batch"))
	waitQueued(t, h, 1)
	// A request of t's own class queued after it expires first: by then
	// the lowered one, queued earlier, would have too under tight's budget.
	wantError(t, g.post("t", chatBody("")), http.StatusServiceUnavailable, "queue_timeout")
	if q, _ := queueStats(h); q != 1 {
		t.Fatalf("lowered request left the queue with tight's budget (queued %d)", q)
	}
	release()
	wantOK(t, <-holder)
	wantOK(t, <-lowered)
}

// TestServeClassHeaderUnbounded: a class without a wait budget (JSON
// config, wait_budget omitted) waits longest of all, so moving to it is
// lowering and leaving it for a budgeted class is raising.
func TestServeClassHeaderUnbounded(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u,
		`"classes":[{"name":"bulk"}],"tenants":{"u":{"class":"bulk"},"b":{"class":"batch"}}`))
	g := newGateway(t, h)
	wantError(t, g.post("u", chatBody(""), headerClass, "realtime"), http.StatusBadRequest, "invalid_request")
	wantOK(t, g.post("b", chatBody(""), headerClass, "bulk"))
	wantOK(t, g.post("u", chatBody(""), headerClass, "bulk"))
}

func TestServeMaxBody(t *testing.T) {
	u := newFakeUpstream(t)
	const limit = 1024
	h, _ := mustLoad(t, fqConfig(queueName(t), u, fmt.Sprintf(`"max_body":%d`, limit)))
	g := newGateway(t, h)

	sized := func(n int) []byte {
		b := chatBody(`"user":""`)
		pad := strings.Repeat("x", n-len(b))
		b = chatBody(`"user":"` + pad + `"`)
		if len(b) != n {
			t.Fatalf("body of %d bytes, want %d", len(b), n)
		}
		return b
	}
	wantOK(t, g.post("a", sized(limit)))
	over := g.post("a", sized(limit+1))
	wantError(t, over, http.StatusRequestEntityTooLarge, "request_too_large")

	// Without a Content-Length (chunked) the limit holds all the same.
	r := g.newRequest(context.Background(), "a", nil)
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(sized(4*limit))), -1
	chunked := g.do(r)
	wantError(t, chunked, http.StatusRequestEntityTooLarge, "request_too_large")

	if n := u.hits.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
	for _, res := range []result{over, chunked} {
		if e := g.entry(res); e.outcome != "request_too_large" {
			t.Errorf("outcome %q", e.outcome)
		}
	}
}

func TestServeMalformedJSON(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, ""))
	g := newGateway(t, h)
	for _, b := range []string{
		`{"model":"m","messages":[`,
		`not json`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}}`,
		`{"model":"m","messages":"hi"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"lots"}`,
		``,
	} {
		body := wantError(t, g.post("a", []byte(b)), http.StatusBadRequest, "invalid_request")
		if len(body.Error.Message) < 10 {
			t.Errorf("%q: message %q is not a clear message", b, body.Error.Message)
		}
	}
	if n := u.hits.Load(); n != 0 {
		t.Errorf("upstream saw %d malformed requests", n)
	}
	for _, e := range g.waitEntries(6) {
		if e.outcome != outcomeInvalid || e.tenant != "a" {
			t.Errorf("access entry %+v", e)
		}
	}
}

func TestServeBodyByteIdentical(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, ""))
	g := newGateway(t, h)
	// Odd spacing, escapes, unknown fields and number spellings: nothing a
	// re-encoder would keep as it is.
	body := []byte("{ \"model\" : \"m\",\n\t\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" 日本語 \\/\"}],\n" +
		"  \"x_vendor\": {\"deep\":[1, 2.50, 1e3, -0, null, true]}, \"max_tokens\": 16 , \"temperature\":0.70 }\n")

	wantOK(t, g.post("a", body))
	chunked := g.newRequest(context.Background(), "a", nil)
	chunked.Body, chunked.ContentLength = io.NopCloser(bytes.NewReader(body)), -1
	wantOK(t, g.do(chunked))

	seen := u.requests()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(seen))
	}
	for i, s := range seen {
		if !bytes.Equal(s.body, body) {
			t.Errorf("request %d: upstream body differs:\n got %q\nwant %q", i, s.body, body)
		}
		if s.contentLength != int64(len(body)) || s.clHeader != strconv.Itoa(len(body)) || s.chunked {
			t.Errorf("request %d: upstream Content-Length %d (header %q, chunked %v), want %d",
				i, s.contentLength, s.clHeader, s.chunked, len(body))
		}
		if s.header.Get("X-Tenant-ID") != "a" {
			t.Errorf("request %d: headers not passed through: %v", i, s.header)
		}
	}
}

func TestServeResponseHeadersAndPlaceholders(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, ""))
	g := newGateway(t, h)
	body := chatBody("")
	res := g.post("acme", body)
	wantOK(t, res)
	if !bytes.Contains(res.body, []byte(`"chat.completion"`)) {
		t.Errorf("upstream body not passed through: %s", res.body)
	}
	wait, err := strconv.Atoi(res.header.Get(headerWaitMs))
	if err != nil || wait < 0 {
		t.Errorf("%s = %q, want a non-negative integer", headerWaitMs, res.header.Get(headerWaitMs))
	}
	want := strconv.Itoa(estimate(t, body))
	if got := res.header.Get(headerCost); got != want {
		t.Errorf("%s = %q, want the estimate %s", headerCost, got, want)
	}
	e := g.entry(res)
	if e.tenant != "acme" || e.outcome != outcomeServed || e.cost != want {
		t.Errorf("placeholders: tenant %q outcome %q cost %q; want acme served %s", e.tenant, e.outcome, e.cost, want)
	}
	if w, err := strconv.Atoi(e.waitMs); err != nil || w < 0 {
		t.Errorf("wait_ms placeholder %q", e.waitMs)
	}
	if e.answers != 1 || e.nextCalled || e.err != nil {
		t.Errorf("served request: %d answers, next called %v, error %v", e.answers, e.nextCalled, e.err)
	}

	// Gateway answers set them too, with the error code as outcome; the
	// served-only headers are absent.
	res = g.post("acme", []byte(`{`))
	wantError(t, res, http.StatusBadRequest, "invalid_request")
	if res.header.Get(headerWaitMs) != "" || res.header.Get(headerCost) != "" {
		t.Errorf("error answer carries served-only headers: %v", res.header)
	}
	e = g.entry(res)
	if e.tenant != "acme" || e.outcome != "invalid_request" || e.waitMs == "<unset>" || e.cost != "0" {
		t.Errorf("placeholders of an error: %+v", e)
	}
}

func TestServeUsageBackfill(t *testing.T) {
	u := newFakeUpstream(t)
	u.prompt, u.completion = 123, 45
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"tenants":{"acme":{}}`))
	g := newGateway(t, h)

	served := func() float64 {
		for _, ts := range h.shared.q.Stats(true).Tenants {
			if ts.Name == "acme" {
				return ts.Served
			}
		}
		return 0
	}
	check := func(t *testing.T, body []byte, want float64, stream bool) {
		t.Helper()
		before, servedBefore := counterValue(actualTokens, name, "acme"), served()
		res := g.post("acme", body)
		wantOK(t, res)
		if stream && !bytes.HasSuffix(res.body, []byte("data: [DONE]\n\n")) {
			t.Errorf("stream not passed through whole: %q", res.body)
		}
		g.entry(res) // the handler has returned
		got := counterValue(actualTokens, name, "acme") - before
		if got != want {
			t.Errorf("actual_tokens_total rose by %v, want %v", got, want)
		}
		// The tenant is charged the actual cost, not the estimate.
		eventually(t, "back-fill", func() bool { return served()-servedBefore == want })
	}
	t.Run("json", func(t *testing.T) { check(t, chatBody(""), 123+45, false) })
	t.Run("sse", func(t *testing.T) {
		check(t, chatBody(`"stream":true,"stream_options":{"include_usage":true}`), 123+45, true)
	})
	t.Run("sse without usage", func(t *testing.T) {
		// No usage in the stream: the prompt keeps its estimate and the
		// completion is counted from the streamed text.
		body := chatBody(`"stream":true`)
		req, _ := llmapi.Parse("/v1/chat/completions", body)
		c, _ := llmapi.NewCounter(llmapi.Approx)
		est := llmapi.Estimate(req, c, 512)
		sc := llmapi.NewStreamScanner(c)
		sc.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello there!\"}}]}\n\n"))
		text, _ := sc.Result()
		if text.Completion == 0 {
			t.Fatal("scanner counted no text")
		}
		check(t, body, float64(est.Prompt+text.Completion), true)
	})
}

func TestServeSSEUnbuffered(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, ""))
	g := newGateway(t, h)
	first, release := u.hold("gate")
	defer release()

	resp, err := g.client.Do(g.newRequest(context.Background(), "a", chatBody(`"stream":true`), "X-Test-Gate", "gate"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-first // the upstream wrote and flushed its first chunk, and now waits
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	line := make(chan string, 1)
	br := bufio.NewReader(resp.Body)
	go func() {
		l, _ := br.ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if !strings.Contains(l, `"Hello"`) {
			t.Fatalf("first line %q", l)
		}
	case <-time.After(waitLimit):
		t.Fatalf("the first chunk did not reach the client within %s while the upstream was still streaming: the gateway buffers SSE", waitLimit)
	}
	release()
	rest, err := io.ReadAll(br)
	if err != nil || !bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")) {
		t.Errorf("rest of stream %q, %v", rest, err)
	}
}

func TestServeClientGoneWhileQueued(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":1`))
	g := newGateway(t, h)

	arrived, release := u.hold("slot")
	holder := g.async(g.newRequest(context.Background(), "a", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived

	gone0 := counterValue(requestsTotal, name, unknownTenantLabel, outcomeClientGone)
	ctx, cancel := context.WithCancel(context.Background())
	gone := g.async(g.newRequest(ctx, "b", chatBody(""), "X-Test-Req", "gone"))
	waitQueued(t, h, 1)
	cancel()
	res := <-gone
	if res.err == nil {
		t.Fatalf("cancelled request got an answer: %d", res.status)
	}
	// The ticket leaves the queue at once, without waiting for the slot.
	waitQueued(t, h, 0)
	e := g.entry(res)
	// Only the access log sees the 499: the client is gone.
	if e.outcome != outcomeClientGone || e.tenant != "b" || e.status != statusClientClosed {
		t.Errorf("access entry of the vanished client: %+v", e)
	}

	release()
	wantOK(t, <-holder)
	wantOK(t, g.post("c", chatBody(""))) // the slot was not leaked
	for _, s := range u.requests() {
		if s.header.Get("X-Test-Req") == "gone" {
			t.Fatal("a request whose client left while queued reached the upstream")
		}
	}
	if n := u.hits.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2", n)
	}
	if got := counterValue(requestsTotal, name, unknownTenantLabel, outcomeClientGone) - gone0; got != 1 {
		t.Errorf("requests_total{client_gone} = %v", got)
	}
}

// TestServeClientGoneMidStream: a client that leaves while its response
// streams frees its slot at once, and the request is counted as gone.
func TestServeClientGoneMidStream(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":1`))
	g := newGateway(t, h)
	gone0 := counterValue(requestsTotal, name, unknownTenantLabel, outcomeClientGone)
	first, release := u.hold("gate")
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	resp, err := g.client.Do(g.newRequest(ctx, "a", chatBody(`"stream":true`), "X-Test-Gate", "gate"))
	if err != nil {
		t.Fatal(err)
	}
	<-first
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel() // the upstream still holds the rest of the stream
	resp.Body.Close()
	eventually(t, "the slot to be freed", func() bool { _, inf := queueStats(h); return inf == 0 })
	eventually(t, "client_gone to be counted", func() bool {
		return counterValue(requestsTotal, name, unknownTenantLabel, outcomeClientGone)-gone0 == 1
	})
	if e := g.waitEntries(1)[0]; e.outcome != outcomeClientGone || e.answers != 1 {
		t.Errorf("access entry %+v", e)
	}
	wantOK(t, g.post("b", chatBody(""))) // the one slot is free again
}

func TestServeTenantQueueFull(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"max_inflight":1,"tenants":{"capped":{"max_queue":1}}`))
	g := newGateway(t, h)

	arrived, release := u.hold("slot")
	holder := g.async(g.newRequest(context.Background(), "other", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived
	queued := g.async(g.newRequest(context.Background(), "capped", chatBody("")))
	waitQueued(t, h, 1)

	res := g.post("capped", chatBody(""))
	wantError(t, res, http.StatusTooManyRequests, "tenant_queue_full")
	// Nothing measured yet: a retry in 1-2 s, jittered so that refused
	// clients do not come back together.
	if ra := res.header.Get("Retry-After"); ra != "1" && ra != "2" {
		t.Errorf("Retry-After %q, want 1 or 2", ra)
	}
	// The cap is the tenant's own: others still queue.
	other := g.async(g.newRequest(context.Background(), "other", chatBody("")))
	waitQueued(t, h, 2)

	release()
	for _, ch := range []<-chan result{holder, queued, other} {
		wantOK(t, <-ch)
	}
	for _, e := range g.waitEntries(4) {
		if e.answers != 1 {
			t.Errorf("request answered %d times: %+v", e.answers, e)
		}
	}
}

func TestServeProxyError(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"tenants":{"acme":{}}`))
	g := newGateway(t, h)
	u.srv.Close() // nothing listens any more

	res := g.post("acme", chatBody(""))
	if res.err != nil || res.status != http.StatusBadGateway {
		t.Fatalf("got %d %v, want 502 from the proxy", res.status, res.err)
	}
	var b apiErrorBody
	if err := json.Unmarshal(res.body, &b); err != nil || b.Error.Code != outcomeProxyError {
		t.Errorf("502 body %q: want the API error shape with code %s", res.body, outcomeProxyError)
	}
	e := g.entry(res)
	if e.outcome != outcomeProxyError || e.answers != 1 {
		t.Errorf("access entry %+v", e)
	}
	// The upstream did no work: the estimate is credited back.
	eventually(t, "slot freed", func() bool { _, inf := queueStats(h); return inf == 0 })
	for _, ts := range h.shared.q.Stats(true).Tenants {
		if ts.Name == "acme" && ts.Served != 0 {
			t.Errorf("tenant charged %v for a request the upstream never served", ts.Served)
		}
	}
}

// TestServeOneAnswerEach throws a concurrent mix at a small queue — floods,
// per-tenant caps, short budgets, clients that give up — and checks that
// every request got exactly one answer from the contract, that only served
// requests reached the upstream, and that the queue ends empty.
func TestServeOneAnswerEach(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":3,"max_queue":40,`+
		`"tenants":{"flood":{"max_queue":10},"rt":{"class":"realtime","weight":4}}`))
	g := newGateway(t, h)
	g.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64

	const n = 400
	before := outcomesOf(name)
	tenants := []string{"flood", "flood", "flood", "rt", "x", "y"}
	var wg sync.WaitGroup
	results := make([]result, n)
	cancelled := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			ctx := context.Background()
			hdr := []string{"X-Test-Delay", fmt.Sprintf("%dms", 1+rng.IntN(8))}
			switch rng.IntN(10) {
			case 0, 1:
				hdr = append(hdr, headerWaitBudget, fmt.Sprintf("%dms", 20+rng.IntN(200)))
			case 2:
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(20))*time.Millisecond)
				defer cancel()
				cancelled[i] = true
			}
			extra := ""
			if rng.IntN(3) == 0 {
				extra = `"stream":true,"stream_options":{"include_usage":true}`
			}
			results[i] = g.do(g.newRequest(ctx, tenants[rng.IntN(len(tenants))], chatBody(extra), hdr...))
		}()
	}
	wg.Wait()

	codes := map[string]int{}
	served := 0
	for i, res := range results {
		if res.err != nil {
			if !cancelled[i] {
				t.Errorf("request %d: %v", i, res.err)
			}
			continue
		}
		switch res.status {
		case http.StatusOK:
			served++
			if !bytes.Contains(res.body, []byte("chat.completion")) {
				t.Errorf("request %d: 200 with body %q", i, res.body)
			}
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			var b apiErrorBody
			if err := json.Unmarshal(res.body, &b); err != nil || res.header.Get("Retry-After") == "" {
				t.Errorf("request %d: %d %q (Retry-After %q)", i, res.status, res.body, res.header.Get("Retry-After"))
			}
			codes[b.Error.Code]++
		default:
			t.Errorf("request %d: unexpected status %d: %s", i, res.status, res.body)
		}
	}
	// Close waits for every handler still running; a client that gave up
	// early may never have reached the gateway at all.
	g.client.CloseIdleConnections()
	g.front.Close()
	es := g.log()
	answered := 0
	for _, res := range results {
		if res.err == nil {
			answered++
		}
	}
	if len(es) > n || len(es) < answered {
		t.Errorf("%d access entries for %d requests of which %d were answered", len(es), n, answered)
	}
	outcomes := map[string]int{}
	for _, e := range es {
		outcomes[e.outcome]++
		if e.answers > 1 || e.nextCalled {
			t.Errorf("access entry %+v: %d answers", e, e.answers)
		}
		if e.answers == 0 && e.outcome != outcomeClientGone {
			t.Errorf("request ended without an answer: %+v", e)
		}
	}
	// Every request was recorded once, with the outcome it was answered.
	total := 0.0
	for o, v := range outcomesOf(name) {
		total += v - before[o]
	}
	if total != float64(len(es)) {
		t.Errorf("requests_total sums to %v over %v, want one per request handled, %d", total, outcomesOf(name), len(es))
	}
	// Only dispatched requests reached the upstream. Every served or failed
	// request did; a client_gone request did only if it gave up after its
	// dispatch (mid-request or mid-response) rather than while queued, and
	// the outcome does not tell the two apart, so it bounds the count.
	dispatched := outcomes[outcomeServed] + outcomes[outcomeProxyError]
	if got := int(u.hits.Load()); got < dispatched || got > dispatched+outcomes[outcomeClientGone] {
		t.Errorf("upstream saw %d requests, %d were served or failed and %d gave up (outcomes %v)",
			got, dispatched, outcomes[outcomeClientGone], outcomes)
	}
	eventually(t, "an empty queue", func() bool { q, inf := queueStats(h); return q == 0 && inf == 0 })
	t.Logf("served %d, errors %v, outcomes %v", served, codes, outcomes)
	if served == 0 || codes["tenant_queue_full"] == 0 {
		t.Errorf("the mix did not exercise the queue: served %d, errors %v", served, codes)
	}
}

// TestServeReloadKeepsRequests swaps the config under a queued and an
// in-flight request, as a reload does: the new handler joins the same
// queue, the old one is cleaned up while its requests still wait and
// stream, and both are served.
func TestServeReloadKeepsRequests(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	old, stopOld := mustLoad(t, fqConfig(name, u, `"max_inflight":1`))
	g := newGateway(t, old)

	arrived, release := u.hold("slot")
	inflight := g.async(g.newRequest(context.Background(), "a", chatBody(""), "X-Test-Hold", "slot"))
	<-arrived
	queued := g.async(g.newRequest(context.Background(), "b", chatBody(`"stream":true`)))
	waitQueued(t, old, 1)

	nw, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":2,"tenants":{"b":{"weight":5}}`))
	if nw.shared != old.shared {
		t.Fatal("the new config did not pick up the named queue")
	}
	g.h.Store(nw)
	stopOld() // the old config's context ends: its Cleanup runs now
	// The new capacity (2) dispatches the queued request at once.
	waitQueued(t, nw, 0)
	wantOK(t, <-queued)
	release()
	wantOK(t, <-inflight)
	wantOK(t, g.post("c", chatBody("")))
	for _, e := range g.waitEntries(3) {
		if e.answers != 1 || e.outcome != outcomeServed {
			t.Errorf("access entry %+v", e)
		}
	}
}

// TestPoolReload drives pool.go's adopt/abandon as Caddy's config loads do:
// the second handler of a name reuses the queue and applies its config once
// its load has started; cleaning up the older keeps the queue; a config
// that failed after provisioning never takes over; the last Cleanup stops
// the queue's ticker.
func TestPoolReload(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	u := newFakeUpstream(t)
	name := queueName(t)
	cfg := func(inflight int, weight float64) string {
		return fqConfig(name, u, fmt.Sprintf(`"max_inflight":%d,"tenants":{"acme":{"weight":%v}}`, inflight, weight))
	}
	state := func(h *Handler) (inflight int, weight float64) {
		c := h.shared.q.Config()
		return c.MaxInflight, c.Tenants["acme"].Weight
	}
	capacity := func(h *Handler) int { return h.shared.q.Stats(false).Capacity }

	a, stopA := mustLoad(t, cfg(2, 1))
	s := a.shared
	if in, w := state(a); in != 2 || w != 1 || capacity(a) != 2 {
		t.Fatalf("first config: max_inflight %d weight %v capacity %d", in, w, capacity(a))
	}

	b, stopB := mustLoad(t, cfg(5, 7))
	if b.shared != s {
		t.Fatal("a second handler of the same name made a new queue")
	}
	if in, w := state(b); in != 5 || w != 7 || capacity(b) != 5 || s.owner() != b {
		t.Fatalf("after reload: max_inflight %d weight %v capacity %d; want 5, 7, 5 owned by the new handler", in, w, capacity(b))
	}

	stopA() // the old config is cleaned up after the new one started
	if !inPool(name) {
		t.Fatal("cleaning up the old handler removed the queue")
	}
	if in, w := state(b); in != 5 || w != 7 || s.owner() != b {
		t.Fatalf("after the old Cleanup: max_inflight %d weight %v", in, w)
	}
	g := newGateway(t, b)
	wantOK(t, g.post("acme", chatBody("")))

	// A config that fails to load after this handler was provisioned
	// (a later module's error): it never started, so it never ran the
	// queue, not even until Caddy cancelled its context and Cleanup ran.
	ctxC, stopC := configContext(t)
	if _, err := loadHandler(ctxC, cfg(9, 2)); err != nil {
		t.Fatal(err)
	}
	if in, w := state(b); in != 5 || w != 7 || capacity(b) != 5 || s.owner() != b {
		t.Fatalf("a provisioned config that has not started took over: max_inflight %d weight %v capacity %d", in, w, capacity(b))
	}
	stopC()
	if in, w := state(b); in != 5 || w != 7 || capacity(b) != 5 || s.owner() != b {
		t.Fatalf("after the failed config's Cleanup: max_inflight %d weight %v capacity %d; want the previous 5, 7, 5",
			in, w, capacity(b))
	}

	// A handler that fails during provisioning leaves the queue as it was.
	ctx, cancel := configContext(t)
	_, err := loadHandler(ctx, fmt.Sprintf(`{"name":%q,"max_inflight":3,"proxy":{"handler":"static_response"}}`, name))
	cancel()
	if err == nil {
		t.Fatal("a non-reverse_proxy proxy was accepted")
	}
	if in, w := state(b); in != 5 || w != 7 || s.owner() != b {
		t.Fatalf("after a failed provisioning: max_inflight %d weight %v", in, w)
	}
	wantOK(t, g.post("acme", chatBody("")))

	stopB() // the last user: the queue and its ticker go
	if inPool(name) {
		t.Fatal("the queue outlived its last handler")
	}
	select {
	case <-s.done:
	case <-time.After(waitLimit):
		t.Fatalf("the queue's ticker did not stop within %s", waitLimit)
	}
	g.client.CloseIdleConnections()
	g.front.Close()
	u.srv.Close()
	goleak.VerifyNone(t, ignore)
}

func inPool(name string) bool {
	found := false
	queues.Range(func(k, _ any) bool {
		if k == name {
			found = true
		}
		return !found
	})
	return found
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                 true,
		"text/event-stream; charset=utf-8":  true,
		" Text/Event-Stream ;charset=utf-8": true,
		"application/json":                  false,
		"text/event-streams":                false,
		"":                                  false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestReadGrowing(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 300_000)
	for _, cl := range []int64{-1, 0, 10, 299_999, 300_000, 300_001, 5_000_000} {
		got, err := readGrowing(iotest.OneByteReader(bytes.NewReader(body[:3000])), cl, 8<<20, nil)
		if err != nil || !bytes.Equal(got, body[:3000]) {
			t.Errorf("Content-Length %d, one byte at a time: %d bytes, %v", cl, len(got), err)
		}
		got, err = readGrowing(bytes.NewReader(body), cl, 8<<20, nil)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("Content-Length %d: %d bytes, %v", cl, len(got), err)
		}
	}
	// A client announcing 8 MB and sending 10 bytes pins no more than the
	// preallocation: the buffer follows the bytes, not the announcement.
	got, err := readGrowing(bytes.NewReader(body[:10]), 8<<20, 8<<20, nil)
	if err != nil || len(got) != 10 || cap(got) > bodyPrealloc {
		t.Errorf("announced 8 MB, sent 10 bytes: len %d cap %d (%v), want cap <= %d", len(got), cap(got), err, bodyPrealloc)
	}
	// An honest announcement is read without regrowing past it.
	got, _ = readGrowing(bytes.NewReader(body), int64(len(body)), 8<<20, nil)
	if cap(got) > len(body)+1 {
		t.Errorf("Content-Length %d: cap %d, want at most %d", len(body), cap(got), len(body)+1)
	}
	// The limit still answers 413 through http.MaxBytesReader.
	var mbe *http.MaxBytesError
	for _, cl := range []int64{3000, 50, -1} {
		_, err := readGrowing(http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(bytes.NewReader(body[:3000])), 100), cl, 100, nil)
		if !errors.As(err, &mbe) {
			t.Errorf("over the limit, Content-Length %d: %v, want *http.MaxBytesError", cl, err)
		}
	}
}
