package llmapi

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkEstimate is Estimate with each counter the gateway has, on a
// small chat, an 8k-token and a 100k-token prompt of English and Chinese
// (bigChatBody): the estimator the queue orders by (cl100k_base,
// o200k_base), the exact counter limits are decided on (…_exact, 64 KiB of
// text then sampled), approx, and tiktoken-go as the exact counter was
// before (tiktoken-go_64KiB), side by side.
func BenchmarkEstimate(b *testing.B) {
	body8k := bigChatBody(8000)
	body100k := bigChatBody(100_000)
	run := func(b *testing.B, c Counter, body string) {
		req, err := Parse("/v1/chat/completions", []byte(body))
		if err != nil {
			b.Fatal(err)
		}
		cost := Estimate(req, c, 1024) // warm: tiktoken-go loads its encoding on first use
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		loopCPU(b, func() { cost = Estimate(req, c, 1024) })
		b.ReportMetric(float64(cost.Prompt), "prompt-tokens")
	}
	counters := []struct {
		name string
		c    Counter
	}{
		{"tiktoken-go_64KiB", &boundedCounter{inner: tiktokenCounter{b, CL100kBase}, exactBytes: DefaultExactBytes}},
	}
	for _, name := range []string{CL100kBase, O200kBase, Approx} {
		est, err := NewEstimator(name)
		if err != nil {
			b.Fatal(err)
		}
		counters = append(counters, struct {
			name string
			c    Counter
		}{name, est})
	}
	counters = append(counters, struct {
		name string
		c    Counter
	}{CL100kBase + "_exact", mustCounter(b, CL100kBase)})
	for _, tc := range counters {
		b.Run(tc.name, func(b *testing.B) {
			b.Run("small", func(b *testing.B) { run(b, tc.c, smallChatBody) })
			b.Run("8k", func(b *testing.B) { run(b, tc.c, body8k) })
			b.Run("100k", func(b *testing.B) { run(b, tc.c, body100k) })
		})
	}
}

// smallChatBody is the request of the gateway's BenchmarkProxy: two short
// messages and a cap, the common case whose allocations the request path
// pays on every request.
const smallChatBody = `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"Say hello in five words."}],"max_tokens":32}`

func BenchmarkParse(b *testing.B) {
	for name, tc := range map[string]struct{ path, body string }{
		"chat_small": {"/v1/chat/completions", smallChatBody},
		"chat_8k":    {"/v1/chat/completions", bigChatBody(8000)},
		"chat_tools": {"/v1/chat/completions", chatToolsBody},
		"anthropic":  {"/v1/messages", anthropicBody},
		"responses":  {"/v1/responses", responsesBody},
	} {
		b.Run(name, func(b *testing.B) {
			body := []byte(tc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(tc.path, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A 500-chunk stream, one event per write as an upstream flushes them.
func benchStream(kind string) [][]byte {
	en, _ := testdataText()
	words := strings.Fields(en)
	var events []string
	switch kind {
	case "openai":
		events = append(events, `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1717000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`)
		for i := range 498 {
			events = append(events, fmt.Sprintf(`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1717000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}],"usage":null}`, encodeString(" "+words[i%len(words)])))
		}
		events = append(events, `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1717000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":812,"completion_tokens":498,"total_tokens":1310}}`, "data: [DONE]")
	case "anthropic":
		events = append(events, "event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":812,"output_tokens":1}}}`,
			"event: content_block_start\n"+`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		for i := range 496 {
			events = append(events, "event: content_block_delta\n"+fmt.Sprintf(`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%s}}`, encodeString(" "+words[i%len(words)])))
		}
		events = append(events, "event: content_block_stop\n"+`data: {"type":"content_block_stop","index":0}`,
			"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":496}}`)
	}
	out := make([][]byte, len(events))
	for i, e := range events {
		out[i] = []byte(e + "\n\n")
	}
	return out
}

func BenchmarkStreamScanner(b *testing.B) {
	withUsage := benchStream("openai")
	noUsage := append(append([][]byte{}, withUsage[:len(withUsage)-2]...), withUsage[len(withUsage)-1])
	cases := []struct {
		name    string
		stream  [][]byte
		counter string
	}{
		{"openai_usage", withUsage, CL100kBase},
		{"openai_no_usage_cl100k_base", noUsage, CL100kBase},
		{"openai_no_usage_approx", noUsage, Approx},
		{"anthropic", benchStream("anthropic"), CL100kBase},
	}
	for _, tc := range cases {
		c := mustCounter(b, tc.counter)
		b.Run(tc.name, func(b *testing.B) {
			n := 0
			for _, e := range tc.stream {
				n += len(e)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				s := NewStreamScanner(c)
				for _, e := range tc.stream {
					s.Write(e)
				}
				if _, ok := s.Result(); !ok {
					b.Fatal("no result")
				}
			}
		})
	}
}

func BenchmarkLightMode(b *testing.B) {
	body := []byte(bigChatBody(100_000))
	c := mustCounter(b, CL100kBase)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, changed, err := LightMode(KindChat, body, 8000, 512, c); err != nil || !changed {
			b.Fatal(changed, err)
		}
	}
}

// smallChatResponse is the upstream's answer in the gateway's
// BenchmarkProxy: a short completion, whose usage ParseUsage reads on
// every non-streamed response.
const smallChatResponse = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":25,"completion_tokens":7,"total_tokens":32}}`

// BenchmarkParseEstimate is what the gateway does with every request body:
// parse it into a Request it holds, then estimate its cost approximately.
func BenchmarkParseEstimate(b *testing.B) {
	c := mustCounter(b, Approx)
	for _, tc := range []struct{ name, path, body string }{
		{"chat_small", "/v1/chat/completions", smallChatBody},
		{"chat_8k", "/v1/chat/completions", bigChatBody(8000)},
		{"anthropic", "/v1/messages", anthropicBody},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var req Request
			var cost Cost
			for b.Loop() {
				if err := ParseTo(&req, tc.path, body); err != nil {
					b.Fatal(err)
				}
				cost = Estimate(&req, c, 1024)
			}
			b.ReportMetric(float64(cost.Prompt), "prompt-tokens")
		})
	}
}

func BenchmarkParseUsage(b *testing.B) {
	b.Run("chat_small", func(b *testing.B) { benchParseUsage(b, []byte(smallChatResponse)) })
	// An embeddings response: large, with usage at the end.
	var sb strings.Builder
	sb.WriteString(`{"object":"list","data":[`)
	for i := range 16 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"object":"embedding","index":0,"embedding":[`)
		for j := range 1536 {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString("-0.0123456789")
		}
		sb.WriteString(`]}`)
	}
	sb.WriteString(`],"model":"text-embedding-3-small","usage":{"prompt_tokens":512,"total_tokens":512}}`)
	b.Run("embeddings", func(b *testing.B) { benchParseUsage(b, []byte(sb.String())) })
	// A stream's final chunk, with usage and no choices.
	b.Run("stream_final", func(b *testing.B) {
		benchParseUsage(b, []byte(`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1717000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":812,"completion_tokens":498,"total_tokens":1310}}`))
	})
}

func benchParseUsage(b *testing.B, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ParseUsage(body); !ok {
			b.Fatal("no usage")
		}
	}
}
