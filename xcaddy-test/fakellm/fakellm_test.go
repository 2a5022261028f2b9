package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/fakellm/fakeapi"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// instant is a config whose generation takes no time, so tests control
// progress only through Pause/Resume and client cancellation.
func instant() Config {
	c := DefaultConfig()
	c.Name = "t"
	c.TTFT, c.PerToken = 0, 0
	return c
}

type fixture struct {
	t   *testing.T
	s   *Server
	ts  *httptest.Server
	cli *http.Client
}

func start(t *testing.T, cfg Config) *fixture {
	t.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	// Cleanups run last-in first-out: abort paused requests before
	// httptest.Server.Close waits for every handler to return.
	t.Cleanup(ts.Close)
	t.Cleanup(s.Close)
	return &fixture{t: t, s: s, ts: ts, cli: ts.Client()}
}

// post sends a JSON body; it may run on any goroutine, so it returns errors.
func (f *fixture) post(ctx context.Context, path, body string, hdr ...string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.ts.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return f.cli.Do(req)
}

// do sends a request on the test goroutine and returns status and body.
func (f *fixture) do(method, path, body string, hdr ...string) (int, string) {
	f.t.Helper()
	var resp *http.Response
	var err error
	if method == http.MethodPost {
		resp, err = f.post(context.Background(), path, body, hdr...)
	} else {
		resp, err = f.cli.Get(f.ts.URL + path)
	}
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// background sends a request on its own goroutine; the returned channel
// yields the status (or -1 when the request failed, e.g. was cancelled).
func (f *fixture) background(ctx context.Context, wg *sync.WaitGroup, body string, hdr ...string) <-chan int {
	ch := make(chan int, 1)
	wg.Go(func() {
		resp, err := f.post(ctx, "/v1/chat/completions", body, hdr...)
		if err != nil {
			ch <- -1
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			ch <- -1
			return
		}
		ch <- resp.StatusCode
	})
	return ch
}

// waitFor polls the server state until cond holds. It waits for progress
// that is bound to happen; it never asserts on how long that takes (the
// deadline only turns a hang into a readable failure).
func (f *fixture) waitFor(what string, cond func(fakeapi.Stats) bool) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := f.s.Stats()
		if cond(st) {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("gave up waiting for %s; stats %+v", what, st)
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fixture) record(testID string) fakeapi.Record {
	f.t.Helper()
	var found []fakeapi.Record
	for _, r := range f.s.Records() {
		if r.TestID == testID {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		f.t.Fatalf("want 1 record with test_id %q, have %d", testID, len(found))
	}
	return found[0]
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

func TestFIFOSlotOrder(t *testing.T) {
	cfg := instant()
	cfg.Slots = 1
	f := start(t, cfg)
	f.s.Pause()

	var wg sync.WaitGroup
	ctx := context.Background()
	const n = 6
	results := make([]<-chan int, n)
	// Each request is sent only once the previous one is in the fake, so the
	// arrival order is known; the first takes the slot, the others queue.
	for i := range n {
		results[i] = f.background(ctx, &wg, chatBody, "X-Test-Id", fmt.Sprint("r", i))
		f.waitFor(fmt.Sprintf("request %d to arrive", i), func(st fakeapi.Stats) bool {
			return st.Running == 1 && st.Waiting == i
		})
	}
	f.s.Resume()
	wg.Wait()
	for i, ch := range results {
		if got := <-ch; got != http.StatusOK {
			t.Errorf("request %d: status %d", i, got)
		}
	}
	for i := range n {
		r := f.record(fmt.Sprint("r", i))
		if r.StartSeq != uint64(i+1) {
			t.Errorf("request r%d started as #%d, want #%d (FIFO)", i, r.StartSeq, i+1)
		}
		if r.Outcome != fakeapi.OutcomeOK {
			t.Errorf("request r%d: outcome %q", i, r.Outcome)
		}
	}
}

func TestSlotLimit(t *testing.T) {
	cfg := instant()
	cfg.Slots = 3
	f := start(t, cfg)
	f.s.Pause()

	var wg sync.WaitGroup
	for range 7 {
		f.background(context.Background(), &wg, chatBody)
	}
	f.waitFor("7 requests to arrive", func(st fakeapi.Stats) bool { return st.Running+st.Waiting == 7 })
	f.waitFor("the 3 running held before their first token", func(st fakeapi.Stats) bool { return st.Held == 3 })
	st := f.s.Stats()
	if st.Running != 3 || st.Waiting != 4 || st.Held != 3 {
		t.Fatalf("with 3 slots and 7 requests: running %d waiting %d held %d, want 3, 4 and 3", st.Running, st.Waiting, st.Held)
	}
	m := scrape(t, f)
	if m["fake_llm_running"] != 3 || m["fake_llm_waiting"] != 4 {
		t.Errorf("gauges: running %v waiting %v, want 3 and 4", m["fake_llm_running"], m["fake_llm_waiting"])
	}
	f.s.Resume()
	wg.Wait()
	st = f.s.Stats()
	if st.Completed != 7 || st.Running != 0 || st.Waiting != 0 || st.Held != 0 {
		t.Errorf("after resume: %+v", st)
	}
	m = scrape(t, f)
	if m["fake_llm_completed_total"] != 7 || m[`fake_llm_requests_total{path="/v1/chat/completions"}`] != 7 {
		t.Errorf("counters after resume: %v", m)
	}
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func TestStreamFlushesFirstChunkBeforeTheRest(t *testing.T) {
	cfg := instant()
	// The second token would come after an hour: the first chunk can only
	// reach the client if the server flushed it on its own.
	cfg.PerToken = time.Hour
	f := start(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := f.post(ctx, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"a b c"}],"max_tokens":5,"ignore_eos":true,"stream":true}`,
		"X-Test-Id", "s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var c chunk
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c); err != nil {
		t.Fatalf("first line %q: %v", line, err)
	}
	if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 ||
		c.Choices[0].Delta.Role != "assistant" || c.Choices[0].Delta.Content != outputToken {
		t.Errorf("first chunk %q", line)
	}
	if st := f.s.Stats(); st.Completed != 0 || st.Running != 1 {
		t.Fatalf("the first chunk arrived, but the server is not still generating: %+v", st)
	}

	// Leaving mid-stream frees the slot at once.
	cancel()
	f.waitFor("the slot to be freed", func(st fakeapi.Stats) bool { return st.Running == 0 })
	f.waitFor("the outcome to be recorded", func(st fakeapi.Stats) bool { return st.ClientGone == 1 })
	if r := f.record("s"); r.Outcome != fakeapi.OutcomeClientGone || r.FinishedUnixNano == 0 {
		t.Errorf("record %+v", r)
	}
}

func TestStreamUsageSemantics(t *testing.T) {
	for _, tc := range []struct {
		name, path, opts string
		wantUsage        bool
	}{
		{"chat no options", "/v1/chat/completions", ``, false},
		{"chat include_usage false", "/v1/chat/completions", `,"stream_options":{"include_usage":false}`, false},
		{"chat include_usage true", "/v1/chat/completions", `,"stream_options":{"include_usage":true}`, true},
		{"completions include_usage true", "/v1/completions", `,"stream_options":{"include_usage":true}`, true},
		{"completions no options", "/v1/completions", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, instant())
			body := `{"prompt":"one two three","max_tokens":4,"ignore_eos":true,"stream":true` + tc.opts + `}`
			if tc.path == "/v1/chat/completions" {
				body = `{"messages":[{"role":"system","content":"one"},{"role":"user","content":"two three"}],"max_tokens":4,"ignore_eos":true,"stream":true` + tc.opts + `}`
			}
			resp, err := f.post(context.Background(), tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := sseEvents(t, resp.Body)
			if len(events) == 0 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", events)
			}
			events = events[:len(events)-1]

			var tokens, finishes int
			var final *usage
			for i, e := range events {
				var raw map[string]json.RawMessage
				if err := json.Unmarshal([]byte(e), &raw); err != nil {
					t.Fatalf("event %d %q: %v", i, e, err)
				}
				u, hasUsage := raw["usage"]
				if hasUsage != tc.wantUsage {
					t.Errorf("event %d has usage key: %t, want %t", i, hasUsage, tc.wantUsage)
				}
				var c chunk
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatal(err)
				}
				if c.Usage != nil {
					if i != len(events)-1 || len(c.Choices) != 0 {
						t.Errorf("usage must come alone in the last event, found in event %d: %s", i, e)
					}
					final = c.Usage
					continue
				}
				if hasUsage && string(u) != "null" {
					t.Errorf("event %d: usage %s, want null", i, u)
				}
				for _, ch := range c.Choices {
					tok := ch.Delta.Content
					if ch.Text != nil {
						tok = *ch.Text
					}
					if tok == outputToken {
						tokens++
					}
					if ch.FinishReason != nil {
						finishes++
						if *ch.FinishReason != "length" {
							t.Errorf("finish_reason %q, want length", *ch.FinishReason)
						}
					}
				}
			}
			if tokens != 4 || finishes != 1 {
				t.Errorf("%d token events and %d finish events, want 4 and 1", tokens, finishes)
			}
			want := usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}
			switch {
			case tc.wantUsage && (final == nil || *final != want):
				t.Errorf("usage %+v, want %+v", final, want)
			case !tc.wantUsage && final != nil:
				t.Errorf("usage %+v sent without include_usage", final)
			}
		})
	}
}

func TestOutputLengths(t *testing.T) {
	cfg := instant()
	cfg.DefaultOutput = 16
	f := start(t, cfg)
	for _, tc := range []struct {
		params     string
		want       int
		wantFinish string
	}{
		{`"max_tokens":100,"ignore_eos":true`, 100, "length"},
		{`"max_tokens":1,"ignore_eos":true`, 1, "length"},
		{`"max_tokens":0,"ignore_eos":true`, 0, "length"},
		{`"max_completion_tokens":7,"max_tokens":100,"ignore_eos":true`, 7, "length"},
		{`"max_tokens":100`, 16, "stop"},
		{`"max_tokens":5`, 5, "length"},
		{`"ignore_eos":true`, 16, "stop"},
		{``, 16, "stop"},
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			t.Run(path+" "+tc.params, func(t *testing.T) {
				sep := ""
				if tc.params != "" {
					sep = ","
				}
				body := `{"prompt":"a b  c","messages":[{"role":"user","content":"a b  c"}]` + sep + tc.params + `}`
				status, resp := f.do(http.MethodPost, path, body)
				if status != http.StatusOK {
					t.Fatalf("status %d: %s", status, resp)
				}
				var got struct {
					Choices []struct {
						Text    *string `json:"text"`
						Message *struct {
							Content string `json:"content"`
						} `json:"message"`
						FinishReason string `json:"finish_reason"`
					} `json:"choices"`
					Usage usage `json:"usage"`
				}
				if err := json.Unmarshal([]byte(resp), &got); err != nil || len(got.Choices) != 1 {
					t.Fatalf("response %s: %v", resp, err)
				}
				text := ""
				if got.Choices[0].Text != nil {
					text = *got.Choices[0].Text
				} else if got.Choices[0].Message != nil {
					text = got.Choices[0].Message.Content
				}
				if text != strings.Repeat(outputToken, tc.want) {
					t.Errorf("text %q, want %d tokens", text, tc.want)
				}
				if want := (usage{3, tc.want, 3 + tc.want}); got.Usage != want {
					t.Errorf("usage %+v, want %+v", got.Usage, want)
				}
				if got.Choices[0].FinishReason != tc.wantFinish {
					t.Errorf("finish_reason %q, want %q", got.Choices[0].FinishReason, tc.wantFinish)
				}
			})
		}
	}
}

func TestPromptCount(t *testing.T) {
	for _, tc := range []struct {
		chat bool
		body string
		want int
	}{
		{true, `{"messages":[{"role":"user","content":" one  two\nthree "}]}`, 3},
		{true, `{"messages":[{"role":"system","content":"a"},{"role":"user","content":[{"type":"text","text":"b c"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, 3},
		{true, `{"messages":[{"role":"assistant","content":null}]}`, 0},
		{false, `{"prompt":"a b c d"}`, 4},
		{false, `{"prompt":["a b","c"]}`, 3},
		{false, `{"prompt":[1,2,3,4,5]}`, 5},
		{false, `{"prompt":[[1,2],[3]]}`, 3},
		{false, `{}`, 0},
	} {
		var req completionRequest
		if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
			t.Fatal(err)
		}
		got, err := countPrompt(tc.chat, &req)
		if err != nil || got != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.body, got, err, tc.want)
		}
	}
	var req completionRequest
	if err := json.Unmarshal([]byte(`{"prompt":{"x":1}}`), &req); err != nil {
		t.Fatal(err)
	}
	if _, err := countPrompt(false, &req); err == nil {
		t.Error("an object prompt was accepted")
	}
}

func TestInvalidRequests(t *testing.T) {
	f := start(t, instant())
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages": [`},
		{"/v1/completions", `not json`},
		{"/v1/chat/completions", `[]`},
		{"/v1/chat/completions", `{"messages":"hello"}`},
		{"/v1/chat/completions", `{"messages":[{"content":5}]}`},
		{"/v1/completions", `{"prompt":"x","max_tokens":-1}`},
	} {
		status, body := f.do(http.MethodPost, tc.path, tc.body, "X-Test-Id", tc.body)
		if status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tc.body, status)
		}
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: error body %s", tc.body, body)
		}
		if r := f.record(tc.body); r.Outcome != fakeapi.OutcomeBadRequest || r.StartSeq != 0 || r.Status != 400 {
			t.Errorf("%s: record %+v", tc.body, r)
		}
	}
	if st := f.s.Stats(); st.BadRequest != 6 || st.Completed != 0 {
		t.Errorf("stats %+v", st)
	}
	if status, _ := f.do(http.MethodGet, "/v1/chat/completions", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("GET completions: %d", status)
	}
}

func TestDisconnectWhileWaitingFreesThePlace(t *testing.T) {
	cfg := instant()
	cfg.Slots = 1
	f := start(t, cfg)
	f.s.Pause()

	var wg sync.WaitGroup
	bg := context.Background()
	ctx1, cancel1 := context.WithCancel(bg)
	defer cancel1()
	ctx2, cancel2 := context.WithCancel(bg)
	defer cancel2()

	r1 := f.background(ctx1, &wg, chatBody, "X-Test-Id", "holder")
	f.waitFor("holder to take the slot", func(st fakeapi.Stats) bool { return st.Running == 1 })
	r2 := f.background(ctx2, &wg, chatBody, "X-Test-Id", "quitter")
	f.waitFor("quitter to queue", func(st fakeapi.Stats) bool { return st.Waiting == 1 })
	r3 := f.background(bg, &wg, chatBody, "X-Test-Id", "patient")
	f.waitFor("patient to queue", func(st fakeapi.Stats) bool { return st.Waiting == 2 })

	// A client that leaves the queue is gone from it at once...
	cancel2()
	f.waitFor("quitter to leave the queue", func(st fakeapi.Stats) bool { return st.Waiting == 1 && st.ClientGone == 1 })
	// ...and one that leaves while holding a slot (here: paused before its
	// first token) hands the slot to the next in line.
	cancel1()
	f.waitFor("patient to get the slot", func(st fakeapi.Stats) bool {
		return st.Waiting == 0 && st.Running == 1 && st.ClientGone == 2
	})
	f.s.Resume()
	wg.Wait()

	if got := <-r1; got != -1 {
		t.Errorf("holder: %d, want a cancelled request", got)
	}
	if got := <-r2; got != -1 {
		t.Errorf("quitter: %d, want a cancelled request", got)
	}
	if got := <-r3; got != http.StatusOK {
		t.Errorf("patient: %d", got)
	}
	holder, quitter, patient := f.record("holder"), f.record("quitter"), f.record("patient")
	if holder.Outcome != fakeapi.OutcomeClientGone || holder.StartSeq != 1 {
		t.Errorf("holder %+v", holder)
	}
	if quitter.Outcome != fakeapi.OutcomeClientGone || quitter.StartSeq != 0 || quitter.StartedUnixNano != 0 {
		t.Errorf("quitter %+v", quitter)
	}
	if patient.Outcome != fakeapi.OutcomeOK || patient.StartSeq != 2 {
		t.Errorf("patient %+v", patient)
	}
	if st := f.s.Stats(); st.Running != 0 || st.Completed != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestHealth(t *testing.T) {
	cfg := instant()
	cfg.Down = true
	f := start(t, cfg)
	expect := func(want int) {
		t.Helper()
		if got, body := f.do(http.MethodGet, "/health", ""); got != want {
			t.Errorf("/health: %d %s, want %d", got, body, want)
		}
	}
	expect(http.StatusServiceUnavailable)
	for _, tc := range []struct {
		state      string
		wantStatus int
		wantHealth int
	}{
		{"up", 200, 200},
		{"down", 200, 503},
		{"sideways", 400, 503},
		{"up", 200, 200},
	} {
		if got, _ := f.do(http.MethodPost, "/admin/health?state="+tc.state, ""); got != tc.wantStatus {
			t.Errorf("set %s: %d, want %d", tc.state, got, tc.wantStatus)
		}
		expect(tc.wantHealth)
	}
	if got, _ := f.do(http.MethodGet, "/admin/health?state=down", ""); got != http.StatusMethodNotAllowed {
		t.Errorf("GET /admin/health: %d, want 405", got)
	}
	expect(http.StatusOK)
}

func TestDebugEndpoints(t *testing.T) {
	f := start(t, instant())
	long := strings.Repeat("w ", 50<<10) // 100 KiB of content
	bodies := []string{
		`{"messages":[{"role":"user","content":"first"}],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1}`,
	}
	for i, b := range bodies {
		if st, resp := f.do(http.MethodPost, "/v1/chat/completions", b,
			"X-Tenant-ID", fmt.Sprint("tenant", i), "X-Test-Id", "dbg", "X-Extra", "e"); st != 200 {
			t.Fatalf("request %d: %d %s", i, st, resp)
		}
	}
	f.do(http.MethodPost, "/v1/completions", `{"prompt":"x"}`, "X-Test-Id", "other")

	var recs []fakeapi.Record
	_, body := f.do(http.MethodGet, "/debug/requests?test_id=dbg", "")
	if err := json.Unmarshal([]byte(body), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records for test_id dbg, want 2", len(recs))
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) || r.Path != "/v1/chat/completions" || r.Tenant != fmt.Sprint("tenant", i) ||
			r.TestID != "dbg" || r.Outcome != fakeapi.OutcomeOK || r.Status != 200 || r.Headers["X-Extra"] != "e" ||
			r.OutputTokens != 1 || r.BodyBytes != len(bodies[i]) {
			t.Errorf("record %d: %+v", i, r)
		}
		if !(r.ReceivedUnixNano > 0 && r.ReceivedUnixNano <= r.StartedUnixNano && r.StartedUnixNano <= r.FinishedUnixNano) {
			t.Errorf("record %d: times out of order: %d %d %d", i, r.ReceivedUnixNano, r.StartedUnixNano, r.FinishedUnixNano)
		}
	}
	if recs[0].Body != bodies[0] {
		t.Errorf("body %q", recs[0].Body)
	}
	if len(recs[1].Body) != maxRecordedBody || !strings.HasPrefix(bodies[1], recs[1].Body) {
		t.Errorf("long body recorded as %d bytes, want the first %d", len(recs[1].Body), maxRecordedBody)
	}
	_, body = f.do(http.MethodGet, "/debug/requests?tenant=tenant1", "")
	if err := json.Unmarshal([]byte(body), &recs); err != nil || len(recs) != 1 || recs[0].Seq != 2 {
		t.Errorf("tenant filter: %v %+v", err, recs)
	}

	var st fakeapi.Stats
	_, body = f.do(http.MethodGet, "/debug/stats", "")
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Received != 3 || st.Completed != 3 || st.Running != 0 || st.Waiting != 0 || !st.Healthy {
		t.Errorf("stats %+v", st)
	}

	// A request in flight across a reset counts in neither epoch.
	f.s.Pause()
	var wg sync.WaitGroup
	res := f.background(context.Background(), &wg, chatBody, "X-Test-Id", "straddler")
	f.waitFor("straddler to start", func(st fakeapi.Stats) bool { return st.Running == 1 })
	if got, _ := f.do(http.MethodPost, "/debug/reset", ""); got != 200 {
		t.Fatalf("reset: %d", got)
	}
	f.s.Resume()
	wg.Wait()
	if got := <-res; got != 200 {
		t.Errorf("straddler: %d", got)
	}
	_, body = f.do(http.MethodGet, "/debug/requests", "")
	if body != "[]\n" {
		t.Errorf("after reset: %s", body)
	}
	if st := f.s.Stats(); st.Received != 0 || st.Completed != 0 {
		t.Errorf("after reset: %+v", st)
	}
	// Sequence numbers go on, so X-Fake-Seq stays unique.
	resp, err := f.post(context.Background(), "/v1/completions", `{"prompt":"x"}`)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if seq, up := resp.Header.Get("X-Fake-Seq"), resp.Header.Get("X-Fake-Upstream"); seq != "5" || up != "t" {
		t.Errorf("X-Fake-Seq %q X-Fake-Upstream %q, want 5 and t", seq, up)
	}
}

func TestRecordsAreBounded(t *testing.T) {
	s := New(instant())
	defer s.Close()
	for range maxRecords + 5 {
		s.newRecord(httptest.NewRequest(http.MethodPost, "/v1/completions", nil), nil)
	}
	recs := s.Records()
	if len(recs) != maxRecords || recs[0].Seq != 6 || recs[len(recs)-1].Seq != maxRecords+5 {
		t.Errorf("%d records from seq %d to %d", len(recs), recs[0].Seq, recs[len(recs)-1].Seq)
	}
}

func TestCloseAbortsRequests(t *testing.T) {
	f := start(t, instant())
	f.s.Pause()
	var wg sync.WaitGroup
	res := f.background(context.Background(), &wg, chatBody, "X-Test-Id", "paused")
	f.waitFor("the request to start", func(st fakeapi.Stats) bool { return st.Running == 1 })
	f.s.Close()
	wg.Wait()
	<-res
	if r := f.record("paused"); r.Outcome != fakeapi.OutcomeAborted {
		t.Errorf("record %+v", r)
	}
	if st, _ := f.do(http.MethodPost, "/v1/chat/completions", chatBody); st != http.StatusServiceUnavailable {
		t.Errorf("after Close: %d, want 503", st)
	}
}

func scrape(t *testing.T, f *fixture) map[string]float64 {
	t.Helper()
	_, body := f.do(http.MethodGet, "/metrics", "")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			key := name
			if lp := m.GetLabel(); len(lp) > 0 {
				var parts []string
				for _, l := range lp {
					parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				key += "{" + strings.Join(parts, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestMeterWindows: the three ways a provider counts its minute, on
// explicit times: a bucket refills continuously; a rolling minute frees
// each request 60 s after it arrived; a fixed minute resets on the clock's
// minute.
func TestMeterWindows(t *testing.T) {
	t0 := time.Unix(6000, 0) // on a minute
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	checkD := func(what string, got, want time.Duration) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}

	b := newMeter(WindowBucket, 600)
	b.advance(at(0))
	b.take(at(0), 600)
	check("bucket after a minute's worth", b.left(), 0)
	checkD("bucket wait for 10", b.wait(at(0), 10), time.Second)
	b.advance(at(30 * time.Second))
	check("bucket 30 s later", b.left(), 300)
	checkD("bucket reset", b.reset(at(30*time.Second)), 30*time.Second)

	r := newMeter(WindowRolling, 600)
	r.advance(at(0))
	r.take(at(0), 300)
	r.advance(at(30 * time.Second))
	r.take(at(30*time.Second), 300)
	r.advance(at(59 * time.Second))
	check("rolling at 59 s", r.left(), 0)
	checkD("rolling wait for 100", r.wait(at(59*time.Second), 100), time.Second)
	checkD("rolling wait for 400", r.wait(at(59*time.Second), 400), 31*time.Second)
	checkD("rolling reset", r.reset(at(59*time.Second)), 31*time.Second)
	r.advance(at(60*time.Second + 1))
	check("rolling once the first left", r.left(), 300)
	r.advance(at(91 * time.Second))
	check("rolling once both left", r.left(), 600)

	f := newMeter(WindowFixed, 600)
	f.advance(at(10 * time.Second))
	f.take(at(10*time.Second), 600)
	f.advance(at(59 * time.Second))
	check("fixed at 59 s", f.left(), 0)
	checkD("fixed wait", f.wait(at(59*time.Second), 1), time.Second)
	checkD("fixed reset", f.reset(at(59*time.Second)), time.Second)
	f.advance(at(60 * time.Second))
	check("fixed on the next minute", f.left(), 600)
	checkD("fixed reset when unused", f.reset(at(60*time.Second)), 0)

	if err := validWindow("sliding"); err == nil {
		t.Error("validWindow accepted an unknown window")
	}
}
