package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/fakellm/fakeapi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config describes one fake model server. The zero value is not useful; start
// from DefaultConfig.
type Config struct {
	// Name is echoed in the X-Fake-Upstream response header so a test can tell
	// which upstream served a request behind a load-balancing gateway.
	Name string
	// Slots is the number of requests generated at once; the rest wait in a
	// FIFO queue, like a vLLM server at its max_num_seqs.
	Slots int
	// TTFT is the time to the first output token, PerToken the time for each
	// output token. Both are spent after the request got a slot.
	TTFT     time.Duration
	PerToken time.Duration
	// DefaultOutput is the number of output tokens a request generates when it
	// does not set ignore_eos: min(max_tokens, DefaultOutput).
	DefaultOutput int
	// Down starts the server with /health answering 503.
	Down bool
	// TPM and RPM, when set, are a provider account's limits: a request
	// beyond them gets 429 (see ratelimit.go). Window is how the provider
	// counts its minute: WindowBucket (the default), WindowRolling or
	// WindowFixed.
	TPM, RPM float64
	Window   string
	// Logger receives the few lines the server logs; nil discards them.
	Logger *log.Logger
}

// DefaultConfig matches the command-line defaults.
func DefaultConfig() Config {
	return Config{
		Name:          "fakellm",
		Slots:         4,
		TTFT:          20 * time.Millisecond,
		PerToken:      2 * time.Millisecond,
		DefaultOutput: 16,
	}
}

const (
	// maxRecords bounds /debug/requests so a long load test cannot grow the
	// fake without limit.
	maxRecords = 10000
	// maxRecordedBody is how much of each body /debug/requests keeps.
	maxRecordedBody = 64 << 10
	// maxBody protects the fake from a runaway client; far above any test.
	maxBody = 64 << 20

	// outputToken is the text of every generated token, so that a test (or the
	// gateway's fallback that counts streamed text) can count tokens exactly.
	outputToken = "tok "
)

type waiter struct {
	ready chan struct{} // closed when the slot is handed over
	rec   *fakeapi.Record
}

// Server is the fake model server, an http.Handler.
type Server struct {
	cfg Config
	log *log.Logger
	mux *http.ServeMux

	healthy atomic.Bool

	// base is cancelled by Close; every request watches it so that shutdown
	// never waits on a paused or long generation.
	base      context.Context
	closeBase context.CancelFunc

	mu      sync.Mutex
	running int
	held    int       // requests in waitResumed
	queue   []*waiter // FIFO of requests waiting for a slot
	// resumed is non-nil while paused; it is closed by resume.
	resumed  chan struct{}
	seq      uint64
	startSeq uint64
	// resetSeq is seq at the last Reset: requests in flight across it
	// (Seq <= resetSeq) no longer count.
	resetSeq uint64
	records  []*fakeapi.Record
	stats    fakeapi.Stats // only the counters are used; the gauges are live

	// rpm and tpm are the account's meters (ratelimit.go), under mu.
	rpm, tpm meter

	requests  *prometheus.CounterVec
	completed prometheus.Counter
}

// New returns a server for cfg. Slots below 1 are raised to 1.
func New(cfg Config) *Server {
	if cfg.Slots < 1 {
		cfg.Slots = 1
	}
	if cfg.DefaultOutput < 0 {
		cfg.DefaultOutput = 0
	}
	if cfg.Name == "" {
		cfg.Name = "fakellm"
	}
	if cfg.Window == "" {
		cfg.Window = WindowBucket
	}
	s := &Server{cfg: cfg, log: cfg.Logger, rpm: newMeter(cfg.Window, cfg.RPM), tpm: newMeter(cfg.Window, cfg.TPM)}
	s.base, s.closeBase = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = log.New(io.Discard, "", 0)
	}
	s.healthy.Store(!cfg.Down)

	// A registry per server keeps several fakes in one test process apart.
	reg := prometheus.NewRegistry()
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fake_llm_requests_total",
		Help: "Requests received, by path.",
	}, []string{"path"})
	s.completed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fake_llm_completed_total",
		Help: "Requests whose response was fully written.",
	})
	reg.MustRegister(s.requests, s.completed,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fake_llm_running",
			Help: "Requests holding a generation slot.",
		}, func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(s.running) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fake_llm_waiting",
			Help: "Requests waiting for a generation slot.",
		}, func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.queue)) }),
	)

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.generate(apiChat, parseCompletion))
	mux.HandleFunc("POST /v1/completions", s.generate(apiCompletions, parseCompletion))
	mux.HandleFunc("POST /v1/messages", s.generate(apiMessages, parseMessages))
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("POST /admin/health", s.handleSetHealth)
	// do answers by calling f and writing v.
	do := func(f func(), v any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { f(); writeJSON(w, http.StatusOK, v) }
	}
	mux.HandleFunc("POST /admin/pause", do(s.Pause, map[string]bool{"paused": true}))
	mux.HandleFunc("POST /admin/resume", do(s.Resume, map[string]bool{"paused": false}))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/requests", s.handleRequests)
	mux.HandleFunc("GET /debug/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Stats()) })
	mux.HandleFunc("POST /debug/reset", do(s.Reset, map[string]bool{"reset": true}))
	s.mux = mux
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close aborts every request in flight or waiting, and completions that
// arrive later are refused with 503. It is safe to call more than once.
func (s *Server) Close() { s.closeBase() }

// SetHealthy switches what /health answers.
func (s *Server) SetHealthy(up bool) { s.healthy.Store(up) }

// Pause makes requests that get a slot hold it, before their first token,
// until Resume. Tests use it to fill the slots and build a queue behind them
// without depending on timing.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resumed == nil {
		s.resumed = make(chan struct{})
	}
}

// Resume lets paused requests generate.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resumed != nil {
		close(s.resumed)
		s.resumed = nil
	}
}

// Stats returns the counters since the last reset and the live gauges.
func (s *Server) Stats() fakeapi.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Running = s.running
	st.Waiting = len(s.queue)
	st.Held = s.held
	st.Paused = s.resumed != nil
	st.Healthy = s.healthy.Load()
	return st
}

// Records returns copies of the recorded requests, oldest first.
func (s *Server) Records() []fakeapi.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]fakeapi.Record, len(s.records))
	for i, r := range s.records {
		out[i] = *r
	}
	return out
}

// Reset forgets the recorded requests and zeroes the counters. Requests in
// flight keep their slots but no longer count. Sequence numbers keep growing
// so that X-Fake-Seq stays unique over the life of the process.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetSeq = s.seq
	s.records = nil
	s.stats = fakeapi.Stats{}
}

// --- slots ---

// acquire waits, in FIFO order, for a generation slot.
func (s *Server) acquire(ctx context.Context, rec *fakeapi.Record) error {
	s.mu.Lock()
	if s.running < s.cfg.Slots && len(s.queue) == 0 {
		s.running++
		s.markStartedLocked(rec)
		s.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{}), rec: rec}
	s.queue = append(s.queue, w)
	s.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.queue {
		if q == w {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return ctx.Err()
		}
	}
	// The slot was handed over just as the client left: pass it on at once.
	s.releaseLocked()
	return ctx.Err()
}

func (s *Server) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
}

// releaseLocked hands the slot straight to the first waiter, so a newcomer
// can never overtake the queue between a release and a wake-up.
func (s *Server) releaseLocked() {
	if len(s.queue) > 0 {
		w := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.markStartedLocked(w.rec)
		close(w.ready)
		return
	}
	s.running--
}

func (s *Server) markStartedLocked(rec *fakeapi.Record) {
	s.startSeq++
	rec.StartSeq = s.startSeq
	rec.StartedUnixNano = time.Now().UnixNano()
}

// waitResumed blocks while the server is paused.
func (s *Server) waitResumed(ctx context.Context) error {
	s.mu.Lock()
	ch := s.resumed
	if ch != nil {
		s.held++
	}
	s.mu.Unlock()
	if ch == nil {
		return nil
	}
	defer func() {
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
	}()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// --- completions ---

type completionRequest struct {
	Model               string            `json:"model"`
	Messages            []json.RawMessage `json:"messages"`
	Prompt              json.RawMessage   `json:"prompt"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	Stream              bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (s *Server) newRecord(r *http.Request, body []byte) *fakeapi.Record {
	h := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		if len(v) > 0 {
			h[k] = v[0]
		}
	}
	rb := body
	if len(rb) > maxRecordedBody {
		rb = rb[:maxRecordedBody]
	}
	rec := &fakeapi.Record{
		Path:             r.URL.Path,
		Tenant:           r.Header.Get("X-Tenant-ID"),
		TestID:           r.Header.Get("X-Test-Id"),
		Headers:          h,
		Body:             string(rb),
		BodyBytes:        len(body),
		ReceivedUnixNano: time.Now().UnixNano(),
		Outcome:          fakeapi.OutcomeInFlight,
	}
	s.mu.Lock()
	s.seq++
	rec.Seq = s.seq
	s.records = append(s.records, rec)
	if len(s.records) > maxRecords {
		n := copy(s.records, s.records[len(s.records)-maxRecords:])
		clear(s.records[n:])
		s.records = s.records[:n]
	}
	s.stats.Received++
	s.mu.Unlock()
	s.requests.WithLabelValues(r.URL.Path).Inc()
	return rec
}

func (s *Server) finish(rec *fakeapi.Record, status int, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.Status = status
	rec.Outcome = outcome
	rec.FinishedUnixNano = time.Now().UnixNano()
	if outcome == fakeapi.OutcomeOK {
		s.completed.Inc()
	}
	if rec.Seq <= s.resetSeq {
		return
	}
	switch outcome {
	case fakeapi.OutcomeOK:
		s.stats.Completed++
	case fakeapi.OutcomeClientGone:
		s.stats.ClientGone++
	case fakeapi.OutcomeBadRequest:
		s.stats.BadRequest++
	}
}

// parseCompletion reads a request of OpenAI's /v1/chat/completions or
// /v1/completions.
func parseCompletion(wire api, body []byte) (spec, error) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return spec{}, fmt.Errorf("invalid JSON body: %v", err)
	}
	prompt, err := countPrompt(wire == apiChat, &req)
	if err != nil {
		return spec{}, err
	}
	limit := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		limit = req.MaxCompletionTokens
	}
	return spec{model: req.Model, prompt: prompt, limit: limit, ignoreEOS: req.IgnoreEOS,
		stream: req.Stream, includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}, nil
}

// api is the wire format of a request and of its answer.
type api int

const (
	apiChat        api = iota // OpenAI /v1/chat/completions
	apiCompletions            // OpenAI /v1/completions
	apiMessages               // Anthropic /v1/messages (anthropic.go)
)

// spec is what a request asks the fake to generate, whatever its API.
type spec struct {
	api       api
	model     string
	prompt    int
	limit     *int // the output cap asked for; nil: none
	ignoreEOS bool
	stream    bool
	// includeUsage: OpenAI's stream_options.include_usage.
	includeUsage bool
	// tool names the tool an Anthropic answer calls ("": none).
	tool string
}

// generate serves the generation requests of an API: parse reads a body
// into a spec, or says why it is invalid (400).
func (s *Server) generate(wire api, parse func(api, []byte) (spec, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The request ends when the client leaves or the server shuts down.
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		stop := context.AfterFunc(s.base, cancel)
		defer stop()

		g, rec, ok := s.accept(w, r, wire, parse)
		if !ok {
			return // answered already
		}
		if err := s.acquire(ctx, rec); err != nil {
			s.finish(rec, 0, s.gone())
			return
		}
		defer s.release()
		err := s.waitResumed(ctx)
		if err == nil {
			err = sleep(ctx, s.cfg.TTFT)
		}
		if err != nil {
			s.finish(rec, 0, s.gone())
			return
		}
		if err := s.answer(ctx, w, g); err != nil {
			s.finish(rec, http.StatusOK, s.gone())
			return
		}
		s.finish(rec, http.StatusOK, fakeapi.OutcomeOK)
	}
}

// accept reads and records a request and says what to generate for it;
// or it answers at once (ok false) when the server is shutting down
// (503), the request is invalid (400) or beyond the account's limits
// (429).
func (s *Server) accept(w http.ResponseWriter, r *http.Request, wire api, parse func(api, []byte) (spec, error)) (g generation, rec *fakeapi.Record, ok bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	rec = s.newRecord(r, body)
	w.Header().Set("X-Fake-Upstream", s.cfg.Name)
	w.Header().Set("X-Fake-Seq", strconv.FormatUint(rec.Seq, 10))
	if s.base.Err() != nil {
		writeError(w, wire, http.StatusServiceUnavailable, "fakellm is shutting down", "")
		s.finish(rec, http.StatusServiceUnavailable, fakeapi.OutcomeAborted)
		return generation{}, nil, false
	}
	var sp spec
	if err != nil {
		err = errors.New("reading body: " + err.Error())
	} else if sp, err = parse(wire, body); err == nil && sp.limit != nil && *sp.limit < 0 {
		err = errors.New("max_tokens must not be negative")
	}
	if err != nil {
		writeError(w, wire, http.StatusBadRequest, err.Error(), "")
		s.finish(rec, http.StatusBadRequest, fakeapi.OutcomeBadRequest)
		return generation{}, nil, false
	}
	sp.api = wire
	out, finishReason := outputTokens(sp.limit, sp.ignoreEOS, s.cfg.DefaultOutput)
	if s.rateLimited(w, wire, rec, sp, out) {
		return generation{}, nil, false
	}
	return s.newGeneration(r, rec, sp, out, finishReason), rec, true
}

// rateLimited records the request's sizes and charges it to the account;
// beyond the account's limits it answers 429 with the time to retry.
func (s *Server) rateLimited(w http.ResponseWriter, wire api, rec *fakeapi.Record, sp spec, out int) bool {
	// A provider counts the output cap asked for, not what is generated.
	asked := sp.prompt + out
	if sp.limit != nil {
		asked = sp.prompt + *sp.limit
	}
	s.mu.Lock()
	rec.Stream = sp.stream
	rec.PromptTokens = sp.prompt
	rec.OutputTokens = out
	retry := s.admitLocked(w.Header(), asked)
	if retry > 0 {
		s.stats.RateLimited++
	}
	s.mu.Unlock()
	if retry <= 0 {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	w.Header().Set("Retry-After-Ms", strconv.FormatInt(retry.Milliseconds()+1, 10))
	writeError(w, wire, http.StatusTooManyRequests, "Rate limit reached for requests or tokens per minute", "rate_limit_exceeded")
	s.finish(rec, http.StatusTooManyRequests, fakeapi.OutcomeLimited)
	return true
}

// newGeneration is the answer to request r: out tokens of sp's model (the
// server's name when it names none), with the faults r's headers ask for.
func (s *Server) newGeneration(r *http.Request, rec *fakeapi.Record, sp spec, out int, finishReason string) generation {
	g := generation{
		spec: sp,
		generated: func() {
			s.mu.Lock()
			rec.GeneratedUnixNano = time.Now().UnixNano()
			s.mu.Unlock()
		},
		id:           fmt.Sprintf("fake-%d", rec.Seq),
		created:      time.Now().Unix(),
		usage:        usage{PromptTokens: sp.prompt, CompletionTokens: out, TotalTokens: sp.prompt + out},
		finishReason: finishReason,
	}
	if g.model == "" {
		g.model = s.cfg.Name
	}
	// Faults a test can ask for, per request: a usage object no parser
	// should trust, and a stream that stops sending after N tokens
	// without ending (a hung model server).
	g.garbageUsage = r.Header.Get("X-Fake-Usage") == "garbage"
	g.stallAfter = -1
	if n, err := strconv.Atoi(r.Header.Get("X-Fake-Stall-After")); err == nil && n >= 0 {
		g.stallAfter = n
	}
	return g
}

// answer spends the generation time and writes g in its API's shape, as
// one body or as a stream.
func (s *Server) answer(ctx context.Context, w http.ResponseWriter, g generation) error {
	switch {
	case g.api == apiMessages && g.stream:
		return s.streamMessage(ctx, w, g)
	case g.api == apiMessages:
		return s.respondMessage(ctx, w, g)
	case g.stream:
		return s.stream(ctx, w, g)
	default:
		return s.respond(ctx, w, g)
	}
}

// gone names why a request ended early: the server closing or the client.
func (s *Server) gone() string {
	if s.base.Err() != nil {
		return fakeapi.OutcomeAborted
	}
	return fakeapi.OutcomeClientGone
}

// writeError answers an error in the shape of the request's API: OpenAI's
// {"error":{message,type,code}} or Anthropic's
// {"type":"error","error":{type,message}}.
func writeError(w http.ResponseWriter, wire api, status int, msg, code string) {
	types := errorTypes[status]
	if wire == apiMessages {
		writeJSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": types[1], "message": msg}})
		return
	}
	var c any
	if code != "" {
		c = code
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": types[0], "code": c}})
}

// errorTypes is the error type of each status the fake answers: OpenAI's,
// Anthropic's.
var errorTypes = map[int][2]string{
	http.StatusBadRequest:         {"invalid_request_error", "invalid_request_error"},
	http.StatusTooManyRequests:    {"tokens", "rate_limit_error"},
	http.StatusServiceUnavailable: {"server_error", "overloaded_error"},
}

// outputTokens: with ignore_eos the model generates exactly the limit (or the
// default when there is none); otherwise it "stops" after DefaultOutput tokens
// unless the limit cuts it shorter.
func outputTokens(limit *int, ignoreEOS bool, def int) (int, string) {
	switch {
	case limit == nil:
		return def, "stop"
	case ignoreEOS || *limit <= def:
		return *limit, "length"
	default:
		return def, "stop"
	}
}

// countPrompt counts prompt tokens as whitespace-separated words: of every
// message's content for chat (a string, or the "text" of each content part),
// of the prompt for completions (a string or a list of strings; a list of
// token ids counts one per id, a list of such lists sums them). It is exact
// and predictable, not a real tokenizer.
func countPrompt(chat bool, req *completionRequest) (int, error) {
	if chat {
		n := 0
		for i, raw := range req.Messages {
			var m struct {
				Content json.RawMessage `json:"content"`
			}
			if err := json.Unmarshal(raw, &m); err != nil {
				return 0, fmt.Errorf("messages[%d]: %v", i, err)
			}
			c, err := countText(m.Content, false)
			if err != nil {
				return 0, fmt.Errorf("messages[%d].content: %v", i, err)
			}
			n += c
		}
		return n, nil
	}
	if len(req.Prompt) == 0 || string(req.Prompt) == "null" {
		return 0, nil
	}
	var str string
	if json.Unmarshal(req.Prompt, &str) == nil {
		return len(strings.Fields(str)), nil
	}
	var strs []string
	if json.Unmarshal(req.Prompt, &strs) == nil {
		n := 0
		for _, s := range strs {
			n += len(strings.Fields(s))
		}
		return n, nil
	}
	var ids []int
	if json.Unmarshal(req.Prompt, &ids) == nil {
		return len(ids), nil
	}
	var idLists [][]int
	if json.Unmarshal(req.Prompt, &idLists) == nil {
		n := 0
		for _, l := range idLists {
			n += len(l)
		}
		return n, nil
	}
	return 0, errors.New("prompt: want a string, a list of strings or token ids")
}

// countText counts the words of content: a string, or a list of parts
// whose text is counted and, in Anthropic's blocks (nested), whose content
// too (a tool_result's: a string or blocks again).
func countText(raw json.RawMessage, nested bool) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return len(strings.Fields(str)), nil
	}
	var parts []struct {
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		what := "parts"
		if nested {
			what = "blocks"
		}
		return 0, errors.New("want a string or a list of content " + what)
	}
	n := 0
	for _, p := range parts {
		n += len(strings.Fields(p.Text))
		if !nested {
			continue
		}
		c, err := countText(p.Content, true)
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}

// generation is the answer to one request.
type generation struct {
	spec
	generated    func() // stamps the record's GeneratedUnixNano
	id           string
	created      int64
	usage        usage
	finishReason string
	garbageUsage bool // report a usage object of the wrong types
	stallAfter   int  // >= 0: stop sending after this many tokens until the client leaves
}

// usageJSON is the usage object the fake reports.
func (g generation) usageJSON() any {
	if g.garbageUsage {
		return map[string]any{"prompt_tokens": "many", "completion_tokens": -7,
			"total_tokens": 1e300, "prompt_tokens_details": []int{1, 2}}
	}
	return g.usage
}

func (g generation) object(chunk bool) string {
	switch {
	case g.api == apiChat && chunk:
		return "chat.completion.chunk"
	case g.api == apiChat:
		return "chat.completion"
	default:
		return "text_completion"
	}
}

func (g generation) prefixedID() string {
	if g.api == apiChat {
		return "chatcmpl-" + g.id
	}
	return "cmpl-" + g.id
}

// generateAll spends the whole generation time and returns the text.
func (s *Server) generateAll(ctx context.Context, g generation) (string, error) {
	if err := sleep(ctx, time.Duration(g.usage.CompletionTokens)*s.cfg.PerToken); err != nil {
		return "", err
	}
	g.generated()
	return strings.Repeat(outputToken, g.usage.CompletionTokens), nil
}

// respond spends the whole generation time, then writes one JSON body.
func (s *Server) respond(ctx context.Context, w http.ResponseWriter, g generation) error {
	text, err := s.generateAll(ctx, g)
	if err != nil {
		return err
	}
	choice := map[string]any{"index": 0, "finish_reason": g.finishReason}
	if g.api == apiChat {
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"], choice["logprobs"] = text, nil
	}
	return writeJSON(w, http.StatusOK, map[string]any{
		"id": g.prefixedID(), "object": g.object(false), "created": g.created,
		"model": g.model, "choices": []any{choice}, "usage": g.usageJSON(),
	})
}

// stream writes one SSE event per token, flushing each, then a finish event,
// the usage event when asked for (OpenAI's stream_options.include_usage, in
// which case every other event carries "usage": null), and [DONE].
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, g generation) error {
	out := startEvents(ctx, w)
	send := func(choices []any, u any) error {
		ev := map[string]any{"id": g.prefixedID(), "object": g.object(true),
			"created": g.created, "model": g.model, "choices": choices}
		if g.includeUsage {
			ev["usage"] = u
		}
		return out.json("", ev)
	}
	err := s.eachToken(ctx, g, func(i int) error { return send([]any{g.chunkChoice(i, nil)}, nil) })
	if err != nil {
		return err
	}
	g.generated()
	if err := send([]any{g.chunkChoice(-1, g.finishReason)}, nil); err != nil {
		return err
	}
	if g.includeUsage {
		if err := send([]any{}, g.usageJSON()); err != nil {
			return err
		}
	}
	return out.event("", []byte("[DONE]"))
}

// chunkChoice is the choice of the chunk of token i (-1: the finishing
// chunk, which carries no text).
func (g generation) chunkChoice(i int, finish any) map[string]any {
	c := map[string]any{"index": 0, "finish_reason": finish}
	switch {
	case g.api == apiChat && i < 0:
		c["delta"] = map[string]any{}
	case g.api == apiChat && i == 0:
		c["delta"] = map[string]any{"role": "assistant", "content": outputToken}
	case g.api == apiChat:
		c["delta"] = map[string]any{"content": outputToken}
	case i < 0:
		c["text"], c["logprobs"] = "", nil
	default:
		c["text"], c["logprobs"] = outputToken, nil
	}
	return c
}

// eachToken calls send for each token of g, one every PerToken; at token
// g.stallAfter it stops sending and waits for the client to leave.
func (s *Server) eachToken(ctx context.Context, g generation, send func(i int) error) error {
	for i := range g.usage.CompletionTokens {
		if i == g.stallAfter {
			<-ctx.Done()
			return ctx.Err()
		}
		if err := send(i); err != nil {
			return err
		}
		if err := sleep(ctx, s.cfg.PerToken); err != nil {
			return err
		}
	}
	return nil
}

// events writes a server-sent event stream, flushing every event, until
// the request's context ends.
type events struct {
	ctx context.Context
	w   http.ResponseWriter
	rc  *http.ResponseController
}

// startEvents sends the stream's 200 and headers.
func startEvents(ctx context.Context, w http.ResponseWriter) *events {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &events{ctx: ctx, w: w, rc: http.NewResponseController(w)}
}

// event writes one event, with an "event:" line when name is set.
func (e *events) event(name string, data []byte) error {
	var err error
	if name != "" {
		_, err = fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", name, data)
	} else {
		_, err = fmt.Fprintf(e.w, "data: %s\n\n", data)
	}
	if err != nil {
		return err
	}
	if err := e.rc.Flush(); err != nil {
		return err
	}
	return e.ctx.Err()
}

// json writes v as the data of one event.
func (e *events) json(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return e.event(name, b)
}

// --- health, admin, debug ---

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Fake-Upstream", s.cfg.Name)
	if s.healthy.Load() {
		writeJSON(w, http.StatusOK, map[string]string{"status": "up"})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "down"})
}

func (s *Server) handleSetHealth(w http.ResponseWriter, r *http.Request) {
	switch st := r.URL.Query().Get("state"); st {
	case "up", "down":
		s.SetHealthy(st == "up")
		s.log.Printf("health set %s", st)
		writeJSON(w, http.StatusOK, map[string]string{"status": st})
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "state must be up or down"})
	}
}

// handleRequests serves the recorded requests, oldest first, optionally only
// those with a given test_id or tenant.
func (s *Server) handleRequests(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	recs := s.Records()
	out := recs[:0]
	for _, rec := range recs {
		if q.Has("test_id") && rec.TestID != q.Get("test_id") {
			continue
		}
		if q.Has("tenant") && rec.Tenant != q.Get("tenant") {
			continue
		}
		out = append(out, rec)
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// sleep waits d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
