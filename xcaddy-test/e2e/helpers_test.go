// Package e2e tests the Caddy binary built by xcaddy with the fair_queue
// plugin, over real HTTP, in front of fakellm upstreams (see
// xcaddy-test/harness). Assertions are on order, counts and statuses, never
// on durations: the machines these run on are shared and noisy. Waiting for
// a state (a metric, a fake's counter, a log line) is a polling loop whose
// bound only turns a hang into a failure that names the state it waited
// for; the bound grows with FQ_TEST_SLOWDOWN (harness.Scale).
//
// Tests that share nothing with the others (their own fakes, gateways and
// ports, no machine-wide state) call t.Parallel; those that measure shares
// or waits against a wall-clock window, or restart a shared process, run
// alone.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	caddyfairqueue "github.com/caddy-fair-queue/caddy-fair-queue"
	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// requestTimeout bounds a single request, scaled (harness.Scale); the
// longest test request is a few seconds of generation, so hitting it means
// something hangs.
var requestTimeout = harness.Scale(90 * time.Second)

var (
	binOnce  sync.Once
	caddyBin string
	fakeBin  string
)

// bins builds (or finds in the harness's cache) the Caddy binary with the
// plugin and the fakellm binary.
func bins(t testing.TB) (caddy, fake string) {
	t.Helper()
	// BuildCaddy/BuildFake hash the sources on every call; once per process
	// is enough. A failure inside Once fails this test; later tests see the
	// empty path and fail too.
	binOnce.Do(func() {
		caddyBin = harness.BuildCaddy(t)
		fakeBin = harness.BuildFake(t)
	})
	if caddyBin == "" || fakeBin == "" {
		t.Fatal("building caddy or fakellm failed in an earlier test")
	}
	return caddyBin, fakeBin
}

// newClient returns an HTTP client for load: many connections per host,
// no proxy from the environment (loopback only).
func newClient(keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DisableKeepAlives:   !keepAlive,
		MaxIdleConns:        1000,
		MaxIdleConnsPerHost: 1000,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}}
}

var defaultClient = newClient(true)

// chatReq describes one request to the gateway.
type chatReq struct {
	Tenant       string // X-Tenant-ID; "" sends none
	TestID       string // X-Test-Id, recorded by the fake
	Prompt       string // user message; default "hello there"
	MaxTokens    int    // 0: not sent
	IgnoreEOS    bool
	Stream       bool
	IncludeUsage bool
	Body         []byte            // raw body; overrides everything above but the headers
	Header       map[string]string // extra headers
	Path         string            // default /v1/chat/completions
}

func (c chatReq) body() []byte {
	if c.Body != nil {
		return c.Body
	}
	prompt := c.Prompt
	if prompt == "" {
		prompt = "hello there"
	}
	m := map[string]any{
		"model":    "fake-model",
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	}
	if c.MaxTokens > 0 {
		m["max_tokens"] = c.MaxTokens
	}
	if c.IgnoreEOS {
		m["ignore_eos"] = true
	}
	if c.Stream {
		m["stream"] = true
		if c.IncludeUsage {
			m["stream_options"] = map[string]bool{"include_usage": true}
		}
	}
	b, _ := json.Marshal(m)
	return b
}

func (c chatReq) newRequest(ctx context.Context, base string) (*http.Request, error) {
	path := c.Path
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, "POST", base+path, bytes.NewReader(c.body()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Tenant != "" {
		req.Header.Set("X-Tenant-ID", c.Tenant)
	}
	if c.TestID != "" {
		req.Header.Set("X-Test-Id", c.TestID)
	}
	for k, v := range c.Header {
		req.Header.Set(k, v)
	}
	return req, nil
}

// result is the one answer a request got: a response read to its end, or
// a transport error.
type result struct {
	TestID string
	Tenant string
	Status int
	Header http.Header
	Body   []byte
	Err    error
	Sent   time.Time // just before the request left the client
}

func (r result) String() string {
	if r.Err != nil {
		return fmt.Sprintf("%s (%s): error %v", r.TestID, r.Tenant, r.Err)
	}
	b := r.Body
	if len(b) > 300 {
		b = append(b[:300:300], "..."...)
	}
	return fmt.Sprintf("%s (%s): %d %s", r.TestID, r.Tenant, r.Status, bytes.TrimSpace(b))
}

// send sends one request and reads the whole answer. It is safe to call
// from any goroutine; it never fails the test itself.
func send(ctx context.Context, cl *http.Client, base string, c chatReq) result {
	res := result{TestID: c.TestID, Tenant: c.Tenant}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := c.newRequest(ctx, base)
	if err != nil {
		res.Err = err
		return res
	}
	res.Sent = time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		res.Err = err
		return res
	}
	defer resp.Body.Close()
	res.Status, res.Header = resp.StatusCode, resp.Header
	res.Body, res.Err = io.ReadAll(resp.Body)
	return res
}

// sendAll sends the requests concurrently and returns their answers in the
// order given.
func sendAll(ctx context.Context, cl *http.Client, base string, reqs []chatReq) []result {
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, c := range reqs {
		wg.Go(func() { out[i] = send(ctx, cl, base, c) })
	}
	wg.Wait()
	return out
}

// async sends a request in the background; receive its answer from the
// channel (buffered, so an abandoned answer leaks nothing).
func async(ctx context.Context, cl *http.Client, base string, c chatReq) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- send(ctx, cl, base, c) }()
	return ch
}

// await receives an answer sent by async (or any other sender), failing if
// none comes in time.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(requestTimeout + 10*time.Second):
		t.Fatalf("waiting for %s's answer: none within %s", what, requestTimeout+10*time.Second)
		var zero T
		return zero
	}
}

// expectServed checks that a request was served by an upstream through the
// gateway: 200, the fair-queue headers, the fake's name.
func expectServed(t *testing.T, r result) {
	t.Helper()
	if r.Err != nil || r.Status != 200 {
		t.Errorf("want 200: %v", r)
		return
	}
	if r.Header.Get("X-Fake-Upstream") == "" {
		t.Errorf("%s: no X-Fake-Upstream: not served by a fake", r.TestID)
	}
	if _, err := strconv.Atoi(r.Header.Get("X-Fair-Queue-Wait-Ms")); err != nil {
		t.Errorf("%s: X-Fair-Queue-Wait-Ms %q: %v", r.TestID, r.Header.Get("X-Fair-Queue-Wait-Ms"), err)
	}
	if _, err := strconv.Atoi(r.Header.Get("X-Fair-Queue-Cost")); err != nil {
		t.Errorf("%s: X-Fair-Queue-Cost %q: %v", r.TestID, r.Header.Get("X-Fair-Queue-Cost"), err)
	}
}

// apiError is the OpenAI error shape of the HTTP contract.
type apiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// expectError checks status, the OpenAI error shape
// {"error":{"message","type","code"}} with the given code and type, and,
// when retryAfter, a Retry-After of whole seconds >= 1.
func expectError(t *testing.T, r result, status int, code, typ string, retryAfter bool) apiError {
	t.Helper()
	var e apiError
	if r.Err != nil || r.Status != status {
		t.Errorf("want %d %s: %v", status, code, r)
		return e
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q, want application/json", r.TestID, ct)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &top); err != nil {
		t.Errorf("%s: body is not a JSON object: %v: %s", r.TestID, err, r.Body)
		return e
	}
	if len(top) != 1 || top["error"] == nil {
		t.Errorf("%s: want exactly {\"error\":{...}}, got %s", r.TestID, r.Body)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(top["error"], &fields); err != nil {
		t.Errorf("%s: error is not an object: %s", r.TestID, r.Body)
		return e
	}
	for _, k := range []string{"message", "type", "code"} {
		var s string
		if err := json.Unmarshal(fields[k], &s); err != nil || s == "" {
			t.Errorf("%s: error.%s must be a non-empty string: %s", r.TestID, k, r.Body)
		}
	}
	_ = json.Unmarshal(top["error"], &e)
	if e.Code != code {
		t.Errorf("%s: error.code %q, want %q (%s)", r.TestID, e.Code, code, e.Message)
	}
	if typ != "" && e.Type != typ {
		t.Errorf("%s: error.type %q, want %q", r.TestID, e.Type, typ)
	}
	ra := r.Header.Get("Retry-After")
	if retryAfter {
		if n, err := strconv.Atoi(ra); err != nil || n < 1 || n > 60 {
			t.Errorf("%s: Retry-After %q, want whole seconds in 1..60", r.TestID, ra)
		}
	}
	if r.Header.Get("X-Fake-Upstream") != "" {
		t.Errorf("%s: a gateway error carries X-Fake-Upstream %q", r.TestID, r.Header.Get("X-Fake-Upstream"))
	}
	return e
}

// --- metrics ---

func scrape(t testing.TB, c *harness.Caddy) harness.Series {
	t.Helper()
	return harness.Metrics(t, c.AdminURL()+"/metrics")
}

// metric is one gauge or counter of the default queue. An absent series
// reads 0 (a counter never incremented), so the name is checked against the
// metrics the plugin really exports: a renamed metric fails the test
// instead of passing every "== 0" check.
func metric(s harness.Series, name string, labelPairs ...string) float64 {
	if !knownMetric(name) {
		panic(fmt.Sprintf("metric %q is not one the plugin exports (%v)", name, caddyfairqueue.MetricNames()))
	}
	return s.Sum(name, append([]string{"queue", "default"}, labelPairs...)...)
}

var (
	knownOnce    sync.Once
	knownMetrics map[string]bool
)

func knownMetric(name string) bool {
	knownOnce.Do(func() {
		knownMetrics = map[string]bool{}
		for _, n := range caddyfairqueue.MetricNames() {
			knownMetrics[n] = true
		}
	})
	for _, suffix := range []string{"", "_count", "_sum", "_bucket"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && knownMetrics[base] {
			return true
		}
	}
	return false
}

// waitMetric polls the gateway's metrics until cond holds.
func waitMetric(t *testing.T, c *harness.Caddy, what string, cond func(harness.Series) bool) harness.Series {
	t.Helper()
	deadline := time.Now().Add(harness.PollTimeout)
	for {
		s := scrape(t, c)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not reached within %s; fair_queue series now:\n%s", what, harness.PollTimeout, fairQueueSeries(s))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMetricEq waits for a series of the default queue to equal want.
func waitMetricEq(t *testing.T, c *harness.Caddy, want float64, name string, labelPairs ...string) {
	t.Helper()
	waitMetric(t, c, fmt.Sprintf("%s%v == %v", name, labelPairs, want), func(s harness.Series) bool {
		return metric(s, name, labelPairs...) == want
	})
}

// fairQueueSeries lists the plugin's series, for failure messages.
func fairQueueSeries(s harness.Series) string {
	var lines []string
	for k, v := range s {
		if strings.HasPrefix(k, "caddy_fair_queue_") && !strings.Contains(k, "_bucket") {
			lines = append(lines, fmt.Sprintf("  %s %v", k, v))
		}
	}
	sort.Strings(lines)
	if len(lines) == 0 {
		return fmt.Sprintf("  (none; metric names: %v)", s.Names())
	}
	return strings.Join(lines, "\n")
}

// --- fakes ---

// startFakes starts n fakes with the same options, named prefix1..n.
func startFakes(t testing.TB, n int, prefix string, opts harness.FakeOptions) []*harness.Fake {
	t.Helper()
	_, fbin := bins(t)
	fakes := make([]*harness.Fake, n)
	for i := range fakes {
		o := opts
		o.Bin = fbin
		o.Name = fmt.Sprintf("%s%d", prefix, i+1)
		fakes[i] = harness.StartFake(t, o)
	}
	return fakes
}

// records returns the requests every fake received, keyed by test id.
// A test id seen twice is an error: every request is sent once.
func records(t *testing.T, fakes ...*harness.Fake) map[string]harness.FakeRequest {
	t.Helper()
	out := map[string]harness.FakeRequest{}
	for _, f := range fakes {
		for _, r := range f.Requests() {
			if r.TestID == "" {
				continue
			}
			if prev, dup := out[r.TestID]; dup {
				t.Errorf("test id %q reached the upstreams twice (seq %d and %d)", r.TestID, prev.Seq, r.Seq)
			}
			out[r.TestID] = r
		}
	}
	return out
}

// running sums the fakes' requests holding a generation slot.
func running(t *testing.T, fakes ...*harness.Fake) int {
	t.Helper()
	n := 0
	for _, f := range fakes {
		n += f.Stats().Running
	}
	return n
}

// waitRunning waits until the fakes together run exactly n requests.
func waitRunning(t *testing.T, n int, fakes ...*harness.Fake) {
	t.Helper()
	harness.WaitFor(t, fmt.Sprintf("%d requests running at the fakes", n), func() (bool, string) {
		got := running(t, fakes...)
		return got == n, fmt.Sprintf("%d running", got)
	})
}

// addrs lists the fakes' host:port, space-separated, for reverse_proxy.
func addrs(fakes ...*harness.Fake) string {
	var s []string
	for _, f := range fakes {
		s = append(s, f.Addr())
	}
	return strings.Join(s, " ")
}

// startCaddy renders a Caddyfile template and starts Caddy with it.
func startCaddy(t testing.TB, tmpl string, data map[string]any) *harness.Caddy {
	t.Helper()
	cbin, _ := bins(t)
	return harness.StartCaddy(t, cbin, harness.Render(t, tmpl, data))
}

// --- SSE ---

// sseReader reads a server-sent-events response one event at a time.
type sseReader struct {
	br *bufio.Reader
}

// next returns the data of the next event ("[DONE]" included), or an error.
func (s *sseReader) next() (string, error) {
	var data []string
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if len(data) > 0 {
				return strings.Join(data, "\n"), nil
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
}

// openStream sends a streamed request and returns the open response; the
// caller reads it and closes it (or cancels ctx).
func openStream(t *testing.T, ctx context.Context, cl *http.Client, base string, c chatReq) (*http.Response, *sseReader, time.Time) {
	t.Helper()
	req, err := c.newRequest(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", c.TestID, err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s: status %d: %s", c.TestID, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("%s: Content-Type %q, want text/event-stream", c.TestID, ct)
	}
	return resp, &sseReader{br: bufio.NewReader(resp.Body)}, sent
}

// chunkUsage is the usage object of a streamed chunk or a JSON body.
type chunkUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// --- statistics for logs ---

func summarize(xs []int) string {
	if len(xs) == 0 {
		return "n=0"
	}
	s := append([]int(nil), xs...)
	sort.Ints(s)
	sum := 0
	for _, x := range s {
		sum += x
	}
	return fmt.Sprintf("n=%d min=%d median=%d max=%d mean=%.1f all=%v",
		len(s), s[0], median(s), s[len(s)-1], float64(sum)/float64(len(s)), xs)
}

func median(xs []int) int {
	s := append([]int(nil), xs...)
	sort.Ints(s)
	return s[len(s)/2]
}

// fillSlots occupies n upstream slots with requests of tenant (the fakes
// should be paused, so they hold them), one at a time: each is running at
// a fake before the next is sent, so least_conn balancing sees up-to-date
// counts and no request waits in a fake's own queue. It returns the
// channels their answers arrive on.
func fillSlots(t *testing.T, base, tenant, prefix string, n int, fakes ...*harness.Fake) []<-chan result {
	t.Helper()
	var chs []<-chan result
	for i := range n {
		chs = append(chs, async(context.Background(), defaultClient, base,
			chatReq{Tenant: tenant, TestID: fmt.Sprintf("%s-%d", prefix, i), MaxTokens: 5, IgnoreEOS: true}))
		waitRunning(t, i+1, fakes...)
	}
	return chs
}
