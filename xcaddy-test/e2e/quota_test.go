package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Tenant quotas end to end: a tenant over its token quota waits
// in its queue, holding no slot, when the quota allows it within its wait
// budget, and is refused at once with 429 quota_exceeded and an exact
// Retry-After when it does not; every answer to it carries OpenAI's
// x-ratelimit-* headers, which the official client reads.

const quotaTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 1
		tenant metered weight 1 class interactive wait_budget 7500ms {
			quota tokens_per_min 12000 burst_allow 0
		}
		tenant sdk weight 1 class interactive wait_budget 500ms {
			quota tokens_per_min 12000 burst_allow 0
		}
		tenant free weight 1 class interactive
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// 1000 output tokens at 12000 tokens/min: each request is five seconds
// of quota, and 100 ms upstream. Seconds, so that what the tests decide
// (a request fits its budget behind the quota, or not) has seconds of room
// for a slow machine between one request and the next.
const (
	quotaTokens = 1000
	quotaEach   = 5 * time.Second
)

func startQuotaGateway(t *testing.T, prefix string) (*harness.Caddy, string, []*harness.Fake) {
	fakes := startFakes(t, 1, prefix, harness.FakeOptions{Slots: 4, TTFT: 10 * time.Millisecond, PerToken: 100 * time.Microsecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, quotaTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 1, "caddy_fair_queue_capacity")
	return c, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]), fakes
}

func waitMs(t *testing.T, r result) time.Duration {
	t.Helper()
	ms, err := strconv.Atoi(r.Header.Get("X-Fair-Queue-Wait-Ms"))
	if err != nil {
		t.Fatalf("%s: no X-Fair-Queue-Wait-Ms: %v", r.TestID, r)
	}
	return time.Duration(ms) * time.Millisecond
}

func TestQuotaTokens(t *testing.T) {
	t.Parallel()
	c, base, fakes := startQuotaGateway(t, "quota")
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx := context.Background()
	req := func(tenant, id string) chatReq {
		return chatReq{Tenant: tenant, TestID: id, MaxTokens: quotaTokens, IgnoreEOS: true}
	}

	r1 := sendTimed(ctx, cl, base, req("metered", "q1"))
	expectServed(t, r1.result)
	if got := r1.Header.Get("X-Ratelimit-Limit-Tokens"); got != "12000" {
		t.Errorf("x-ratelimit-limit-tokens %q, want 12000", got)
	}
	if got := r1.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "0" {
		t.Errorf("x-ratelimit-remaining-tokens %q, want 0 (no burst, five seconds of debt)", got)
	}
	// The debt is five seconds from the charge, which came after sending
	// and before the answer: the reset is within the request's time of it.
	if reset, err := time.ParseDuration(r1.Header.Get("X-Ratelimit-Reset-Tokens")); err != nil ||
		reset < quotaEach-r1.Latency()-50*time.Millisecond || reset > quotaEach+50*time.Millisecond {
		t.Errorf("x-ratelimit-reset-tokens %q, want %v less at most the request's %v (%d tokens at 200/s)",
			r1.Header.Get("X-Ratelimit-Reset-Tokens"), quotaEach, r1.Latency(), quotaTokens)
	}
	if h := r1.Header.Get("X-Ratelimit-Limit-Requests"); h != "" {
		t.Errorf("a token-only quota reports requests: %q", h)
	}

	// q2 fits its 7.5 s budget behind the quota (5 s): it waits. q3,
	// behind q2 (10 s), does not: refused at once, the meter and the exact
	// time named.
	ch2 := asyncTimed(ctx, cl, base, req("metered", "q2"))
	waitMetric(t, c, "q2 queued", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_queue_depth", "tenant", "metered") == 1
	})
	// The only slot is free while metered is held: another tenant takes it.
	expectServed(t, send(ctx, cl, base, req("free", "f1")))
	r3 := sendTimed(ctx, cl, base, req("metered", "q3"))
	e := expectError(t, r3.result, http.StatusTooManyRequests, "quota_exceeded", "rate_limit_error", true)
	var body struct {
		Error struct{ Reason string } `json:"error"`
	}
	_ = json.Unmarshal(r3.Body, &body)
	if body.Error.Reason != "tokens" {
		t.Errorf("q3: error.reason %q, want tokens (%s)", body.Error.Reason, e.Message)
	}
	// Behind q1's and q2's five seconds each, counted from q1's charge
	// (after q1 was sent), less what had passed when q3 was refused
	// (before its answer came).
	retryMs, err := strconv.Atoi(r3.Header.Get("Retry-After-Ms"))
	retry := time.Duration(retryMs) * time.Millisecond
	if lo, hi := 2*quotaEach-r3.Recv.Sub(r1.Sent)-50*time.Millisecond, 2*quotaEach+50*time.Millisecond; err != nil || retry < lo || retry > hi {
		t.Fatalf("q3: Retry-After-Ms %q, want the time behind q2: between %v and %v", r3.Header.Get("Retry-After-Ms"), lo, hi)
	}
	if ra, _ := strconv.Atoi(r3.Header.Get("Retry-After")); ra != (retryMs+999)/1000 {
		t.Errorf("q3: Retry-After %d, want Retry-After-Ms %d rounded up to seconds", ra, retryMs)
	}
	if r3.Header.Get("X-Ratelimit-Limit-Tokens") != "12000" {
		t.Errorf("q3: the refusal carries no x-ratelimit headers: %v", r3.Header)
	}
	r2 := await(t, ch2, "q2")
	expectServed(t, r2.result)
	// Held until q1's debt was paid: five seconds from q1's charge, less
	// what had passed between that and q2's arrival.
	if w, least := waitMs(t, r2.result), quotaEach-r2.Sent.Sub(r1.Sent)-50*time.Millisecond; w < least {
		t.Errorf("q2 waited %v, want at least %v: the quota (five seconds a request) did not hold it", w, least)
	}
	expectNotUpstream(t, fakes, "q3")

	// Retrying at exactly Retry-After-Ms, the request goes: within a
	// tick (50 ms) of the hold's end, not a second quota wait.
	time.Sleep(time.Until(r3.Recv.Add(retry)))
	r4 := send(ctx, cl, base, req("metered", "q4"))
	expectServed(t, r4)
	if w := waitMs(t, r4); w*4 > retry {
		t.Errorf("q4, sent at q3's Retry-After-Ms (%d ms), waited %v: more than a quarter of it", retryMs, w)
	}

	s := scrape(t, c)
	if n := metric(s, "caddy_fair_queue_quota_limited_total", "tenant", "metered", "reason", "tokens", "action", "refused"); n != 1 {
		t.Errorf("quota_limited_total refused = %v, want 1", n)
	}
	if n := metric(s, "caddy_fair_queue_quota_limited_total", "tenant", "metered", "reason", "tokens", "action", "delayed"); n < 1 {
		t.Errorf("quota_limited_total delayed = %v, want >= 1", n)
	}
	if n := metric(s, "caddy_fair_queue_quota_limit", "tenant", "metered", "meter", "tokens"); n != 12000 {
		t.Errorf("quota_limit tokens = %v, want 12000", n)
	}
	if n := metric(s, "caddy_fair_queue_quota_charged_total", "tenant", "metered", "meter", "tokens"); n < 3*quotaTokens {
		t.Errorf("quota_charged_total tokens = %v, want >= %d (three served requests)", n, 3*quotaTokens)
	}
	if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "metered", "outcome", "quota_exceeded"); n != 1 {
		t.Errorf("requests_total quota_exceeded = %v, want 1", n)
	}
}

// clientStep is what client.mjs reports for one request.
type clientStep struct {
	ID      string            `json:"id"`
	OK      bool              `json:"ok"`
	Status  int               `json:"status"`
	Ms      int               `json:"ms"`
	Headers map[string]string `json:"headers"`
	Code    string            `json:"code"`
	Type    string            `json:"type"`
	Reason  string            `json:"reason"`
	Message string            `json:"message"`
}

// runOpenAIClient runs the official OpenAI Node client (installed by
// scripts/test.sh with npm ci in xcaddy-test/openai-client) on a plan of
// id:maxRetries:maxTokens steps.
func runOpenAIClient(t *testing.T, base, tenant, plan string) []clientStep {
	t.Helper()
	out := harness.NodeClient(t, "../openai-client", "openai", "FQ_BASE="+base, "FQ_TENANT="+tenant, "FQ_PLAN="+plan)
	var steps []clientStep
	if err := json.Unmarshal(out, &steps); err != nil {
		t.Fatalf("client output: %v: %s", err, out)
	}
	return steps
}

// TestQuotaOpenAIClient: the official client reads the x-ratelimit-*
// headers of a served response, and on 429 quota_exceeded waits the
// gateway's retry-after-ms and retries by itself, served; with retries
// off it surfaces the error's code and reason.
func TestQuotaOpenAIClient(t *testing.T) {
	t.Parallel()
	c, base, _ := startQuotaGateway(t, "sdk")
	steps := runOpenAIClient(t, base, "sdk", fmt.Sprintf("a:2:%d,b:2:%d,c:0:%d", quotaTokens, quotaTokens, quotaTokens))
	if len(steps) != 3 {
		t.Fatalf("client reported %d steps, want 3: %+v", len(steps), steps)
	}
	a, b, cc := steps[0], steps[1], steps[2]
	if !a.OK || a.Headers["x-ratelimit-limit-tokens"] != "12000" || a.Headers["x-ratelimit-remaining-tokens"] != "0" ||
		a.Headers["x-ratelimit-reset-tokens"] == "" {
		t.Errorf("a: %+v; want served with x-ratelimit-limit-tokens 12000, remaining 0 and a reset", a)
	}
	// b arrives with nearly five seconds of debt left, far past its 500 ms
	// budget: refused, then retried by the client after retry-after-ms,
	// served.
	if !b.OK || b.Ms < 500 {
		t.Errorf("b: %+v; want served after the client waited out a quota_exceeded (>= 500 ms)", b)
	}
	if cc.OK || cc.Status != http.StatusTooManyRequests || cc.Code != "quota_exceeded" || cc.Reason != "tokens" ||
		cc.Type != "rate_limit_error" || cc.Headers["retry-after-ms"] == "" || cc.Headers["x-ratelimit-limit-tokens"] != "12000" {
		t.Errorf("c (no retries): %+v; want 429 quota_exceeded, reason tokens, with retry-after-ms and x-ratelimit headers", cc)
	}
	s := scrape(t, c)
	if n := metric(s, "caddy_fair_queue_quota_limited_total", "tenant", "sdk", "reason", "tokens", "action", "refused"); n != 2 {
		t.Errorf("quota_limited_total refused = %v, want 2 (b's first try, c)", n)
	}
	if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "sdk", "outcome", "served"); n != 2 {
		t.Errorf("served = %v, want 2 (a, b's retry)", n)
	}
}
