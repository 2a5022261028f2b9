package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// The circuit breaker trips on real overload only: the model servers
// saturated, with requests waiting, and the demand, in busy time (slot
// seconds), above the trigger. A mix of requests whose tokens are cheap to
// serve (long prompts, short answers) is not overload, however many
// tokens it carries.

const circuitOneSlotTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		tenant a weight 1 class interactive tier low
		tenant b weight 1 class interactive tier high
		circuit_break {
			order low high
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// longPrompt is a prompt of about n characters: words the fake counts one
// token each.
func longPrompt(n int) string {
	return strings.Repeat("lorem ", n/6)
}

// TestCircuitLongPromptsShortAnswersIsNotOverload: one model server with
// one slot; eight small requests at once, then one 40,000-character
// prompt asking for 5 tokens every 0.5 s, one at a time. The server is
// idle most of the time: no request may be shed (the circuit used to
// shed 29 of 30, reading the long prompts' tokens as demand against a
// capacity measured on the small requests).
func TestCircuitLongPromptsShortAnswersIsNotOverload(t *testing.T) {
	t.Parallel()
	// 1 s a small request: the eight keep the slot busy for 8 s, long
	// enough for the queue to measure a rate; a long prompt's 5 tokens
	// take 45 ms.
	fakes := startFakes(t, 1, "cbl", harness.FakeOptions{Slots: 1, TTFT: 20 * time.Millisecond, PerToken: 5 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, circuitOneSlotTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": 1,
		"Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 1, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx := context.Background()

	small := make([]chatReq, 8)
	for i := range small {
		tenant := "a"
		if i%2 == 1 {
			tenant = "b"
		}
		small[i] = chatReq{Tenant: tenant, TestID: fmt.Sprintf("small-%d", i), MaxTokens: 200, IgnoreEOS: true}
	}
	for _, r := range sendAll(ctx, cl, base, small) {
		expectServed(t, r)
	}
	prompt := longPrompt(40000)
	shed := 0
	next := time.Now()
	for i := range 30 {
		time.Sleep(time.Until(next)) // pacing only
		next = next.Add(500 * time.Millisecond)
		r := send(ctx, cl, base, chatReq{Tenant: "a", TestID: fmt.Sprintf("long-%d", i), Prompt: prompt, MaxTokens: 5, IgnoreEOS: true})
		if isCode(timedResult{result: r}, http.StatusTooManyRequests, "circuit_open") {
			shed++
			continue
		}
		expectServed(t, r)
	}
	s := scrape(t, c)
	if shed != 0 || metric(s, "caddy_fair_queue_circuit_transitions_total") != 0 {
		t.Errorf("%d of 30 long-prompt requests answered circuit_open (%v transitions) while the one slot was mostly idle; want 0",
			shed, metric(s, "caddy_fair_queue_circuit_transitions_total"))
	}
	t.Logf("circuit_open %d of 30; saturation %.3f, signal low %.3f", shed,
		metric(s, "caddy_fair_queue_circuit_saturation"), metric(s, "caddy_fair_queue_circuit_signal", "tier", "low"))
}

// TestCircuitMixedLoadBelowSaturation: two servers of four slots carry a
// random mix of prompt and output sizes, from prompts of a few words with
// long answers to prompts of thousands of words with answers of a few
// tokens, at about 10% then 60% of their slots' time, for 20 s. Nothing is
// shed. It runs alone: its load is a rate against the slots' time.
func TestCircuitMixedLoadBelowSaturation(t *testing.T) {
	const slots = 4
	fakes := startFakes(t, 2, "cbm", harness.FakeOptions{Slots: slots, TTFT: 10 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, circuitOneSlotTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": slots,
		"Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 2*slots, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()

	// A request holds a slot 10 ms + output x 1 ms; outputs are 5..400
	// tokens (mean about 100, 110 ms a request with its first token).
	// 8 slots at 10% and 60% are 7 and 44 requests/s.
	rng := rand.New(rand.NewPCG(28, 1))
	var mu sync.Mutex
	var reqs []chatReq
	for i := range 2000 {
		var prompt string
		var out int
		switch rng.IntN(3) {
		case 0: // long prompt, short answer
			prompt, out = longPrompt(2000+rng.IntN(38000)), 1+rng.IntN(10)
		case 1: // short prompt, long answer
			prompt, out = "write a long story", 100+rng.IntN(300)
		default: // chat
			prompt, out = longPrompt(100+rng.IntN(2000)), 20+rng.IntN(100)
		}
		tenant := "a"
		if i%3 == 0 {
			tenant = "b"
		}
		reqs = append(reqs, chatReq{Tenant: tenant, TestID: fmt.Sprintf("mix-%d", i), Prompt: prompt, MaxTokens: out, IgnoreEOS: true})
	}
	var wg sync.WaitGroup
	var results []result
	k := 0
	for _, phase := range []struct {
		rate float64
		dur  time.Duration
	}{{7, 8 * time.Second}, {44, 12 * time.Second}} {
		tick := time.NewTicker(time.Duration(float64(time.Second) / phase.rate))
		end := time.Now().Add(phase.dur)
		for time.Now().Before(end) && k < len(reqs) {
			<-tick.C
			req := reqs[k]
			k++
			wg.Go(func() {
				r := send(context.Background(), cl, base, req)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			})
		}
		tick.Stop()
	}
	wg.Wait()
	shed := 0
	for _, r := range results {
		if isCode(timedResult{result: r}, http.StatusTooManyRequests, "circuit_open") {
			shed++
		}
	}
	// Utilisation from the fakes' own records: slot time used over slot
	// time available, for the log (the phases' rates set it).
	var busy time.Duration
	first, last := int64(0), int64(0)
	for _, r := range records(t, fakes...) {
		if r.StartedUnixNano > 0 && r.FinishedUnixNano > r.StartedUnixNano {
			busy += time.Duration(r.FinishedUnixNano - r.StartedUnixNano)
			if first == 0 || r.StartedUnixNano < first {
				first = r.StartedUnixNano
			}
			last = max(last, r.FinishedUnixNano)
		}
	}
	util := busy.Seconds() / (float64(2*slots) * time.Duration(last-first).Seconds())
	s := scrape(t, c)
	t.Logf("sent %d requests; slot utilisation %.2f overall (observed); circuit_open %d; transitions %v", len(results), util, shed,
		metric(s, "caddy_fair_queue_circuit_transitions_total"))
	if shed != 0 || metric(s, "caddy_fair_queue_circuit_transitions_total") != 0 {
		t.Errorf("%d requests answered circuit_open at %.0f%% utilisation; want 0", shed, 100*util)
	}
}
