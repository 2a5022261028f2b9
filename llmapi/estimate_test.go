package llmapi

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// The example of OpenAI's cookbook "How to count tokens with tiktoken",
// whose prompt the API reports as 129 tokens for gpt-4 and
// gpt-3.5-turbo-0613.
const cookbookBody = `{"model":"gpt-4","messages":[
{"role":"system","content":"You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
{"role":"system","name":"example_user","content":"New synergies will help drive top-line growth."},
{"role":"system","name":"example_assistant","content":"Things working well together will increase revenue."},
{"role":"system","name":"example_user","content":"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
{"role":"system","name":"example_assistant","content":"Let's talk later when we're less busy about how to do better."},
{"role":"user","content":"This late pivot means we don't have time to boil the ocean for the client deliverable."}]}`

func TestEstimate(t *testing.T) {
	cl := mustCounter(t, CL100kBase)
	tests := []struct {
		name, path, body string
		counter          Counter
		def              int
		want             Cost
	}{
		{"cookbook", "/v1/chat/completions", cookbookBody, cl, 256, Cost{129, 256}},
		// 4 per message + "hello world" (2) + 3 priming.
		{"one message", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10}`, cl, 256, Cost{9, 10}},
		{"name", "/v1/chat/completions", `{"messages":[{"role":"user","name":"bob","content":"hello world"}]}`, cl, 100, Cost{11, 100}},
		{"image", "/v1/chat/completions", chatPartsBody, cl, 0, Cost{2*MessageOverhead + ReplyPriming + ImageTokens + 7 + 6 + 3, 120}},
		{"completions", "/v1/completions", `{"prompt":"hello world","max_tokens":5}`, cl, 256, Cost{2, 5}},
		{"completions token ids", "/v1/completions", completionsIDsBody, cl, 256, Cost{4, 5}},
		{"embeddings", "/v1/embeddings", embeddingsListBody, cl, 256, Cost{5, 0}},
		{"embeddings ids", "/v1/embeddings", embeddingsIDsBody, cl, 256, Cost{5, 0}},
		{"responses string", "/v1/responses", `{"input":"hello world","max_output_tokens":50}`, cl, 256, Cost{9, 50}},
		{"no body", "/v1/models", "", cl, 256, Cost{}},
		{"unknown JSON", "/v1/rerank", `{"q":"x"}`, cl, 256, Cost{0, 256}},
		{"nil counter", "/v1/completions", `{"prompt":"hello world"}`, nil, 1, Cost{2, 1}},
		{"negative default", "/v1/completions", `{"prompt":"hello world"}`, cl, -5, Cost{2, 0}},
		// n and best_of multiply the output cap, or the default.
		{"n", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10,"n":4}`, cl, 256, Cost{9, 40}},
		{"n, default cap", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hello world"}],"n":3}`, cl, 100, Cost{9, 300}},
		{"best_of", "/v1/completions", `{"prompt":"hello world","max_tokens":5,"n":2,"best_of":6}`, cl, 256, Cost{2, 30}},
		{"n on embeddings", "/v1/embeddings", `{"input":"hello world","n":4}`, cl, 256, Cost{2, 0}},
		// Huge caps saturate, with every multiplier.
		{"cap 2^31-1", "/v1/messages", `{"messages":[],"max_tokens":2147483647}`, cl, 256, Cost{0, CostLimit}},
		{"cap 1e300 times 128", "/v1/chat/completions", `{"messages":[],"max_tokens":1e300,"n":128}`, cl, 256, Cost{0, CostLimit}},
		{"cap 2^30 times 2", "/v1/completions", `{"prompt":"hello world","max_tokens":1073741824,"n":2}`, cl, 256, Cost{2, CostLimit}},
		{"default beyond the limit", "/v1/chat/completions", `{"messages":[],"n":128}`, cl, math.MaxInt, Cost{0, CostLimit}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Parse(tt.path, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			got := Estimate(req, tt.counter, tt.def)
			if got != tt.want {
				t.Errorf("Estimate = %+v, want %+v", got, tt.want)
			}
			if want := min(tt.want.Prompt+tt.want.Output, CostLimit); got.Total() != want {
				t.Errorf("Total = %d, want %d", got.Total(), want)
			}
		})
	}
}

// Total saturates rather than wraps, whatever the parts hold.
func TestCostTotalSaturates(t *testing.T) {
	for _, tc := range []struct {
		c    Cost
		want int
	}{
		{Cost{CostLimit, CostLimit}, CostLimit},
		{Cost{CostLimit - 1, 1}, CostLimit},
		{Cost{CostLimit - 2, 1}, CostLimit - 1},
		{Cost{math.MaxInt, math.MaxInt}, CostLimit},
		{Cost{-5, 3}, 3}, // a negative part counts as nothing
		{Cost{100, 28}, 128},
	} {
		if got := tc.c.Total(); got != tc.want {
			t.Errorf("%+v.Total() = %d, want %d", tc.c, got, tc.want)
		}
	}
	// A hand-made Request with absurd counts still gives a bounded cost.
	got := Estimate(&Request{Kind: KindChat, MaxOutput: math.MaxInt, Choices: math.MaxInt, Images: math.MaxInt / 2}, nil, 0)
	if got.Prompt != CostLimit || got.Output != CostLimit || got.Total() != CostLimit {
		t.Errorf("Estimate = %+v, Total %d", got, got.Total())
	}
}

// approx estimates every realistic body within 20% of cl100k_base, and
// a long body's bounded estimate stays close to its exact count.
func TestEstimateCountersAgree(t *testing.T) {
	cl, o2, ap := mustCounter(t, CL100kBase), mustCounter(t, O200kBase), mustCounter(t, Approx)
	for _, body := range []struct{ path, body string }{
		{"/v1/chat/completions", chatToolsBody},
		{"/v1/messages", anthropicBody},
		{"/v1/responses", responsesBody},
		{"/v1/chat/completions", bigChatBody(8000)},
	} {
		req, err := Parse(body.path, []byte(body.body))
		if err != nil {
			t.Fatal(err)
		}
		a, b, c := Estimate(req, cl, 0).Prompt, Estimate(req, o2, 0).Prompt, Estimate(req, ap, 0).Prompt
		t.Logf("%s %d bytes: cl100k=%d o200k=%d approx=%d", body.path, len(body.body), a, b, c)
		if relErr(c, a) > 0.2 || relErr(c, a) < -0.2 {
			t.Errorf("approx=%d is not within 20%% of cl100k=%d", c, a)
		}
	}
	req, _ := Parse("/v1/chat/completions", []byte(bigChatBody(100_000)))
	bounded, exact := Estimate(req, cl, 0).Prompt, Estimate(req, WithExactBudget(cl, 0), 0).Prompt
	t.Logf("100k-token chat: bounded=%d exact=%d error=%+.2f%%", bounded, exact, 100*relErr(bounded, exact))
	if relErr(bounded, exact) > 0.03 || relErr(bounded, exact) < -0.03 {
		t.Errorf("bounded estimate %d vs exact %d", bounded, exact)
	}
}

// bigChatBody builds a multi-turn chat body of about tokens cl100k tokens,
// mixing English and Chinese turns.
func bigChatBody(tokens int) string {
	en, zh := testdataText()
	var msgs []string
	msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":%s}`, encodeString(en[:2000])))
	src := longText(en+"\n\n"+zh, tokens*3)
	paras := strings.Split(src, "\n\n")
	for i := 0; i+2 < len(paras); i += 3 {
		role := "user"
		if i/3%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":%s}`, role, encodeString(strings.Join(paras[i:i+3], "\n\n"))))
	}
	return `{"model":"gpt-4o","stream":true,"max_tokens":1024,"messages":[` + strings.Join(msgs, ",") + `]}`
}

// TestEstimateInlineTexts: the texts a Request keeps from its parse are
// the ones a second walk gathers, in order, so Estimate counts the same
// with them as without; a prompt of more texts than a Request keeps is
// walked again.
func TestEstimateInlineTexts(t *testing.T) {
	many := `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"hi there"},`, inlineTexts) +
		`{"role":"user","content":"last"}]}`
	for _, tc := range []struct{ name, path, body string }{
		{"small", "/v1/chat/completions", smallChatBody},
		{"tools", "/v1/chat/completions", chatToolsBody},
		{"anthropic", "/v1/messages", anthropicBody},
		{"responses", "/v1/responses", responsesBody},
		{"inferred", "/custom", chatToolsBody},
		{"more_than_inline", "/v1/chat/completions", many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := Parse(tc.path, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if !req.walked {
				t.Fatal("Parse did not mark the request walked")
			}
			walked, _ := walkTexts(req)
			if len(walked) != req.nTexts {
				t.Fatalf("walk gathered %d texts, parse counted %d", len(walked), req.nTexts)
			}
			if req.nTexts <= inlineTexts {
				for i, w := range walked {
					if got := req.texts[i]; string(got.raw) != string(w.raw) || got.compact != w.compact {
						t.Errorf("text %d: kept %q (compact %v), walk has %q (compact %v)", i, got.raw, got.compact, w.raw, w.compact)
					}
				}
			} else if tc.name == "small" || tc.name == "responses" {
				t.Fatalf("%d texts: the case does not test what it names", req.nTexts)
			}
			if tc.name == "more_than_inline" && req.nTexts <= inlineTexts {
				t.Fatalf("%d texts: the case does not test what it names", req.nTexts)
			}
			for _, name := range CounterNames() {
				c := mustCounter(t, name)
				got := Estimate(req, c, 100)
				rewalk := *req
				rewalk.walked = false
				if want := Estimate(&rewalk, c, 100); got != want {
					t.Errorf("%s: estimate %+v with the parse's texts, %+v walking again", name, got, want)
				}
			}
		})
	}
}
