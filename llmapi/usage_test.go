package llmapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name, body string
		want       Usage
		ok         bool
	}{
		{"openai chat", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"usage\": {}"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"fp"}`,
			Usage{19, 10, true}, true},
		{"embeddings", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],"model":"m","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			Usage{8, 0, false}, true},
		{"responses", `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],
			"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"total_tokens":123}}`,
			Usage{36, 87, true}, true},
		{"anthropic with cache", `{"id":"msg_1","type":"message","content":[{"type":"text","text":"Hi"}],
			"usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":6}}`,
			Usage{1112, 6, true}, true},
		{"float counts", `{"usage":{"prompt_tokens":3.0,"completion_tokens":4.0}}`, Usage{3, 4, true}, true},
		{"duplicate key, last wins", `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":2}}`, Usage{2, 2, true}, true},
		{"error body", `{"error":{"message":"bad","type":"invalid_request_error"}}`, Usage{}, false},
		{"null usage", `{"usage":null}`, Usage{}, false},
		{"empty usage", `{"usage":{}}`, Usage{}, false},
		{"nested only", `{"data":{"usage":{"prompt_tokens":5}}}`, Usage{}, false},
		{"not JSON", `<html>502</html>`, Usage{}, false},
		{"empty", ``, Usage{}, false},
		{"truncated", `{"usage":{"prompt_tokens":5`, Usage{}, false},
	}
	for _, tt := range tests {
		got, ok := ParseUsage([]byte(tt.body))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: ParseUsage = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e)
		b.WriteString("\n\n")
	}
	return b.String()
}

func openAIStream(usage bool, texts ...string) string {
	ev := []string{`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`}
	for _, t := range texts {
		ev = append(ev, fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%s},"finish_reason":null}],"usage":null}`, encodeString(t)))
	}
	ev = append(ev, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`)
	if usage {
		ev = append(ev, `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":7,"total_tokens":49}}`)
	}
	return sse(append(ev, "data: [DONE]")...)
}

const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","usage":{"input_tokens":25,"cache_read_input_tokens":100,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world, \"quoted\"\n\u00e9\ud83d\ude00"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

`

const anthropicStreamEnd = `event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`

const responsesStream = `event: response.created
data: {"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":" there"}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}],"usage":{"input_tokens":11,"output_tokens":2,"total_tokens":13}}}

`

const completionsStream = `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"Once upon","index":0,"finish_reason":null}]}

data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":" a time","index":0,"finish_reason":"length"}]}

data: [DONE]

`

const vllmReasoningStream = `data: {"choices":[{"index":0,"delta":{"reasoning_content":"Think about it."}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\"}"}}]}}]}

data: [DONE]

`

func TestStreamScanner(t *testing.T) {
	cl := mustCounter(t, CL100kBase)
	count := func(s string) int { return cl.Count(s) }
	tests := []struct {
		name, stream string
		want         Usage
		ok           bool
	}{
		{"openai with usage", openAIStream(true, "Hello", " world"), Usage{42, 7, true}, true},
		{"openai without usage", openAIStream(false, "Hello", " world", "!\n中文"), Usage{0, count("Hello world!\n中文"), false}, true},
		{"anthropic", anthropicStream + anthropicStreamEnd, Usage{125, 15, true}, true},
		{"anthropic cut short", anthropicStream, Usage{125, count("Hello world, \"quoted\"\né😀"), false}, true},
		{"responses", responsesStream, Usage{11, 2, true}, true},
		{"responses without completion", strings.Split(responsesStream, "event: response.completed")[0], Usage{0, count("Hi there"), false}, true},
		{"completions", completionsStream, Usage{0, count("Once upon a time"), false}, true},
		{"reasoning and tool calls", vllmReasoningStream, Usage{0, count(`Think about it.get_weather{"city": "Paris"}`), false}, true},
		{"CRLF", strings.ReplaceAll(openAIStream(true, "a"), "\n", "\r\n"), Usage{42, 7, true}, true},
		{"CR", strings.ReplaceAll(anthropicStream+anthropicStreamEnd, "\n", "\r"), Usage{125, 15, true}, true},
		{"no blank lines", strings.ReplaceAll(openAIStream(true, "a"), "\n\n", "\n"), Usage{42, 7, true}, true},
		{"unterminated final event", strings.TrimRight(strings.TrimSuffix(openAIStream(true, "a"), "data: [DONE]\n\n"), "\n"), Usage{42, 7, true}, true},
		{"comments and fields", ": keep-alive\nid: 1\nretry: 100\nevent: x\n" + openAIStream(true), Usage{42, 7, true}, true},
		{"multi-line data", "data: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n", Usage{1, 2, true}, true},
		{"error body", `{"error":{"message":"overloaded"}}`, Usage{}, false},
		{"empty", "", Usage{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(how string, s *StreamScanner) {
				t.Helper()
				got, ok := s.Result()
				if got != tt.want || ok != tt.ok {
					t.Fatalf("%s: Result = %+v, %v; want %+v, %v", how, got, ok, tt.want, tt.ok)
				}
				if again, _ := s.Result(); again != got {
					t.Fatalf("%s: second Result = %+v", how, again)
				}
			}
			whole := NewStreamScanner(cl)
			whole.Write([]byte(tt.stream))
			check("one write", whole)
			for i := 0; i <= len(tt.stream); i++ {
				s := NewStreamScanner(cl)
				s.Write([]byte(tt.stream[:i]))
				s.Write([]byte(tt.stream[i:]))
				check(fmt.Sprintf("split at %d", i), s)
			}
			bytewise := NewStreamScanner(cl)
			for i := range len(tt.stream) {
				bytewise.Write([]byte{tt.stream[i]})
			}
			check("byte by byte", bytewise)
		})
	}
}

func TestStreamScannerBoundedMemory(t *testing.T) {
	s := NewStreamScanner(mustCounter(t, Approx))
	s.MaxLine = 64 << 10
	chunk := []byte(strings.Repeat("x", 1000))
	s.Write([]byte(`data: {"choices":[{"delta":{"content":"`))
	for range 1000 { // a 1 MB line
		s.Write(chunk)
		if cap(s.line) > 2*s.MaxLine {
			t.Fatalf("line buffer grew to %d", cap(s.line))
		}
	}
	s.Write([]byte("\"}}]}\n\n"))
	s.Write([]byte(openAIStream(true, "ok")))
	if got, ok := s.Result(); !ok || got != (Usage{42, 7, true}) {
		t.Errorf("after an overlong line: %+v, %v", got, ok)
	}

	// Streamed text is counted as it comes, not kept.
	s = NewStreamScanner(mustCounter(t, Approx))
	ev := []byte(`data: {"choices":[{"delta":{"content":"` + strings.Repeat("word ", 200) + `"}}]}` + "\n\n")
	for range 2000 {
		s.Write(ev)
		if cap(s.text) > 2*streamFlush {
			t.Fatalf("text buffer grew to %d", cap(s.text))
		}
	}
	want := 2000 * approxCounter{}.Count(strings.Repeat("word ", 200))
	if got, _ := s.Result(); got.Completion != want {
		t.Errorf("counted %d", got.Completion)
	}
}

// Streamed text beyond the exact budget is extrapolated.
func TestStreamScannerExtrapolates(t *testing.T) {
	en, zh := testdataText()
	text := longText(en+"\n\n"+zh, 300<<10)
	cl := mustCounter(t, CL100kBase)
	var chunks []string
	for i := 0; i < len(text); {
		j := alignForward(text, min(i+40, len(text)), 8)
		chunks = append(chunks, text[i:j])
		i = j
	}
	s := NewStreamScanner(WithExactBudget(cl, 64<<10))
	s.Write([]byte(openAIStream(false, chunks...)))
	got, _ := s.Result()
	want := WithExactBudget(cl, 0).Count(text)
	t.Logf("300 KiB stream: counted %d, exact %d, error %+.2f%%", got.Completion, want, 100*relErr(got.Completion, want))
	if relErr(got.Completion, want) > 0.10 || relErr(got.Completion, want) < -0.10 {
		t.Errorf("stream count %d vs exact %d", got.Completion, want)
	}
}

func TestUnquote(t *testing.T) {
	for _, s := range []string{"", "plain", "a\"b\\c/d\b\f\n\r\t", "é中😀", "\u2028\u0000\u001f", "<>&", "\\u0041"} {
		raw, _ := json.Marshal(s)
		if got := string(unquote(nil, raw)); got != s {
			t.Errorf("unquote(%s) = %q, want %q", raw, got, s)
		}
	}
	for raw, want := range map[string]string{
		`"\ud83d\ude00"`: "😀",
		`"\u00E9\/"`:     "é/",
		`"\ud83d"`:       "\uFFFD",
		`"\ud83d\u0041"`: "\uFFFDA",
		"\"a\xffb\\n\"":  "a\xffb\n", // kept as it stands, as in a string without escapes
	} {
		if got := string(unquote(nil, []byte(raw))); got != want {
			t.Errorf("unquote(%s) = %q, want %q", raw, got, want)
		}
	}
}

// A line is skipped by its length, however the writes split it.
func TestStreamScannerMaxLineSplitInvariant(t *testing.T) {
	stream := openAIStream(true, strings.Repeat("x", 100))
	for maxLine := 150; maxLine < 400; maxLine++ {
		whole := NewStreamScanner(nil)
		whole.MaxLine = maxLine
		whole.Write([]byte(stream))
		want, _ := whole.Result()
		for i := 0; i <= len(stream); i += 7 {
			s := NewStreamScanner(nil)
			s.MaxLine = maxLine
			s.Write([]byte(stream[:i]))
			s.Write([]byte(stream[i:]))
			if got, _ := s.Result(); got != want {
				t.Fatalf("MaxLine %d, split at %d: %+v, want %+v", maxLine, i, got, want)
			}
		}
	}
}

// Malformed JSON must not stall the scanner (found by fuzzing: a value the
// scanner could not step over looped forever), and must give a defined
// result: no usage from the response paths, a *BodyError from Parse, and
// no more scanning work than a few passes over the input.
func TestScannerMalformedTerminates(t *testing.T) {
	for _, s := range []string{
		`{"choices":[{"":,"delta":{}}]}`, `{"choices":[}]}`, `{"choices":[1 2]}`, `{"choices":[,]}`,
		`{"a":}`, `{"a" 1}`, `{"a":1,}`, `{`, `[`, `{"choices":[{"delta":{"tool_calls":[}}]}`,
		`{"usage":{"prompt_tokens":5`, `{"usage":{"prompt_tokens":5,}}`, `{"usage":{"prompt_tokens" 5}}`,
		`{"a":"\`, `{"a":"\"}`, `{"a":[[[[`, `]]]]`, `"`, `{"a\":1}`, `{"choices":[{"delta":{"content":"x}]}`,
	} {
		b := []byte(s)
		if json.Valid(b) {
			t.Fatalf("%s is valid JSON", s)
		}
		sc := NewStreamScanner(nil)
		sc.Write([]byte("data: " + s + "\n\n"))
		if u, _ := sc.Result(); u != (Usage{}) {
			t.Errorf("%s: stream usage %+v", s, u)
		}
		if u, ok := ParseUsage(b); ok || u != (Usage{}) {
			t.Errorf("%s: ParseUsage = %+v, %v", s, u, ok)
		}
		var be *BodyError
		if _, err := Parse("/v1/chat/completions", b); !errors.As(err, &be) || be.Offset < 0 {
			t.Errorf("%s: Parse error %v, want a *BodyError with an offset", s, err)
		}
		// The scanner reads the event once.
		if sc.rs.n > len(b) {
			t.Errorf("%s: %d bytes read for %d bytes", s, sc.rs.n, len(b))
		}
	}
}
