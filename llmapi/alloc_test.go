package llmapi

import "testing"

// TestRequestPathAllocs guards what parsing and estimating a small chat
// request allocate: the Request Parse returns, and the one buffer the
// estimate's strings share. The walk's scanner, path, texts and strings
// come from a pool (before it: 5 and 9).
func TestRequestPathAllocs(t *testing.T) {
	body := []byte(smallChatBody)
	want := 1.0
	if raceEnabled {
		want = 3 // the pool drops some of what is put back
	}
	var req *Request
	var err error
	if got := testing.AllocsPerRun(500, func() {
		req, err = Parse("/v1/chat/completions", body)
	}); err != nil || got > want {
		t.Errorf("Parse: %v allocations per call (error %v), want at most %v", got, err, want)
	}
	c := mustCounter(t, Approx)
	var cost Cost
	if got := testing.AllocsPerRun(500, func() { cost = Estimate(req, c, 100) }); got > want {
		t.Errorf("Estimate: %v allocations per call, want at most %v", got, want)
	}
	if cost.Prompt <= 0 || cost.Output != 32 {
		t.Errorf("Estimate: %+v, want a prompt and the body's max_tokens 32", cost)
	}
}
