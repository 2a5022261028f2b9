package fairqueue

import (
	"math"
	"testing"
	"time"
)

// TestProviderLevelCapsSends: what the provider reports left is a level
// nothing is sent beyond (less what was sent since the reporting request
// went, plus the meters' refill), until a newer report or the reset; an
// older report is ignored.
func TestProviderLevelCapsSends(t *testing.T) {
	cfg := upstreamConfig(600000, time.Second, 0) // the meters do not bind here: 10k tokens/s
	h := newHarness(t, cfg, 1, 1)
	r := 600000.0 / 62 // the refill assumed: the account's drawn rate per second
	first := h.enqueue(Request{Tenant: "a", Cost: 1000})
	if first.Dispatched().IsZero() {
		t.Fatal("not dispatched")
	}
	h.clk.Set(t0.Add(10 * time.Millisecond))
	second := h.enqueue(Request{Tenant: "a", Cost: 1000})
	// first's answer: 1500 tokens were left when it arrived (before
	// second, which took 1000 of them), back in full in 30 s.
	first.ProviderLevel(ProviderReport{RemainingTokens: 1500, RemainingRequests: -1, ResetTokens: 30 * time.Second})
	st := h.q.Upstream()
	if want := 1500 - 1000 + r*0.010; math.Abs(st.ProviderTokens-want) > 1e-6 || !math.IsNaN(st.ProviderRequests) {
		t.Fatalf("level %v/%v, want %v tokens and no report of requests", st.ProviderTokens, st.ProviderRequests, want)
	}
	h.clk.Set(t0.Add(10*time.Millisecond + time.Microsecond))
	third := h.enqueue(Request{Tenant: "a", Cost: 1000})
	if !third.Dispatched().IsZero() {
		t.Fatal("sent beyond the provider's level")
	}
	// It goes once the level has refilled to its size: (1000 - 500 -
	// 1000 x 10 ms x r) / r later.
	need := (1000 - (500 + r*0.010)) / r
	h.clk.Set(t0.Add(10*time.Millisecond + time.Duration(need*float64(time.Second)) - time.Millisecond))
	h.q.Tick()
	if !third.Dispatched().IsZero() {
		t.Fatal("sent before the level refilled")
	}
	h.clk.Set(t0.Add(10*time.Millisecond + time.Duration(need*float64(time.Second)) + time.Millisecond))
	h.q.Tick()
	if third.Dispatched().IsZero() {
		t.Fatal("not sent once the level refilled")
	}
	// A report about first, sent before second's, is old news once
	// second's is in; second's own report lifts the cap.
	second.ProviderLevel(ProviderReport{RemainingTokens: 100000, RemainingRequests: 500, ResetTokens: time.Second, ResetRequests: time.Second})
	first.ProviderLevel(ProviderReport{RemainingTokens: 0, RemainingRequests: 0, ResetTokens: time.Minute, ResetRequests: time.Minute})
	if tk := h.enqueue(Request{Tenant: "a", Cost: 1000}); tk.Dispatched().IsZero() {
		t.Fatal("an older report held dispatch")
	}
	// The report lapses at its reset.
	second.ProviderLevel(ProviderReport{RemainingTokens: 0, RemainingRequests: -1, ResetTokens: 2 * time.Second})
	held := h.enqueue(Request{Tenant: "a", Cost: 1000})
	if !held.Dispatched().IsZero() {
		t.Fatal("sent beyond a report of nothing left")
	}
	h.clk.Set(t0.Add(2*time.Second + 11*time.Millisecond))
	h.q.Tick()
	if held.Dispatched().IsZero() {
		t.Fatal("held past the report's reset")
	}
}

// TestProviderCountsPromptAndCap: the account is corrected to what the
// provider counts, the prompt it reported and the output cap, however
// little was generated; a request that failed stays charged; one the
// provider refused (Requeue) is taken back.
func TestProviderCountsPromptAndCap(t *testing.T) {
	h := newHarness(t, upstreamConfig(6e6, time.Second, 0), 1, 1)
	tk := h.enqueue(Request{Tenant: "a", Cost: 500, Prompt: 100}) // 100 prompt + 400 output cap
	tk.ReleaseUsage(130, 120)                                     // 10 generated; the provider counted 120 of prompt
	if got := h.q.Upstream().WindowTokens; got != 520 {
		t.Fatalf("window %d, want 520 (120 + the 400 cap)", got)
	}
	failed := h.enqueue(Request{Tenant: "a", Cost: 500, Prompt: 100})
	failed.ReleaseUsage(0, -1)
	if got := h.q.Upstream().WindowTokens; got != 1020 {
		t.Fatalf("window %d after a failed request, want 1020", got)
	}
	refused := h.enqueue(Request{Tenant: "a", Cost: 500, Prompt: 100})
	h.q.AccountExhausted(t0.Add(time.Second)) // the provider's 429 says so
	if !refused.Requeue() {
		t.Fatal("Requeue failed")
	}
	h.inflight = h.inflight[:0]
	delete(h.dispatched, refused) // the harness would call its second dispatch a double
	h.clk.Set(t0.Add(time.Second))
	h.q.Tick()
	st := h.q.Upstream()
	// Sent again once the account is back: 1020 + 500, the refused
	// attempt's tokens taken back; its request counted by the provider.
	if st.WindowTokens != 1520 || st.WindowRequests != 4 {
		t.Fatalf("window %d tokens %d requests, want 1520 and 4", st.WindowTokens, st.WindowRequests)
	}
	h.clk.Set(t0.Add(63 * time.Second))
	if st := h.q.Upstream(); st.WindowTokens != 0 || st.WindowRequests != 0 {
		t.Fatalf("a minute later: %+v, want an empty window", st)
	}
}

// TestSendLog: sums over the window and since a time, entries merged at
// one instant, dropped 61 s on, compacted.
func TestSendLog(t *testing.T) {
	var l sendLog
	for i := range 1000 {
		l.add(t0.Add(time.Duration(i)*100*time.Millisecond), 10, 1)
	}
	now := t0.Add(99900 * time.Millisecond)
	if tok, req := l.inWindow(now); tok != 6000 || req != 600 {
		t.Fatalf("window %d %d, want 6000 and 600", tok, req)
	}
	if tok, _ := l.since(now.Add(-time.Second).UnixNano()); tok != 100 {
		t.Fatalf("since a second ago %d, want 100", tok)
	}
	l.add(now, -10, 0)
	// The last 61 s: 610 entries, the correction merged into the last.
	if kept, _ := l.since(math.MinInt64); len(l.e)-l.head != 610 || kept != 6090 {
		t.Fatalf("kept %d entries (%d tokens), want the 61 s: 610 (6090)", len(l.e)-l.head, kept)
	}
	if tok, req := l.inWindow(now); tok != 5990 || req != 600 {
		t.Fatalf("after a correction %d %d", tok, req)
	}
	if len(l.e) > 2*611 {
		t.Fatalf("never compacted: %d entries", len(l.e))
	}
}
