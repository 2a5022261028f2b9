package llmapi

import (
	"bytes"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// Hostile bodies: shapes a client can send to make parsing slow, deep or
// ambiguous. The tests hold the walk's work to a small multiple of the
// body's size (the bytes handed to its readers, which count work, not
// time, so the assertions hold on a loaded machine); the benchmarks time
// the worst of them at the default max_body against a plain chat body of
// the same size.

// maxBody is the gateway's default max_body, the largest body it parses.
const maxBody = 8 << 20

// toolResults returns Anthropic content that nests levels tool_result
// blocks around one string. With typeLast, each block's type follows its
// content, so that the parser must walk the content before it knows it is a
// tool result.
func toolResults(levels int, payload string, typeLast bool) string {
	open, close := `[{"type":"tool_result","tool_use_id":"t","content":`, `}]`
	if typeLast {
		open, close = `[{"tool_use_id":"t","content":`, `,"type":"tool_result"}]`
	}
	return strings.Repeat(open, levels) + `"` + payload + `"` + strings.Repeat(close, levels)
}

// nestedToolResults returns an Anthropic body whose one message holds
// toolResults(levels, payload bytes, typeLast); its depth is 3+2*levels.
func nestedToolResults(levels, payload int, typeLast bool) []byte {
	return []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":` +
		toolResults(levels, strings.Repeat("a", payload), typeLast) + `}]}`)
}

// depth of a body: its deepest nesting of arrays and objects.
func depth(b []byte) int {
	deepest, _ := nesting(b)
	return deepest
}

// tooDeep returns the offset of the first bracket of b nested deeper than
// MaxDepth, or -1.
func tooDeep(b []byte) int {
	_, first := nesting(b)
	return first
}

// nesting scans b once: its deepest nesting of arrays and objects, and the
// offset of the first bracket deeper than MaxDepth (-1: none).
func nesting(b []byte) (deepest, firstTooDeep int) {
	d, inString := 0, false
	firstTooDeep = -1
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
			if d > MaxDepth && firstTooDeep < 0 {
				firstTooDeep = i
			}
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest, firstTooDeep
}

// repeatTo builds head + item + sep + item ... + tail of about size bytes.
func repeatTo(size int, head, item, sep, tail string) []byte {
	var b bytes.Buffer
	b.Grow(size + len(item))
	b.WriteString(head)
	for n := 0; b.Len()+len(item)+len(tail) < size; n++ {
		if n > 0 {
			b.WriteString(sep)
		}
		b.WriteString(item)
	}
	b.WriteString(tail)
	return b.Bytes()
}

type hostileCase struct {
	name, path string
	body       []byte
}

// hostileBodies are the shapes the linearity test and the benchmarks
// share, each about size bytes.
func hostileBodies(size int) []hostileCase {
	// The deepest tool_result nesting that is allowed: 3 levels for
	// the body, messages and the message, 2 per block.
	levels := (MaxDepth - 3) / 2
	wide := toolResults(levels, "aaaa", true)
	deep := strings.Repeat("[", MaxDepth-2) + strings.Repeat("]", MaxDepth-2)
	return []hostileCase{
		{"nested_tool_results", "/v1/messages", nestedToolResults(levels, size-levels*60, false)},
		{"nested_tool_results_type_last", "/v1/messages", nestedToolResults(levels, size-levels*60, true)},
		{"nested_tool_results_wide", "/v1/messages", repeatTo(size, `{"max_tokens":1,"messages":[{"role":"user","content":[`, wide[1:len(wide)-1], ",", `]}]}`)},
		{"deep_arrays", "/v1/chat/completions", repeatTo(size, `{"messages":[{"role":"user","content":"hi"}],"x":[`, deep, ",", `]}`)},
		{"tiny_parts", "/v1/chat/completions", repeatTo(size, `{"messages":[{"role":"user","content":[`, `{"type":"image_url"}`, ",", `]}]}`)},
		{"tiny_text_parts", "/v1/messages", repeatTo(size, `{"max_tokens":1,"messages":[{"role":"user","content":[`, `{"type":"text","text":"a"}`, ",", `]}]}`)},
		{"tiny_messages", "/v1/chat/completions", repeatTo(size, `{"messages":[`, `{"role":"user","content":"a"}`, ",", `]}`)},
		{"escaped_keys", "/v1/chat/completions", repeatTo(size, `{"messages":[`, `{"r\u006fle":"user","c\u006fntent":"a"}`, ",", `]}`)},
		{"escaped_quotes", "/v1/chat/completions", repeatTo(size, `{"messages":[{"role":"user","content":"`, `\"`, "", `"}]}`)},
		{"tool_calls", "/v1/chat/completions", repeatTo(size, `{"messages":[{"role":"assistant","tool_calls":[`, `{"function":{"name":"f","arguments":"{}"}}`, ",", `]}]}`)},
		{"token_ids", "/v1/completions", repeatTo(size, `{"prompt":[`, `1`, ",", `]}`)},
		{"token_id_arrays", "/v1/completions", repeatTo(size, `{"prompt":[`, `[1]`, ",", `]}`)},
		{"one_byte_strings", "/v1/embeddings", repeatTo(size, `{"input":[`, `"a"`, ",", `]}`)},
	}
}

// plainBody is a realistic chat body of about size bytes.
func plainBody(size int) []byte {
	b := []byte(bigChatBody(size / 3))
	for len(b) < size*9/10 {
		b = []byte(bigChatBody(len(b) / 2))
	}
	return b
}

func TestHostileBodiesAreWhatTheySay(t *testing.T) {
	for _, tc := range hostileBodies(1 << 16) {
		if d := depth(tc.body); d > MaxDepth {
			t.Errorf("%s: depth %d", tc.name, d)
		}
		if _, err := Parse(tc.path, tc.body); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if d := depth(nestedToolResults((MaxDepth-3)/2, 1, true)); d != MaxDepth-1 {
		t.Errorf("deepest tool_result nesting has depth %d, want %d", d, MaxDepth-1)
	}
}

// Parsing reads each byte a bounded number of times however deep the body
// nests: a scanner this package once had stepped over a value once per
// enclosing level, which made 30 levels of tool results 30 passes over
// their content (and 4000 levels, encoding/json's limit being 10000, a
// minute of CPU). Here the work per byte is the same at every depth, for
// Parse, for the walk Estimate makes to read the prompt, and for LightMode.
func TestParseWorkIsLinear(t *testing.T) {
	c := mustCounter(t, Approx)
	perByte := func(n int, body []byte) float64 { return float64(n) / float64(len(body)) }
	const payload = 1 << 20
	var first [3]float64
	for _, levels := range []int{1, 2, 5, 15, (MaxDepth - 3) / 2} {
		for _, typeLast := range []bool{false, true} {
			body := nestedToolResults(levels, payload, typeLast)
			req, pn, err := parseWork("/v1/messages", body)
			if err != nil {
				t.Fatalf("%d levels: %v", levels, err)
			}
			texts, en := walkTexts(req)
			if len(texts) != 1 || len(texts[0].raw) != payload+2 {
				t.Fatalf("%d levels: texts %d, want the payload once", levels, len(texts))
			}
			// LightMode keeps tool results within tool results whole (see
			// shrinkContent), but it still reads them.
			var ls readers
			if _, changed, err := lightMode(&ls, KindAnthropicMessages, body, 1000, 100, c); err != nil || levels <= 1 && !changed {
				t.Fatalf("%d levels: LightMode changed=%v, %v", levels, changed, err)
			}
			got := [3]float64{perByte(pn, body), perByte(en, body), perByte(ls.n, body)}
			t.Logf("%2d levels (type last %-5v): bytes read per byte: Parse %.3f, Estimate %.3f, LightMode %.3f", levels, typeLast, got[0], got[1], got[2])
			if levels <= 1 {
				// LightMode cuts the content of a first tool result;
				// deeper ones cost nothing more.
				first = got
				continue
			}
			for i, name := range []string{"Parse", "Estimate", "LightMode"} {
				// 0.01 per byte is 10 KB: the bodies grow by 60 bytes
				// per level.
				if got[i] > first[i]+0.01 {
					t.Errorf("%d levels: %s reads %.3f bytes per byte, %.3f without nesting", levels, name, got[i], first[i])
				}
			}
		}
	}
	// Every hostile shape, at a bound a few times a single pass: a tool
	// call's function is read four times (with the body, the message's
	// tool calls, the call, the function), everything else at most twice.
	for _, tc := range hostileBodies(1 << 20) {
		req, pn, err := parseWork(tc.path, tc.body)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, en := walkTexts(req)
		var ls readers
		lightMode(&ls, req.Kind, tc.body, 1000, 100, c)
		t.Logf("%-30s bytes read per byte: Parse %.2f, Estimate %.2f, LightMode %.2f", tc.name, perByte(pn, tc.body), perByte(en, tc.body), perByte(ls.n, tc.body))
		if perByte(pn, tc.body) > 4 || perByte(en, tc.body) > 4 || perByte(ls.n, tc.body) > 20 {
			t.Errorf("%s: reads Parse %d, Estimate %d, LightMode %d for %d bytes", tc.name, pn, en, ls.n, len(tc.body))
		}
	}
}

// BenchmarkParseHostile times Parse on the worst shapes at the default
// max_body (8 MiB) beside a plain chat body of the same size.
func BenchmarkParseHostile(b *testing.B) {
	cases := append([]hostileCase{{"plain", "/v1/chat/completions", plainBody(maxBody)}}, hostileBodies(maxBody)...)
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(tc.path, tc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEstimateHostile times Estimate (the walk that reads the prompt
// from the body, and counting within the default exact budget) on the
// same bodies.
func BenchmarkEstimateHostile(b *testing.B) {
	cases := append([]hostileCase{{"plain", "/v1/chat/completions", plainBody(maxBody)}}, hostileBodies(maxBody)...)
	c := mustCounter(b, CL100kBase)
	for _, tc := range cases {
		req, err := Parse(tc.path, tc.body)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				Estimate(req, c, 1024)
			}
		})
	}
}

// A parsed Request refers to its body instead of copying the prompt: a
// queued request costs its body plus where its texts stand. Parse used to
// copy every prompt string, doubling the memory of each queued request.
func TestParseDoesNotCopyThePrompt(t *testing.T) {
	body := plainBody(4 << 20)
	if _, err := Parse("/v1/chat/completions", body); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req, err := Parse("/v1/chat/completions", body)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("Parse of a %d-byte chat body allocated %d bytes; Request is %d bytes", len(body), allocated, reflect.TypeOf(*req).Size())
	// What it allocates is per text, not per prompt byte: where each
	// text stands, kept for Estimate (keptTexts: a sixteenth of the body
	// at most), and the slice they were gathered in.
	if allocated > uint64(len(body))/8 {
		t.Errorf("Parse allocated %d bytes for a %d-byte body", allocated, len(body))
	}
	// The prompt is still all there.
	texts, total := req.Texts(), 0
	for _, s := range texts {
		total += len(s)
	}
	if total < len(body)*9/10 {
		t.Errorf("texts hold %d bytes of a %d-byte body", total, len(body))
	}
}

// Estimating a prompt of many tiny strings makes a bounded number of
// tokenizer calls in bounded memory, and still counts them about right:
// each "ab" is one token.
func TestEstimateBoundsTokenizerCalls(t *testing.T) {
	for _, n := range []int{2000, 1_000_000} {
		body := repeatTo(n*5+16, `{"input":[`, `"ab"`, ",", `]}`)
		req, err := Parse("/v1/embeddings", body)
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		c := &boundedCounter{inner: callCounter{mustCounter(t, CL100kBase), &calls}, exactBytes: DefaultExactBytes}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got := Estimate(req, c, 0).Prompt
		runtime.ReadMemStats(&after)
		texts := len(req.Texts())
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("%d strings: estimate %d tokens, %d tokenizer calls, %d bytes allocated for a %d-byte body", texts, got, calls, allocated, len(body))
		// At most maxTexts texts are gathered, whatever their number, and
		// the tokenizer is called at most 1024 times: what is allocated
		// does not grow with the number of strings (gathering all 10^6
		// took 200 MB).
		if allocated > 16<<20+uint64(len(body)) {
			t.Errorf("%d strings: Estimate allocated %d bytes", texts, allocated)
		}
		if limit := DefaultExactBytes / minCallBytes; calls > limit {
			t.Errorf("%d strings: %d tokenizer calls, want at most %d", texts, calls, limit)
		}
		if relErr(got, texts) > 0.05 || relErr(got, texts) < -0.05 {
			t.Errorf("%d strings: estimate %d tokens", texts, got)
		}
	}
}
