package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// hostileCaddyfile is the gateway the hostile-input suite attacks: small
// limits, so each attack reaches them with few bytes, and a declared
// tenant, "good", whose requests must be served normally throughout.
const hostileCaddyfile = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_body 64KB
		body_timeout 1s
		max_request_tokens 8192
		max_inflight {{.Slots}}
		max_queue 500
		max_queue_bytes 220KB
		tenant good   weight 1 class interactive
		tenant bulky  weight 1 class batch
		tenant capped weight 1 class batch max_inflight 1
		default_tenant weight 1 class batch max_queue 20
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// TestHostileInput: each attack on the gateway's limits (huge max_tokens,
// oversized and slow bodies, a flood of queued bodies, rotating tenant IDs,
// a tenant past its in-flight cap) through the binary, with the
// exact answer of the HTTP contract, the gateway alive, and a well-behaved
// tenant served during it.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	const slots = 2
	fakes := startFakes(t, 2, "hi", harness.FakeOptions{Slots: slots, TTFT: 5 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, hostileCaddyfile, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
		"Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	addr := fmt.Sprintf("127.0.0.1:%d", p["Site"])
	// good is the well-behaved tenant's request during an attack: served,
	// and not kept waiting (nothing the attacks do may hold a slot or
	// queue ahead of it; the bound is far above noise, far below a
	// request stuck behind an attacker).
	good := func(id string) {
		t.Helper()
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "good", TestID: id, MaxTokens: 4})
		expectServed(t, r)
		if ms, err := strconv.Atoi(r.Header.Get("X-Fair-Queue-Wait-Ms")); err == nil && ms > 1000 {
			t.Errorf("%s: the well-behaved tenant waited %d ms in the queue during an attack", id, ms)
		}
	}

	t.Run("huge max_tokens", func(t *testing.T) {
		for i, mt := range []string{"1000000000000000", "2147483647", "8190"} {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":` + mt + `}`)
			r := send(context.Background(), defaultClient, base, chatReq{Tenant: "bulky", TestID: fmt.Sprintf("huge-%d", i), Body: body})
			e := expectError(t, r, 400, "context_length_exceeded", "invalid_request_error", false)
			if !strings.Contains(e.Message, "8192 tokens per request") {
				t.Errorf("max_tokens %s: message %q does not name the limit", mt, e.Message)
			}
		}
		good("huge-good")
		// Refused at once: nothing queued, the ladder's water untouched.
		s := scrape(t, c)
		if w := metric(s, "caddy_fair_queue_water_level"); w != 0 {
			t.Errorf("water level %v after refused oversized requests, want 0", w)
		}
		expectNotUpstream(t, fakes, "huge-0", "huge-1", "huge-2")
	})

	t.Run("Content-Length over max_body", func(t *testing.T) {
		// Headers only: the 413 must come before any body byte is sent.
		resp := rawRequest(t, addr, "bulky", 10<<20, "", nil)
		if resp.status != 413 || !strings.Contains(resp.body, `"request_too_large"`) {
			t.Errorf("announced 10 MB: %d %s, want 413 request_too_large", resp.status, resp.body)
		}
		// With Expect: 100-continue the client is refused before uploading.
		resp = rawRequest(t, addr, "bulky", 10<<20, "100-continue", nil)
		if resp.status != 413 || resp.continued {
			t.Errorf("Expect: 100-continue, 10 MB: status %d, got 100 Continue %v; want 413 without it", resp.status, resp.continued)
		}
		good("cl-good")
	})

	t.Run("too large body sent whole gets 413, not a reset", func(t *testing.T) {
		// Like Python's urllib: the whole body is written before the
		// answer is read. Without lingering, the server's close with
		// unread bytes resets the connection and the client sees no 413.
		body := bytes.Repeat([]byte("x"), 64<<20)
		resp := rawRequest(t, addr, "bulky", int64(len(body)), "", body)
		if resp.err != nil || resp.status != 413 {
			t.Errorf("64 MB body: status %d, err %v; want 413", resp.status, resp.err)
		}
		// Chunked, no Content-Length: the limit holds all the same.
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "bulky", TestID: "chunked-big",
			Body: bytes.Repeat([]byte("y"), 1<<20)})
		expectError(t, r, 413, "request_too_large", "", false)
		good("big-good")
	})

	t.Run("slow bodies get 408 or are refused, and hold nothing", func(t *testing.T) {
		// 30 clients announce 60 KB each and trickle one byte every 200ms.
		// The bodies being received may reserve max_queue_bytes (220 KB)
		// together: three are read until body_timeout (408), the others
		// are refused before a byte is read (503), and the memory pinned
		// stays bounded however many come.
		const n = 30
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			answers = map[int]int{}
		)
		for i := range n {
			wg.Go(func() {
				resp := rawTrickle(addr, "bulky", 60_000, 200*time.Millisecond)
				mu.Lock()
				answers[resp.status]++
				mu.Unlock()
				switch {
				case resp.status == 408 && strings.Contains(resp.body, `"request_timeout"`):
				case resp.status == 503 && strings.Contains(resp.body, `"server_busy"`):
				default:
					t.Errorf("slow client %d: %d %s %v, want 408 request_timeout or 503 server_busy", i, resp.status, resp.body, resp.err)
				}
			})
		}
		// Meanwhile the well-behaved tenant is served.
		for i := range 5 {
			good(fmt.Sprintf("slow-good-%d", i))
		}
		wg.Wait()
		t.Logf("observed: slow clients answered %v", answers)
		if answers[408] < 1 || answers[408] > 220_000/60_000 {
			t.Errorf("%d slow clients were read until body_timeout, want 1..%d (what 220 KB holds): %v", answers[408], 220_000/60_000, answers)
		}
	})

	t.Run("wait budget counts from the complete body", func(t *testing.T) {
		// A 300 ms budget, a body that takes about 600 ms to arrive (within
		// body_timeout): the upload is the client's time, not the queue's,
		// so the request is served, not refused as late.
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"slowly, please"}],"max_tokens":4}`)
		resp := rawSlowUpload(addr, "good", body, 6, 100*time.Millisecond, "X-Wait-Budget: 300ms")
		if resp.err != nil || resp.status != 200 {
			t.Errorf("slow upload with a 300ms budget: %d %s %v, want 200", resp.status, resp.body, resp.err)
		}
	})

	t.Run("queued bodies bounded by max_queue_bytes", func(t *testing.T) {
		for _, f := range fakes {
			f.Pause()
		}
		holders := fillSlots(t, base, "bulky", "qb-hold", 2*slots, fakes...)
		// 40 KB bodies: 220 KB hold five, not six.
		big := strings.Repeat("word ", 8000)
		var queued []<-chan result
		for i := range 5 {
			queued = append(queued, async(context.Background(), defaultClient, base,
				chatReq{Tenant: "bulky", TestID: fmt.Sprintf("qb-%d", i), Prompt: big, MaxTokens: 4}))
			waitMetricEq(t, c, float64(i+1), "caddy_fair_queue_queue_depth", "tenant", "bulky")
		}
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "bulky", TestID: "qb-over", Prompt: big, MaxTokens: 4})
		e := expectError(t, r, 503, "server_busy", "overloaded_error", true)
		if !strings.Contains(e.Message, "bytes") {
			t.Errorf("message %q does not say the byte cap was reached", e.Message)
		}
		// A small request of another tenant still fits.
		goodCh := async(context.Background(), defaultClient, base, chatReq{Tenant: "good", TestID: "qb-good", MaxTokens: 4})
		waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "good")
		for _, f := range fakes {
			f.Resume()
		}
		expectServed(t, await(t, goodCh, "qb-good"))
		for _, ch := range append(holders, queued...) {
			expectServed(t, await(t, ch, "queued bulky request"))
		}
	})

	t.Run("unknown tenants share one group and its queue cap", func(t *testing.T) {
		for _, f := range fakes {
			f.Pause()
		}
		holders := fillSlots(t, base, "bulky", "sy-hold", 2*slots, fakes...)
		// Rotating tenant IDs: 20 fill the group's queue (max_queue 20).
		var queued []<-chan result
		for i := range 20 {
			queued = append(queued, async(context.Background(), defaultClient, base,
				chatReq{Tenant: fmt.Sprintf("sybil-%d", i), TestID: fmt.Sprintf("sy-%d", i), MaxTokens: 4}))
		}
		waitMetricEq(t, c, 20, "caddy_fair_queue_queue_depth", "tenant", "_unknown")
		r := send(context.Background(), defaultClient, base, chatReq{Tenant: "sybil-new", TestID: "sy-over", MaxTokens: 4})
		expectError(t, r, 429, "tenant_queue_full", "rate_limit_error", true)
		// Refused before the body is uploaded when the client asks first.
		resp := rawRequest(t, addr, "sybil-expect", 1000, "100-continue", nil)
		if resp.status != 429 || resp.continued {
			t.Errorf("Expect: 100-continue into a full group: status %d, 100 Continue %v; want 429 without it", resp.status, resp.continued)
		}
		// Declared tenants keep their room.
		goodCh := async(context.Background(), defaultClient, base, chatReq{Tenant: "good", TestID: "sy-good", MaxTokens: 4})
		waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "good")
		for _, f := range fakes {
			f.Resume()
		}
		expectServed(t, await(t, goodCh, "sy-good"))
		for _, ch := range append(holders, queued...) {
			expectServed(t, await(t, ch, "queued request"))
		}
	})

	t.Run("per-tenant max_inflight", func(t *testing.T) {
		for _, f := range fakes {
			f.Reset()
		}
		var chs []<-chan result
		for i := range 6 {
			chs = append(chs, async(context.Background(), defaultClient, base,
				chatReq{Tenant: "capped", TestID: fmt.Sprintf("cap-%d", i), MaxTokens: 20, IgnoreEOS: true}))
		}
		for i := range 4 {
			chs = append(chs, async(context.Background(), defaultClient, base,
				chatReq{Tenant: "good", TestID: fmt.Sprintf("cap-good-%d", i), MaxTokens: 20, IgnoreEOS: true}))
		}
		for _, ch := range chs {
			expectServed(t, await(t, ch, "capped test request"))
		}
		// The capped tenant never had two requests running at once.
		var spans [][2]int64
		for _, rec := range records(t, fakes...) {
			if rec.Tenant == "capped" {
				spans = append(spans, [2]int64{rec.StartedUnixNano, rec.FinishedUnixNano})
			}
		}
		if len(spans) != 6 {
			t.Fatalf("fakes saw %d requests of tenant capped, want 6", len(spans))
		}
		for i := range spans {
			for j := range i {
				a, b := spans[i], spans[j]
				if a[0] < b[1] && b[0] < a[1] {
					t.Errorf("tenant capped ran two requests at once: %v and %v", a, b)
				}
			}
		}
	})

	// The gateway is alive and holds nothing after every attack.
	good("final-good")
	waitMetricEq(t, c, 0, "caddy_fair_queue_inflight")
	waitMetricEq(t, c, 0, "caddy_fair_queue_queue_depth")
}

// rawResponse is what a hand-written HTTP/1.1 exchange read back.
type rawResponse struct {
	status    int
	continued bool // a "100 Continue" came before the final status
	body      string
	err       error
}

// rawRequest sends a chat request by hand: the headers announcing
// contentLength (and Expect when given), then body (may be nil: headers
// only), all of it before reading the answer, as a client that sends its
// whole body before looking at the response does.
func rawRequest(t *testing.T, addr, tenant string, contentLength int64, expect string, body []byte) rawResponse {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(harness.Scale(30 * time.Second))) // a guard: the answer comes long before
	hdr := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Tenant-ID: %s\r\nContent-Length: %d\r\n", addr, tenant, contentLength)
	if expect != "" {
		hdr += "Expect: " + expect + "\r\n"
	}
	if _, err := io.WriteString(conn, hdr+"\r\n"); err != nil {
		return rawResponse{err: err}
	}
	if body != nil {
		// Write it all before reading, as Python's urllib does: a server
		// that closes with the body unread makes this write fail.
		if _, err := conn.Write(body); err != nil {
			return rawResponse{err: fmt.Errorf("writing the body: %w", err)}
		}
	}
	return readRaw(conn)
}

// rawTrickle announces contentLength bytes and sends one byte per every,
// until the gateway answers.
func rawTrickle(addr, tenant string, contentLength int64, every time.Duration) rawResponse {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return rawResponse{err: err}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(harness.Scale(30 * time.Second))) // a guard: the answer comes long before
	hdr := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Tenant-ID: %s\r\nContent-Length: %d\r\n\r\n", addr, tenant, contentLength)
	if _, err := io.WriteString(conn, hdr); err != nil {
		return rawResponse{err: err}
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(every):
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	return readRaw(conn)
}

// rawSlowUpload sends body in chunks, one every every, after headers that
// announce its length plus extra (a "Name: value" line, may be empty), and
// reads the answer.
func rawSlowUpload(addr, tenant string, body []byte, chunks int, every time.Duration, extra string) rawResponse {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return rawResponse{err: err}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(harness.Scale(30 * time.Second))) // a guard: the answer comes long before
	hdr := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Tenant-ID: %s\r\nContent-Length: %d\r\n", addr, tenant, len(body))
	if extra != "" {
		hdr += extra + "\r\n"
	}
	if _, err := io.WriteString(conn, hdr+"\r\n"); err != nil {
		return rawResponse{err: err}
	}
	size := (len(body) + chunks - 1) / chunks
	for off := 0; off < len(body); off += size {
		time.Sleep(every)
		if _, err := conn.Write(body[off:min(off+size, len(body))]); err != nil {
			return rawResponse{err: err}
		}
	}
	return readRaw(conn)
}

// readRaw reads one final response (skipping 1xx) and its body.
func readRaw(conn net.Conn) rawResponse {
	var out rawResponse
	br := bufio.NewReader(conn)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out.err = err
			return out
		}
		if resp.StatusCode == 100 {
			out.continued = true
			continue
		}
		out.status = resp.StatusCode
		b, err := io.ReadAll(resp.Body)
		out.body, out.err = string(b), err
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			if n, err := strconv.Atoi(ra); err != nil || n < 1 || n > 60 {
				out.err = fmt.Errorf("Retry-After %q, want 1..60 seconds", ra)
			}
		}
		return out
	}
}

// TestSybilTenantsShareOneWeight: a client rotating X-Tenant-ID on every
// request gets the unknown group's one share, not one share per ID: two
// declared tenants and the group, all weight 1 and all flooding, are
// served a third each.
func TestSybilTenantsShareOneWeight(t *testing.T) {
	t.Parallel()
	const slots = 2
	fakes := startFakes(t, 2, "sy", harness.FakeOptions{Slots: slots, TTFT: 2 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant d1 weight 1 class batch
		tenant d2 weight 1 class batch
		default_tenant weight 1 class batch
		reverse_proxy {{.Upstreams}}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	waitMetricEq(t, c, 2*slots, "caddy_fair_queue_capacity")
	cl := newClient(true)
	defer cl.CloseIdleConnections()

	var (
		stop   atomic.Bool
		mu     sync.Mutex
		served = map[string]int{}
		wg     sync.WaitGroup
		seq    atomic.Int64
	)
	worker := func(tenant func() string, group string) {
		defer wg.Done()
		for !stop.Load() {
			r := send(context.Background(), cl, base, chatReq{Tenant: tenant(), TestID: fmt.Sprintf("sy-%d", seq.Add(1)),
				MaxTokens: 10, IgnoreEOS: true})
			if r.Status == 200 && !stop.Load() {
				mu.Lock()
				served[group]++
				mu.Unlock()
			}
		}
	}
	// Every group keeps a backlog: 8 workers each for the declared
	// tenants, 8 for the rotating IDs (a new ID per request).
	for range 8 {
		wg.Add(3)
		go worker(func() string { return "d1" }, "d1")
		go worker(func() string { return "d2" }, "d2")
		go worker(func() string { return fmt.Sprintf("sybil-%d", seq.Add(1)) }, "sybil")
	}
	harness.WaitFor(t, "900 requests served", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := served["d1"] + served["d2"] + served["sybil"]
		return n >= 900, fmt.Sprint(served)
	})
	stop.Store(true)
	wg.Wait()
	total := float64(served["d1"] + served["d2"] + served["sybil"])
	t.Logf("observed: served %v", served)
	for _, g := range []string{"d1", "d2", "sybil"} {
		// Equal requests, so served counts are service shares; the
		// tolerance covers the requests in flight at the start and the
		// end of the window (4 slots of 900) and workers that were slow to start.
		if share := float64(served[g]) / total; share < 0.31 || share > 0.36 {
			t.Errorf("%s served %.3f of requests, want 1/3 (0.31..0.36): %v", g, share, served)
		}
	}
}
