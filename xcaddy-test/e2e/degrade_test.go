package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// The degrade ladder end to end (DESIGN.md section 5): queue water drives
// the ladder up and down on its own; L1 pauses batch without idling a slot,
// L2 trims interactive requests, L3 throttles realtime; every transition is
// logged, counted and emitted as a Caddy event.

const (
	degradeSlots    = 4  // per fake and max_inflight: 8 slots with two fakes
	degradeMaxQueue = 60 // water = queued / 60
	// degradeTokens with ignore_eos: 10 ms to first token + 20 x 10 ms.
	degradeTokens = 20
)

// Lines, in queued requests out of 60: L1 engages above 30 and releases
// below 18, L2 above 42 and below 30, L3 above 51 and below 45.
//
// Budgets are not what this test is about: anti_starvation off keeps the
// throughput estimator (which sees the fakes paused for a while) from
// refusing a request at admission. Deadlines still hold.
const degradeTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
	log {
		level DEBUG
	}
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight {{.Slots}}
		max_queue {{.MaxQueue}}
		tenant hold weight 1 class batch
		tenant bulk weight 1 class batch
		tenant chat weight 1 class interactive
		tenant live weight 1 class realtime
		anti_starvation off
		degrade {
			hold 1s
			L1 trigger 0.5 recover 0.3 pause batch
			L2 trigger 0.7 recover 0.5 light_mode interactive max_input_tokens 64 max_tokens 16
			L3 trigger 0.85 recover 0.75 throttle realtime 1/m
		}
		reverse_proxy {{.Upstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// longChatSystem and longChatLast are the system prompt and the newest
// message of longChat.
const (
	longChatSystem = "You are a concise assistant for the degrade ladder test. Keep this system prompt."
	longChatLast   = "Final question: what is the capital of France?"
)

// longChat is a conversation far over light mode's 64 input tokens, with
// an output cap over its 16 and fields light mode must keep.
func longChat() (body []byte, msgs []map[string]string) {
	msgs = append(msgs, map[string]string{"role": "system", "content": longChatSystem})
	for i := range 12 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role,
			"content": fmt.Sprintf("Turn %d: %s", i, strings.Repeat("lorem ipsum dolor sit amet ", 8))})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": longChatLast})
	body, _ = json.Marshal(map[string]any{
		"model":       "fake-model",
		"messages":    msgs,
		"max_tokens":  300,
		"temperature": 0.2,
		"metadata":    map[string]string{"trace": "degrade-e2e"},
	})
	return body, msgs
}

// expectLightBody checks what the upstream received for a light-mode
// request: the system prompt first and unchanged, fewer messages, the kept
// ones the newest of the original in their order, the output cap lowered
// to 16, every other field kept.
func expectLightBody(t *testing.T, id, got string, orig []map[string]string) {
	t.Helper()
	var b struct {
		Model       string              `json:"model"`
		Messages    []map[string]string `json:"messages"`
		MaxTokens   *float64            `json:"max_tokens"`
		Temperature *float64            `json:"temperature"`
		Metadata    map[string]string   `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(got), &b); err != nil {
		t.Errorf("%s: upstream body is not JSON: %v: %s", id, err, got)
		return
	}
	m := b.Messages
	switch {
	case len(m) < 2:
		t.Errorf("%s: upstream got %d messages, want the system prompt and at least the newest message: %s", id, len(m), got)
		return
	case len(m) >= len(orig):
		t.Errorf("%s: upstream got %d messages of %d: not trimmed: %s", id, len(m), len(orig), got)
	}
	if !reflect.DeepEqual(m[0], orig[0]) {
		t.Errorf("%s: first message upstream %v, want the system prompt %v", id, m[0], orig[0])
	}
	// The rest must be the newest messages of the original, in order.
	rest, tail := m[1:], orig[len(orig)-(len(m)-1):]
	if !reflect.DeepEqual(rest, tail) {
		t.Errorf("%s: messages after the system prompt %v, want the newest %d of the original in order %v", id, rest, len(rest), tail)
	}
	if b.MaxTokens == nil || *b.MaxTokens != 16 {
		t.Errorf("%s: upstream max_tokens %v, want 16: %s", id, b.MaxTokens, got)
	}
	if b.Model != "fake-model" || b.Temperature == nil || *b.Temperature != 0.2 || b.Metadata["trace"] != "degrade-e2e" {
		t.Errorf("%s: other fields not kept (model, temperature, metadata): %s", id, got)
	}
	t.Logf("%s: upstream got %d of %d messages (%d bytes): %s", id, len(m), len(orig), len(got), got)
}

// inFlightAtFakes lists the test ids the fakes hold, running or waiting
// for a slot.
func inFlightAtFakes(t *testing.T, fakes []*harness.Fake) []string {
	t.Helper()
	var ids []string
	for id, r := range records(t, fakes...) {
		if r.Outcome == "in_flight" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// heldReq is a request holding an upstream slot, which the test can end
// by cancelling it.
type heldReq struct {
	id     string
	cancel context.CancelFunc
	ch     <-chan result
}

// TestDegradeLadder drives the water level with the fakes paused, so each
// level is reached and left deterministically:
//
//	A: 34 batch requests queued (water 0.57): L1 pauses batch. Five
//	   interactive and realtime requests queue behind them; freeing one slot
//	   at a time shows the dispatch order exactly: all five go before any
//	   batch request, and then batch still takes the free slots.
//	B: with L1 held and only batch queued, batch fills every slot (at the
//	   fakes, and in the gateway whenever anything is queued) while the flood
//	   drains; the ladder returns to L0 on its own.
//	C: 44 batch queued (0.73): L2 trims interactive requests; 52 (0.87): L3
//	   throttles realtime to 1/min, the second gets 429 class_throttled.
//	D: everything drains and the ladder returns to L0 on its own.
//
// Transitions are checked in the metrics, the handler's log and the
// fair_queue_degrade events Caddy's events app logs.
func TestDegradeLadder(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 2, "dg", harness.FakeOptions{Slots: degradeSlots, TTFT: 10 * time.Millisecond, PerToken: 10 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, degradeTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Slots": degradeSlots,
		"MaxQueue": degradeMaxQueue, "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	const capacity = 2 * degradeSlots
	waitMetricEq(t, c, capacity, "caddy_fair_queue_capacity")
	waitMetricEq(t, c, 0, "caddy_fair_queue_degrade_level")
	ctx := context.Background()
	pause := func(on bool) {
		for _, f := range fakes {
			if on {
				f.Pause()
			} else {
				f.Resume()
			}
		}
	}
	t.Cleanup(func() { pause(false) }) // a failure must not leave requests held
	level := func(s harness.Series) float64 { return metric(s, "caddy_fair_queue_degrade_level") }
	depth := func(s harness.Series, tenant string) float64 {
		return metric(s, "caddy_fair_queue_queue_depth", "tenant", tenant)
	}
	longBody, longMsgs := longChat()
	bulk := func(id string) chatReq {
		return chatReq{Tenant: "bulk", TestID: id, MaxTokens: degradeTokens, IgnoreEOS: true}
	}

	// --- A: L1 pauses batch ---
	pause(true)
	var holds []heldReq
	for i := range capacity {
		hctx, cancel := context.WithCancel(ctx)
		id := fmt.Sprint("hold-", i)
		holds = append(holds, heldReq{id: id, cancel: cancel,
			ch: async(hctx, defaultClient, base, chatReq{Tenant: "hold", TestID: id, MaxTokens: 5, IgnoreEOS: true})})
		waitRunning(t, i+1, fakes...)
	}
	const bulkA = 34 // water 34/60 = 0.57
	var bulkACh []<-chan result
	for i := range bulkA {
		bulkACh = append(bulkACh, async(ctx, defaultClient, base, bulk(fmt.Sprint("bulk-a-", i))))
	}
	s := waitMetric(t, c, "34 batch requests queued and L1 engaged", func(s harness.Series) bool {
		return depth(s, "bulk") == bulkA && level(s) >= 1
	})
	if l := level(s); l != 1 {
		t.Fatalf("water %v: degrade level %v, want 1", metric(s, "caddy_fair_queue_water_level"), l)
	}
	// Five requests of other classes queue behind them (water 39/60 =
	// 0.65, still under L2). chat-a-0 has the long body: at L1 it must
	// reach the upstream unchanged.
	others := map[string]<-chan result{
		"chat-a-0": async(ctx, defaultClient, base, chatReq{Tenant: "chat", TestID: "chat-a-0", Body: longBody}),
		"chat-a-1": async(ctx, defaultClient, base, chatReq{Tenant: "chat", TestID: "chat-a-1", MaxTokens: degradeTokens, IgnoreEOS: true}),
		"chat-a-2": async(ctx, defaultClient, base, chatReq{Tenant: "chat", TestID: "chat-a-2", MaxTokens: degradeTokens, IgnoreEOS: true}),
		"live-a-0": async(ctx, defaultClient, base, chatReq{Tenant: "live", TestID: "live-a-0", MaxTokens: degradeTokens, IgnoreEOS: true}),
		"live-a-1": async(ctx, defaultClient, base, chatReq{Tenant: "live", TestID: "live-a-1", MaxTokens: degradeTokens, IgnoreEOS: true}),
	}
	s = waitMetric(t, c, "the five other requests queued", func(s harness.Series) bool {
		return depth(s, "chat") == 3 && depth(s, "live") == 2
	})
	if l := level(s); l != 1 {
		t.Fatalf("water %v: degrade level %v, want 1", metric(s, "caddy_fair_queue_water_level"), l)
	}
	// Free one slot at a time: each frees exactly one dispatch, which then
	// holds its slot at the paused fake, so the fakes' records give the
	// gateway's dispatch order exactly.
	seen := map[string]bool{}
	var order []string
	for i, h := range holds {
		h.cancel()
		if r := await(t, h.ch, h.id); !errors.Is(r.Err, context.Canceled) {
			t.Errorf("%s: cancelled, yet got an answer: %v", h.id, r)
		}
		var fresh []string
		harness.WaitFor(t, fmt.Sprintf("one dispatch after freeing slot %d", i+1), func() (bool, string) {
			fresh = fresh[:0]
			for id := range records(t, fakes...) {
				if !strings.HasPrefix(id, "hold-") && !seen[id] {
					fresh = append(fresh, id)
				}
			}
			if len(fresh) > 1 {
				t.Fatalf("freeing one slot dispatched %d requests: %v", len(fresh), fresh)
			}
			return len(fresh) == 1, fmt.Sprintf("new at the fakes: %v", fresh)
		})
		seen[fresh[0]] = true
		order = append(order, fresh[0])
	}
	t.Logf("dispatch order at L1, one slot at a time: %v", order)
	firstFive := map[string]bool{}
	for _, id := range order[:len(others)] {
		firstFive[id] = true
	}
	for id := range others {
		if !firstFive[id] {
			t.Errorf("L1 pauses batch: the first %d dispatches %v must be the waiting interactive and realtime requests; %s is missing", len(others), order[:len(others)], id)
		}
	}
	for _, id := range order[len(others):] {
		if !strings.HasPrefix(id, "bulk-a-") {
			t.Errorf("once no other class waits, batch must take the free slots; dispatch %s", id)
		}
	}
	harness.WaitFor(t, "the eight dispatched requests, and only they, in flight at the fakes", func() (bool, string) {
		ids := inFlightAtFakes(t, fakes)
		n := 0
		for _, id := range ids {
			if seen[id] {
				n++
			}
		}
		return n == capacity && len(ids) == capacity, fmt.Sprintf("in flight at the fakes: %v", ids)
	})

	// --- B: batch alone still drains at full capacity ---
	// Let the eight in flight finish and stop the next eight at the fakes.
	// (A request the gateway dispatched may wait in a fake's own queue
	// rather than run: Caddy's least_conn sees a burst of completions one
	// by one. The gateway's slots are what the pause must not idle.)
	pause(false)
	pause(true)
	harness.WaitFor(t, "the eight finished and eight batch requests in flight in their place", func() (bool, string) {
		ids := inFlightAtFakes(t, fakes)
		batch := 0
		for _, id := range ids {
			if strings.HasPrefix(id, "bulk-a-") && !seen[id] {
				batch++
			}
		}
		return batch == capacity && len(ids) == capacity, fmt.Sprintf("in flight at the fakes: %v", ids)
	})
	s = scrape(t, c)
	if level(s) < 1 || depth(s, "bulk") == 0 || metric(s, "caddy_fair_queue_inflight") != capacity {
		t.Fatalf("want L1 held, batch still queued and all %d slots in use; fair_queue series:\n%s", capacity, fairQueueSeries(s))
	}
	t.Logf("L1 held (water %v): all %d slots hold batch requests, %v more batch queued",
		metric(s, "caddy_fair_queue_water_level"), capacity, depth(s, "bulk"))
	pause(false)
	// Drain, sampling the gateway: in every scrape (one consistent snapshot
	// of the queue) where anything is queued, every slot is in use.
	samples, l1Samples := 0, 0
	waitMetric(t, c, "the batch flood drained", func(s harness.Series) bool {
		q, in := metric(s, "caddy_fair_queue_queue_depth"), metric(s, "caddy_fair_queue_inflight")
		samples++
		if q > 0 && in != capacity {
			t.Errorf("sample %d: %v queued (level %v) but only %v of %d slots in use", samples, q, level(s), in, capacity)
		}
		if q > 0 && level(s) >= 1 {
			l1Samples++
		}
		return q == 0 && in == 0
	})
	t.Logf("drain: %d samples, %d of them with L1 engaged and batch queued; all slots in use whenever anything was queued", samples, l1Samples)
	for i, ch := range bulkACh {
		expectServed(t, await(t, ch, fmt.Sprint("bulk-a-", i)))
	}
	answers := map[string]result{}
	for id, ch := range others {
		answers[id] = await(t, ch, id)
		expectServed(t, answers[id])
		if m := answers[id].Header.Get("X-Fair-Queue-Mode"); m != "" {
			t.Errorf("%s: X-Fair-Queue-Mode %q at L1 (light mode is L2)", id, m)
		}
	}
	waitMetric(t, c, "the ladder back at L0 on its own", func(s harness.Series) bool { return level(s) == 0 })
	if r, ok := records(t, fakes...)["chat-a-0"]; !ok || r.Body != string(longBody) {
		t.Errorf("chat-a-0 at L1: the upstream must receive the body unchanged; got %q", r.Body)
	}

	// --- C: L2 light mode, L3 throttle ---
	pause(true)
	const bulkC = capacity + 44 // 8 in flight, 44 queued: water 0.73
	var bulkCCh []<-chan result
	for i := range bulkC {
		bulkCCh = append(bulkCCh, async(ctx, defaultClient, base, bulk(fmt.Sprint("bulk-c-", i))))
	}
	s = waitMetric(t, c, "44 batch queued and L2 engaged", func(s harness.Series) bool {
		return depth(s, "bulk") == 44 && metric(s, "caddy_fair_queue_inflight") == capacity && level(s) >= 2
	})
	if l := level(s); l != 2 {
		t.Fatalf("water %v: degrade level %v, want 2", metric(s, "caddy_fair_queue_water_level"), l)
	}
	lightCh := map[string]<-chan result{}
	for i := range 2 {
		id := fmt.Sprint("chat-c-", i)
		lightCh[id] = async(ctx, defaultClient, base, chatReq{Tenant: "chat", TestID: id, Body: longBody})
	}
	waitMetricEq(t, c, 2, "caddy_fair_queue_queue_depth", "tenant", "chat")
	for i := bulkC; i < bulkC+6; i++ { // 52 queued: water 0.87
		bulkCCh = append(bulkCCh, async(ctx, defaultClient, base, bulk(fmt.Sprint("bulk-c-", i))))
	}
	waitMetric(t, c, "50 batch queued and L3 engaged", func(s harness.Series) bool {
		return depth(s, "bulk") == 50 && level(s) >= 3
	})
	liveC0 := async(ctx, defaultClient, base, chatReq{Tenant: "live", TestID: "live-c-0", MaxTokens: degradeTokens, IgnoreEOS: true})
	waitMetricEq(t, c, 1, "caddy_fair_queue_queue_depth", "tenant", "live")
	for i := 1; i <= 2; i++ {
		id := fmt.Sprint("live-c-", i)
		r := send(ctx, defaultClient, base, chatReq{Tenant: "live", TestID: id, MaxTokens: degradeTokens, IgnoreEOS: true})
		expectError(t, r, http.StatusTooManyRequests, "class_throttled", "rate_limit_error", true)
		t.Logf("%s at L3: %d, Retry-After %q", id, r.Status, r.Header.Get("Retry-After"))
	}
	pause(false)

	// --- D: drain and recover ---
	for i, ch := range bulkCCh {
		expectServed(t, await(t, ch, fmt.Sprint("bulk-c-", i)))
	}
	expectServed(t, await(t, liveC0, "live-c-0"))
	recs := records(t, fakes...)
	for id, ch := range lightCh {
		r := await(t, ch, id)
		expectServed(t, r)
		if m := r.Header.Get("X-Fair-Queue-Mode"); m != "light" {
			t.Errorf("%s at L2: X-Fair-Queue-Mode %q, want light", id, m)
		}
		full, _ := strconv.Atoi(answers["chat-a-0"].Header.Get("X-Fair-Queue-Cost"))
		light, _ := strconv.Atoi(r.Header.Get("X-Fair-Queue-Cost"))
		if light >= full {
			t.Errorf("%s: X-Fair-Queue-Cost %d in light mode, %d for the same body at L1: cost not re-estimated", id, light, full)
		}
		rec, ok := recs[id]
		if !ok {
			t.Errorf("%s: served, but no fake record", id)
			continue
		}
		expectLightBody(t, id, rec.Body, longMsgs)
	}
	expectNotUpstream(t, fakes, "live-c-1", "live-c-2")
	s = waitMetric(t, c, "the ladder back at L0 on its own after the flood", func(s harness.Series) bool {
		return level(s) == 0 && metric(s, "caddy_fair_queue_queue_depth") == 0 && metric(s, "caddy_fair_queue_inflight") == 0
	})

	// Transitions: counted, logged, emitted.
	want := []string{"L1 up", "L1 down", "L1 up", "L2 up", "L3 up", "L3 down", "L2 down", "L1 down"}
	wantCount := map[string]float64{}
	for _, w := range want {
		wantCount[w]++
	}
	for w, n := range wantCount {
		step, dir, _ := strings.Cut(w, " ")
		if got := metric(s, "caddy_fair_queue_degrade_transitions_total", "step", step, "direction", dir); got != n {
			t.Errorf("degrade_transitions_total{step=%q,direction=%q} = %v, want %v", step, dir, got, n)
		}
	}
	if n := metric(s, "caddy_fair_queue_requests_total", "tenant", "live", "outcome", "class_throttled"); n != 2 {
		t.Errorf("requests_total{tenant=\"live\",outcome=\"class_throttled\"} = %v, want 2", n)
	}
	var events, logged []string
	for _, e := range caddyLog(c) {
		switch {
		case e.str("logger") == "events" && e.str("msg") == "event" && e.str("name") == "fair_queue_degrade":
			d, _ := e["data"].(map[string]any)
			events = append(events, fmt.Sprintf("%v %v", d["step"], d["direction"]))
			if d["queue"] != "default" {
				t.Errorf("event %v: queue %v, want default", d, d["queue"])
			}
			t.Logf("event fair_queue_degrade: %v", d)
		case e.str("msg") == "degrade ladder transition":
			logged = append(logged, fmt.Sprintf("%v %v", e["step"], e["direction"]))
			if lvl, from := e["level"].(float64), e["from_level"].(float64); (e["direction"] == "up") != (lvl == from+1) {
				t.Errorf("log entry %v: level %v from %v does not match its direction", e, lvl, from)
			}
		}
	}
	t.Logf("\"degrade ladder transition\" log entries (INFO): %v", logged)
	if !reflect.DeepEqual(events, want) {
		t.Errorf("fair_queue_degrade events in Caddy's log: %v, want %v", events, want)
	}
	if !reflect.DeepEqual(logged, want) {
		t.Errorf("\"degrade ladder transition\" log entries: %v, want %v", logged, want)
	}
}
