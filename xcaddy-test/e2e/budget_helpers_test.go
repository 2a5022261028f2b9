package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// Helpers of the wait-budget and degrade-ladder tests (budget_test.go,
// degrade_test.go).

// timedResult is an answer with the moment the test's own clock saw its
// last byte: with result.Sent, a before/after fact about the answer, not a
// bound on how long it took.
type timedResult struct {
	result
	Recv time.Time
}

// Latency is the time from sending to the whole answer, for logs.
func (r timedResult) Latency() time.Duration { return r.Recv.Sub(r.Sent) }

// sendTimed sends one request and notes when its answer was complete.
func sendTimed(ctx context.Context, cl *http.Client, base string, c chatReq) timedResult {
	r := send(ctx, cl, base, c)
	return timedResult{result: r, Recv: time.Now()}
}

// asyncTimed is async for sendTimed.
func asyncTimed(ctx context.Context, cl *http.Client, base string, c chatReq) <-chan timedResult {
	ch := make(chan timedResult, 1)
	go func() { ch <- sendTimed(ctx, cl, base, c) }()
	return ch
}

// expectRefusedWithinBudget checks a gateway refusal (status, code,
// Retry-After) and that the gateway answered it before the request's
// budget ran out by its own clock: the wait from its arrival to its
// refusal, which the access log records (fq_wait_ms), is under the budget.
// How long the client took to see the answer is logged, as observed: on a
// loaded machine it adds the time to deliver the answer, which is not the
// gateway's to bound.
func expectRefusedWithinBudget(t *testing.T, log accessLog, r timedResult, code string, budget time.Duration) {
	t.Helper()
	expectError(t, r.result, http.StatusServiceUnavailable, code, "overloaded_error", true)
	if r.Err != nil {
		return
	}
	wait := log.waitOf(t, r.TestID)
	if wait >= budget {
		t.Errorf("%s: %s after the gateway waited %s (its access log): not before its wait budget of %s ran out",
			r.TestID, code, wait, budget)
	}
	t.Logf("%s: %d %s after %s in the gateway, %s at the client (budget %s, Retry-After %q)", r.TestID, r.Status, code,
		wait, r.Latency().Round(100*time.Microsecond), budget, r.Header.Get("Retry-After"))
}

// accessLog is the file of a site's access log whose entries carry
// fq_wait_ms (log_append fq_wait_ms {http.fair_queue.wait_ms}).
type accessLog string

// accessLogTmpl is the site block lines that make an accessLog.
const accessLogTmpl = `log {
		output file {{.AccessLog}}
	}
	log_append fq_wait_ms {http.fair_queue.wait_ms}`

// waitOf waits for the entry of the request with X-Test-Id id (Caddy logs
// it as the handler returns, about when the client has its answer) and
// returns its wait in the gateway, arrival to dispatch or refusal.
func (l accessLog) waitOf(t *testing.T, id string) time.Duration {
	t.Helper()
	var e map[string]any
	harness.WaitFor(t, id+"'s entry in the access log", func() (bool, string) {
		e = accessLogFields(t, string(l))[id]
		return e != nil, "not logged yet"
	})
	ms, ok := e["fq_wait_ms"].(float64)
	if !ok {
		t.Fatalf("%s: access log entry without a numeric fq_wait_ms: %v", id, e)
	}
	return time.Duration(ms) * time.Millisecond
}

// expectNotUpstream checks that none of the test ids reached a fake.
func expectNotUpstream(t *testing.T, fakes []*harness.Fake, ids ...string) {
	t.Helper()
	recs := records(t, fakes...)
	for _, id := range ids {
		if r, ok := recs[id]; ok {
			t.Errorf("%s was answered by the gateway, yet reached an upstream: seq %d, tenant %q, outcome %q",
				id, r.Seq, r.Tenant, r.Outcome)
		}
	}
}

// closedFlood keeps a tenant's backlog up: workers each send one request
// after another until stopped. Every answer is kept for checking.
type closedFlood struct {
	stop    atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []result
	done    atomic.Int64
}

// startClosedFlood starts workers senders of tenant's requests with
// maxTokens output tokens (ignore_eos), test ids prefix-<n>.
func startClosedFlood(cl *http.Client, base, tenant, prefix string, workers, maxTokens int) *closedFlood {
	f := &closedFlood{}
	var seq atomic.Int64
	for range workers {
		f.wg.Go(func() {
			for !f.stop.Load() {
				id := fmt.Sprintf("%s-%d", prefix, seq.Add(1))
				r := send(context.Background(), cl, base, chatReq{Tenant: tenant, TestID: id, MaxTokens: maxTokens, IgnoreEOS: true})
				f.mu.Lock()
				f.results = append(f.results, r)
				f.mu.Unlock()
				f.done.Add(1)
			}
		})
	}
	return f
}

// Stop ends the flood, waits for the requests under way, and returns every
// answer.
func (f *closedFlood) Stop() []result {
	f.stop.Store(true)
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.results
}

// expectAllServed checks that every answer is a 200 served by a fake.
func expectAllServed(t *testing.T, what string, rs []result) {
	t.Helper()
	bad := 0
	for _, r := range rs {
		if r.Err != nil || r.Status != 200 || r.Header.Get("X-Fake-Upstream") == "" {
			if bad < 5 {
				t.Errorf("%s: want every request served: %v", what, r)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d requests not served", what, bad, len(rs))
	}
}

// logEntry is one JSON line of Caddy's log.
type logEntry map[string]any

func (e logEntry) str(k string) string {
	s, _ := e[k].(string)
	return s
}

// caddyLog parses Caddy's JSON log lines (it logs JSON when its output is
// not a terminal); other lines are skipped.
func caddyLog(c *harness.Caddy) []logEntry {
	var out []logEntry
	sc := bufio.NewScanner(strings.NewReader(c.Logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e logEntry
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// histogramMean is sum/count of a histogram of the default queue for one
// tenant, and its count.
func histogramMean(s harness.Series, name, tenant string) (mean, count float64) {
	count = metric(s, name+"_count", "tenant", tenant)
	if count == 0 {
		return 0, 0
	}
	return metric(s, name+"_sum", "tenant", tenant) / count, count
}
