package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Two handlers of one config load that name the same queue would share one
// proxy and one health view: the second is refused with the cause named.
func TestProvisionRefusesDuplicateName(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	ctx, cancel := configContext(t)
	defer cancel()
	if _, err := loadHandler(ctx, fqConfig(name, u, "")); err != nil {
		t.Fatal(err)
	}
	_, err := loadHandler(ctx, fqConfig(name, u, ""))
	if err == nil || !strings.Contains(err.Error(), "two fair_queue handlers are named") {
		t.Fatalf("second handler named %q in one config: %v, want a refusal", name, err)
	}
	// A reload (a new config context) shares the queue by design.
	h2, stop := mustLoad(t, fqConfig(name, u, ""))
	defer stop()
	if h2.shared == nil {
		t.Fatal("a reload's handler did not join the queue")
	}
}

func TestProxyDefaults(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"handler":"reverse_proxy"}`,
			`{"handler":"reverse_proxy","load_balancing":{"selection_policy":{"policy":"least_conn"}},"transport":{"protocol":"http","read_timeout":"5m0s"}}`},
		// What the operator set stays.
		{`{"load_balancing":{"selection_policy":{"policy":"first"}},"transport":{"protocol":"http","read_timeout":"1m","dial_timeout":"1s"}}`,
			`{"load_balancing":{"selection_policy":{"policy":"first"}},"transport":{"protocol":"http","read_timeout":"1m","dial_timeout":"1s"}}`},
		{`{"transport":{"protocol":"http","tls":{}}}`,
			`{"load_balancing":{"selection_policy":{"policy":"least_conn"}},"transport":{"protocol":"http","read_timeout":"5m0s","tls":{}}}`},
		// JSON null is an absent object.
		{`{"load_balancing":null,"transport":null}`,
			`{"load_balancing":{"selection_policy":{"policy":"least_conn"}},"transport":{"protocol":"http","read_timeout":"5m0s"}}`},
		// Another transport has no read_timeout to set.
		{`{"transport":{"protocol":"fastcgi"}}`,
			`{"load_balancing":{"selection_policy":{"policy":"least_conn"}},"transport":{"protocol":"fastcgi"}}`},
	} {
		got, err := proxyDefaults(json.RawMessage(tc.in), "least_conn")
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if string(got) != tc.want {
			t.Errorf("proxyDefaults(%s)\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// A request over max_request_tokens (the queue's, a tenant's, or the
// in-flight token capacity of one model server) is refused at once with
// OpenAI's code and the limit named; it never reaches the queue.
func TestServeRequestTokenLimit(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u,
		`"max_request_tokens":5000,"tenants":{"small":{"max_request_tokens":1000}}`))
	g := newGateway(t, h)
	capped := func(maxTokens string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":` + maxTokens + `}`)
	}
	wantOK(t, g.post("a", capped("4000")))
	over := g.post("a", capped("1000000000000000"))
	e := wantError(t, over, http.StatusBadRequest, codeContextLength)
	if !strings.Contains(e.Error.Message, "5000 tokens per request") {
		t.Errorf("message %q does not name the limit", e.Error.Message)
	}
	e = wantError(t, g.post("small", capped("2000")), http.StatusBadRequest, codeContextLength)
	if !strings.Contains(e.Error.Message, "1000 tokens per request") || !strings.Contains(e.Error.Message, "tenant's") {
		t.Errorf("message %q does not name the tenant's limit", e.Error.Message)
	}
	if n := u.hits.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
	if q, _ := queueStats(h); q != 0 {
		t.Errorf("%d queued after refusals", q)
	}

	h2, _ := mustLoad(t, fqConfig(queueName(t)+"_tok", u, `"max_inflight_tokens":3000`))
	g2 := newGateway(t, h2)
	e = wantError(t, g2.post("a", capped("3500")), http.StatusBadRequest, codeContextLength)
	if !strings.Contains(e.Error.Message, fmt.Sprint(3000)) || !strings.Contains(e.Error.Message, "max_inflight_tokens") {
		t.Errorf("message %q does not name max_inflight_tokens", e.Error.Message)
	}
}

func TestMetricNames(t *testing.T) {
	names := MetricNames()
	want := map[string]bool{"caddy_fair_queue_requests_total": false, "caddy_fair_queue_queue_depth": false,
		"caddy_fair_queue_degrade_transitions_total": false, "caddy_fair_queue_water_level": false}
	for _, n := range names {
		if _, ok := want[n]; ok {
			want[n] = true
		}
		if !strings.HasPrefix(n, "caddy_fair_queue_") {
			t.Errorf("metric %q outside the caddy_fair_queue_ namespace", n)
		}
	}
	for n, seen := range want {
		if !seen {
			t.Errorf("MetricNames lacks %s: %v", n, names)
		}
	}
}

// A new config takes over a running queue once its load has started; if
// Caddy's "started" event does not come, the first request the new handler
// serves proves the config live and commits it.
func TestConfigCommitsOnFirstRequest(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	a, _ := mustLoad(t, fqConfig(name, u, `"max_inflight":2`))
	ctx, cancel := configContext(t)
	defer cancel()
	b, err := loadHandler(ctx, fqConfig(name, u, `"max_inflight":5`))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.shared.q.Config().MaxInflight; got != 2 {
		t.Fatalf("max_inflight %d before the new config started, want the running 2", got)
	}
	wantOK(t, newGateway(t, b).post("x", chatBody("")))
	if got := a.shared.q.Config().MaxInflight; got != 5 || a.shared.owner() != b {
		t.Fatalf("after the new handler served a request: max_inflight %d, want 5", got)
	}
}

// With handle_errors, a refusal is handed to Caddy as an error with its
// status, for the site's handle_errors routes; nothing is written, and the
// placeholders say what happened.
func TestHandleErrors(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"handle_errors":true,"reject_unknown_tenants":true`))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody("")))
	r.Header.Set("X-Tenant-ID", "stranger")
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
	err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != http.StatusForbidden {
		t.Fatalf("ServeHTTP returned %v, want a HandlerError with 403", err)
	}
	if w.Body.Len() != 0 {
		t.Errorf("wrote %q; the site's error routes should answer", w.Body.String())
	}
	if code, _ := repl.GetString("http.fair_queue.error_code"); code != outcomeUnknown {
		t.Errorf("{http.fair_queue.error_code} = %q, want %q", code, outcomeUnknown)
	}
}

// A panic in one tick is logged and the next tick runs: a queue nobody
// ticks would let its waiters miss every deadline.
func TestTickRecoversPanic(t *testing.T) {
	s, err := newSharedQueue(queueName(t), minimalQueueConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destruct()
	core, logs := observer.New(zap.ErrorLevel)
	// An owner whose health view panics (an upstream pool with a hole).
	h := &Handler{logger: zap.New(core), proxy: &reverseproxy.Handler{Upstreams: reverseproxy.UpstreamPool{nil}}}
	s.owners = append(s.owners, h)
	s.tick()
	s.tick()
	if n := logs.FilterMessage("panic in the queue's tick").Len(); n != 2 {
		t.Fatalf("%d panics logged, want 2 (one per tick, the loop going on)", n)
	}
}

// minimalQueueConfig is a valid scheduler config with one slot per upstream.
func minimalQueueConfig(t *testing.T) fairqueue.Config {
	h := &Handler{}
	h.setDefaults()
	cfg, err := h.queueConfig()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestProvisionRefusesNegativeLimits(t *testing.T) {
	u := newFakeUpstream(t)
	for _, extra := range []string{`"max_body":-1`, `"body_timeout":-1`, `"max_request_tokens":-5`,
		`"default_max_tokens":-1`, `"max_queue_bytes":-1`, `"tenants":{"a":{"max_request_tokens":-1}}`} {
		ctx, cancel := configContext(t)
		_, err := loadHandler(ctx, fqConfig(queueName(t), u, extra))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%s: %v, want a refusal naming the negative value", extra, err)
		}
	}
}

func TestServeTenantIDTooLong(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, ""))
	g := newGateway(t, h)
	wantError(t, g.post(strings.Repeat("t", fairqueue.MaxTenantIDLen+1), chatBody("")), http.StatusBadRequest, outcomeInvalid)
	wantOK(t, g.post(strings.Repeat("t", fairqueue.MaxTenantIDLen), chatBody("")))
}

// Bodies being received are bounded together: past the limit a new upload
// is refused before it is read, and bytes come back as bodies finish.
func TestReserveReading(t *testing.T) {
	var s sharedQueue
	if !s.reserveReading(600, 1000) || !s.reserveReading(400, 1000) {
		t.Fatal("reservations within the limit refused")
	}
	if s.reserveReading(1, 1000) {
		t.Fatal("a reservation past the limit was granted")
	}
	s.reading.Add(-600)
	if !s.reserveReading(500, 1000) {
		t.Fatal("bytes given back were not reusable")
	}
	var lone sharedQueue
	if !lone.reserveReading(5000, 1000) {
		t.Fatal("a lone body larger than the limit must still be read (max_body bounds it)")
	}
}

// If the "started" event never comes, the old config's Cleanup (which
// Caddy runs only after the new config started) hands the queue to the
// newest pending config.
func TestConfigCommitsWhenOldLeaves(t *testing.T) {
	u := newFakeUpstream(t)
	name := queueName(t)
	a, stopA := mustLoad(t, fqConfig(name, u, `"max_inflight":2`))
	s := a.shared
	ctx, cancel := configContext(t)
	defer cancel()
	b, err := loadHandler(ctx, fqConfig(name, u, `"max_inflight":7`))
	if err != nil {
		t.Fatal(err)
	}
	stopA()
	if got := s.q.Config().MaxInflight; got != 7 || s.owner() != b {
		t.Fatalf("after the old config left: max_inflight %d, want the new 7", got)
	}
}

// Body buffers are reserved as they grow: a chunked body is refused once
// the reservations reach the limit, and what is reserved is what the
// buffers hold, not what the client announced.
func TestReadGrowingReserves(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 1<<20)
	budget := func(limit int64) (func(int64) bool, *int64) {
		var held int64
		return func(n int64) bool {
			if held+n > limit {
				return false
			}
			held += n
			return true
		}, &held
	}
	reserve, held := budget(300 << 10)
	if _, err := readGrowing(bytes.NewReader(body), -1, 8<<20, reserve); !errors.Is(err, errReceivingFull) {
		t.Fatalf("1 MiB chunked against 300 KiB: %v, want errReceivingFull", err)
	}
	if *held > 300<<10 {
		t.Errorf("reserved %d, over the limit", *held)
	}
	reserve, held = budget(8 << 20)
	got, err := readGrowing(bytes.NewReader(body), -1, 8<<20, reserve)
	if err != nil || len(got) != len(body) {
		t.Fatalf("1 MiB chunked: %d bytes, %v", len(got), err)
	}
	if *held < int64(cap(got)) || *held > 2*int64(len(body)) {
		t.Errorf("reserved %d for a buffer of cap %d", *held, cap(got))
	}
	// A lying Content-Length reserves only the first buffer.
	reserve, held = budget(8 << 20)
	if _, err := readGrowing(bytes.NewReader(body[:10]), 8<<20, 8<<20, reserve); err != nil || *held != bodyPrealloc {
		t.Errorf("announced 8 MiB, sent 10 bytes: reserved %d (%v), want %d", *held, err, bodyPrealloc)
	}
}
