package caddyfairqueue

// Helpers for the in-process handler tests and benchmarks: an
// OpenAI-compatible upstream, handlers provisioned the real way (a
// caddy.Context from caddy.ProvisionContext, ctx.LoadModuleByID, which runs
// Provision and Validate and loads the inner reverse_proxy; cancelling the
// context runs Cleanup), and a front server that prepares each request as
// Caddy's HTTP server does and records what an access log would see.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/testwait"
)

// waitLimit bounds every wait for an event in these tests, times
// testwait.Slowdown (FQ_TEST_SLOWDOWN, raised by scripts/test.sh under the
// race detector): a guard that turns a hang into a failure naming what was
// awaited, never a bound on speed.
var waitLimit = testwait.Scale(10 * time.Second)

// ---------------------------------------------------------------- upstream

// seenRequest is what the upstream received.
type seenRequest struct {
	path          string
	body          []byte
	contentLength int64  // r.ContentLength
	clHeader      string // the Content-Length header on the wire
	chunked       bool   // the request came with Transfer-Encoding: chunked
	header        http.Header
}

// fakeUpstream is a small OpenAI-compatible model server: chat completions,
// streamed (SSE, usage in the last chunk when stream_options.include_usage)
// or not, with fixed usage. A request carrying "X-Test-Hold: <name>" blocks
// until the test releases that hold (or the request ends), so tests can fill
// dispatch slots deterministically; "X-Test-Delay: <duration>" delays the
// answer.
type fakeUpstream struct {
	srv  *httptest.Server
	hits atomic.Int64

	mu    sync.Mutex
	seen  []seenRequest
	holds map[string]*hold

	// usage the upstream reports.
	prompt, completion int
}

type hold struct {
	arrived chan struct{} // one value per request that arrived
	release chan struct{} // closed by the test
	once    sync.Once
}

func newFakeUpstream(tb testing.TB) *fakeUpstream {
	tb.Helper()
	u := &fakeUpstream{holds: map[string]*hold{}, prompt: 11, completion: 7}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	tb.Cleanup(func() {
		u.releaseAll()
		u.srv.Close()
	})
	return u
}

// dial is the upstream's address for a reverse_proxy config.
func (u *fakeUpstream) dial() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// hold registers a hold: requests with X-Test-Hold: name block until the
// returned release is called.
func (u *fakeUpstream) hold(name string) (arrived <-chan struct{}, release func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := &hold{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.holds[name] = h
	return h.arrived, func() { h.once.Do(func() { close(h.release) }) }
}

func (u *fakeUpstream) releaseAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range u.holds {
		h.once.Do(func() { close(h.release) })
	}
}

func (u *fakeUpstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

func (u *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.hits.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.seen = append(u.seen, seenRequest{path: r.URL.Path, body: body, contentLength: r.ContentLength,
		clHeader: r.Header.Get("Content-Length"), chunked: len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked",
		header: r.Header.Clone()})
	h := u.holds[r.Header.Get("X-Test-Hold")]
	u.mu.Unlock()
	if h != nil {
		h.arrived <- struct{}{}
		select {
		case <-h.release:
		case <-r.Context().Done():
			return
		}
	}
	if d, err := time.ParseDuration(r.Header.Get("X-Test-Delay")); err == nil {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			u.prompt, u.completion, u.prompt+u.completion)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	// X-Test-Gate: <hold> sends the first chunk, flushes it, and sends the
	// rest only once the test released the hold: a gateway that buffers
	// the stream never shows the client the first chunk.
	u.mu.Lock()
	gate := u.holds[r.Header.Get("X-Test-Gate")]
	u.mu.Unlock()
	for i, tok := range []string{"Hello", " there", "!"} {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
		if i == 0 && gate != nil {
			http.NewResponseController(w).Flush()
			gate.arrived <- struct{}{}
			select {
			case <-gate.release:
			case <-r.Context().Done():
				return
			}
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+
			"\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
			u.prompt, u.completion, u.prompt+u.completion)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// ---------------------------------------------------------- provisioning

var (
	baseCtxOnce sync.Once
	baseCtx     caddy.Context
	baseCtxErr  error
)

// configContext returns a fresh config context, as Caddy makes one per
// config load: modules loaded in it are cleaned up when cancel is called.
func configContext(tb testing.TB) (caddy.Context, context.CancelFunc) {
	tb.Helper()
	baseCtxOnce.Do(func() {
		baseCtx, baseCtxErr = caddy.ProvisionContext(nil)
	})
	if baseCtxErr != nil {
		tb.Fatalf("caddy.ProvisionContext: %v", baseCtxErr)
	}
	return caddy.NewContext(baseCtx)
}

// loadHandler provisions a fair_queue handler from JSON in ctx, the way a
// config load does.
func loadHandler(ctx caddy.Context, cfg string) (*Handler, error) {
	mod, err := ctx.LoadModuleByID("http.handlers.fair_queue", json.RawMessage(cfg))
	if err != nil {
		return nil, err
	}
	return mod.(*Handler), nil
}

// mustLoad provisions a handler in its own config context; the context is
// cancelled (Cleanup runs) when the test ends unless cancelled before.
func mustLoad(tb testing.TB, cfg string) (*Handler, context.CancelFunc) {
	tb.Helper()
	ctx, cancel := configContext(tb)
	h, err := loadHandler(ctx, cfg)
	if err != nil {
		cancel()
		tb.Fatalf("provisioning fair_queue: %v\nconfig: %s", err, cfg)
	}
	var once sync.Once
	stop := func() { once.Do(cancel) }
	tb.Cleanup(stop)
	started(h)
	return h, stop
}

// started tells h's config that it started, as Caddy's core does once
// every app of a config load has started: only then does a handler's
// config take over a queue that was already running.
func started(h *Handler) {
	if h.events != nil {
		h.events.Emit(h.ctx, "started", nil)
	}
}

// proxyJSON is the inner reverse_proxy to u.
func proxyJSON(u *fakeUpstream) string {
	return fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, u.dial())
}

// fqConfig builds a fair_queue config: name, the proxy to u, and extra
// top-level fields (a JSON object body without braces, may be empty).
func fqConfig(name string, u *fakeUpstream, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"name":%q,"tokenizer":"approx","proxy":%s%s}`, name, proxyJSON(u), extra)
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// queueName gives every test its own queue.
func queueName(tb testing.TB) string { return "t_" + nonName.ReplaceAllString(tb.Name(), "_") }

// ------------------------------------------------------------ front server

// accessEntry is what an access log line would carry for one request: the
// {http.fair_queue.*} placeholders as the replacer holds them after the
// handler returned.
type accessEntry struct {
	id                            string // the request's X-Test-ID
	tenant, waitMs, cost, outcome string
	status                        int // first status written, 0 if none
	answers                       int // responses started (must be <= 1)
	nextCalled                    bool
	err                           error
}

// answerWriter counts the responses a handler starts on one request, and
// passes Flush through (Unwrap) so streaming works as in Caddy.
type answerWriter struct {
	http.ResponseWriter
	status  int
	answers int
}

func (w *answerWriter) WriteHeader(code int) {
	if code >= 200 {
		if w.answers == 0 {
			w.status = code
		}
		w.answers++
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(p []byte) (int, error) {
	if w.answers == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// gateway serves a fair_queue handler over real HTTP, as Caddy's server
// would: each request gets a replacer and the server's context values, the
// handler's error is turned into a status, and the placeholders are read
// afterwards as an access log does.
type gateway struct {
	tb     testing.TB
	h      atomic.Pointer[Handler]
	server *caddyhttp.Server
	front  *httptest.Server
	client *http.Client
	ids    atomic.Int64

	mu      sync.Mutex
	entries []accessEntry
	changed chan struct{} // closed and replaced on every new entry
}

func newGateway(tb testing.TB, h *Handler) *gateway {
	tb.Helper()
	g := &gateway{tb: tb, server: &caddyhttp.Server{}, changed: make(chan struct{})}
	g.h.Store(h)
	g.front = httptest.NewServer(g)
	g.client = g.front.Client()
	tb.Cleanup(func() {
		g.client.CloseIdleConnections()
		g.front.Close()
	})
	return g
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	aw := &answerWriter{ResponseWriter: w}
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, aw, g.server)
	e := accessEntry{id: r.Header.Get("X-Test-ID")}
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		e.nextCalled = true
		return nil
	})
	var err error
	defer func() {
		// A response aborted mid-body (reverse_proxy panics with
		// http.ErrAbortHandler) is logged too, as Caddy's access log does.
		v := recover()
		if v != nil && err == nil {
			err = fmt.Errorf("handler panicked: %v", v)
		}
		get := func(k string) string {
			v, ok := repl.Get("http.fair_queue." + k)
			if !ok {
				return "<unset>"
			}
			return fmt.Sprint(v)
		}
		e.tenant, e.waitMs, e.cost, e.outcome = get("tenant"), get("wait_ms"), get("cost"), get("outcome")
		e.status, e.answers, e.err = aw.status, aw.answers, err
		g.mu.Lock()
		g.entries = append(g.entries, e)
		close(g.changed)
		g.changed = make(chan struct{})
		g.mu.Unlock()
		if v != nil {
			panic(v)
		}
	}()
	err = g.h.Load().ServeHTTP(aw, r, next)
	if err != nil && aw.answers == 0 {
		// What Caddy's server does with a handler error.
		status := http.StatusInternalServerError
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			status = he.StatusCode
		}
		aw.WriteHeader(status)
	}
}

// log returns the access entries so far.
func (g *gateway) log() []accessEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]accessEntry(nil), g.entries...)
}

// waitEntries waits until n requests have been logged.
func (g *gateway) waitEntries(n int) []accessEntry {
	g.tb.Helper()
	deadline := time.After(waitLimit)
	for {
		g.mu.Lock()
		if len(g.entries) >= n {
			es := append([]accessEntry(nil), g.entries...)
			g.mu.Unlock()
			return es
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			if os.Getenv("FQ_DEBUG") != "" {
				_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			}
			g.tb.Fatalf("waited %s for %d access entries, have %d", waitLimit, n, len(g.log()))
		}
	}
}

// chatBody is a small chat completion request.
func chatBody(extra string) []byte {
	if extra != "" {
		extra = "," + extra
	}
	return []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"Say hello in five words."}],"max_tokens":32` + extra + `}`)
}

// newRequest makes a chat completion request to the gateway.
func (g *gateway) newRequest(ctx context.Context, tenant string, body []byte, hdr ...string) *http.Request {
	g.tb.Helper()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, g.front.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		g.tb.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Test-ID", strconv.FormatInt(g.ids.Add(1), 10))
	if tenant != "" {
		r.Header.Set("X-Tenant-ID", tenant)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return r
}

// result is a finished exchange.
type result struct {
	id     string // X-Test-ID
	status int
	header http.Header
	body   []byte
	err    error
}

func (g *gateway) do(r *http.Request) result {
	id := r.Header.Get("X-Test-ID")
	resp, err := g.client.Do(r)
	if err != nil {
		return result{id: id, err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{id: id, status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// entry waits for the access entry of the request that gave res: the
// handler has returned once it is there.
func (g *gateway) entry(res result) accessEntry {
	g.tb.Helper()
	deadline := time.After(waitLimit)
	for {
		g.mu.Lock()
		for _, e := range g.entries {
			if e.id == res.id {
				g.mu.Unlock()
				return e
			}
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			g.tb.Fatalf("no access entry for request %s after %s", res.id, waitLimit)
		}
	}
}

// post sends a chat completion and reads the whole answer.
func (g *gateway) post(tenant string, body []byte, hdr ...string) result {
	g.tb.Helper()
	return g.do(g.newRequest(context.Background(), tenant, body, hdr...))
}

// async sends a request in the background.
func (g *gateway) async(r *http.Request) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- g.do(r) }()
	return ch
}

// apiErrorBody is the OpenAI error shape.
type apiErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// wantError checks an answer of the HTTP contract: status, the OpenAI
// error shape with code and type, JSON content type, and Retry-After when
// the contract names it.
func wantError(tb testing.TB, res result, status int, code string) apiErrorBody {
	tb.Helper()
	if res.err != nil {
		tb.Fatalf("want %d %s, got transport error %v", status, code, res.err)
	}
	if res.status != status {
		tb.Fatalf("status = %d, want %d; body %s", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); ct != "application/json" {
		tb.Errorf("Content-Type = %q, want application/json", ct)
	}
	var body apiErrorBody
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		tb.Fatalf("error body %q is not the OpenAI error shape: %v", res.body, err)
	}
	if body.Error.Code != code {
		tb.Errorf("error.code = %q, want %q (message %q)", body.Error.Code, code, body.Error.Message)
	}
	if body.Error.Message == "" || body.Error.Type == "" {
		tb.Errorf("error message and type must be set: %s", res.body)
	}
	if want := errorType(status, shapeOpenAI); body.Error.Type != want {
		tb.Errorf("error.type = %q, want %q", body.Error.Type, want)
	}
	retry := res.header.Get("Retry-After")
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		if retry == "" || retry == "0" {
			tb.Errorf("%d %s without a Retry-After", status, code)
		}
	default:
		if retry != "" {
			tb.Errorf("%d %s with Retry-After %q", status, code, retry)
		}
	}
	return body
}

// ------------------------------------------------------------ queue state

func queueStats(h *Handler) (queued, inflight int) {
	st := h.shared.q.Stats(false)
	return st.Queued, st.Inflight
}

// eventually polls cond for up to waitLimit.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("waited %s for %s: not reached", waitLimit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitQueued waits until n requests wait in h's queue.
func waitQueued(tb testing.TB, h *Handler, n int) {
	tb.Helper()
	eventually(tb, fmt.Sprintf("%d queued", n), func() bool { q, _ := queueStats(h); return q == n })
}

// counterValue reads one series of a counter vector.
func counterValue(c *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// outcomesOf sums requests_total of a queue over tenants and outcomes.
func outcomesOf(queue string) map[string]float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { requestsTotal.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		var q, o string
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "queue":
				q = l.GetValue()
			case "outcome":
				o = l.GetValue()
			}
		}
		if q == queue {
			out[o] += d.GetCounter().GetValue()
		}
	}
	return out
}

// seriesLabels lists the label sets of a collector's series of one queue.
func seriesLabels(c prometheus.Collector, queue string) []map[string]string {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var out []map[string]string
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		l := map[string]string{}
		for _, p := range d.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["queue"] == queue {
			out = append(out, l)
		}
	}
	return out
}
