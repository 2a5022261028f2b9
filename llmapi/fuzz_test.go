package llmapi

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// The fuzz targets run in CI one at a time, for a bounded time, from the
// corpus committed under testdata/fuzz/<Target>:
//
//	go test -run '^$' -fuzz '^FuzzParse$' -fuzztime 300000x ./llmapi/
//
// (scripts/test.sh lists them.) Each catches panics, work beyond a fixed
// multiple of the input's size (stepBudget: a walk that reads a value
// once per enclosing level blows it at a few levels), and disagreement
// between what the gateway reads and what a model server's JSON decoder
// reads. The corpora of targets retired with the scanners they compared
// run as inputs of the target that took over their job: FuzzFastParse's
// in FuzzParse, FuzzScan's in FuzzParseUsage.

var fuzzPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/messages", "/other"}

// stepBudget is the most work (bytes handed to readers) a walk may do on
// n bytes. Parse reads each byte once, the members it keeps and reads
// again twice, a tool call's function four times, and all of the prompt
// once more when a member that comes first in the prompt comes late in
// the body (an Anthropic system after the messages); TestParseWorkIsLinear
// measures at most 4 on the hostile bodies, LightMode at most 20.
func stepBudget(n, perByte int) int { return perByte*n + 256 }

func fuzzSeeds() []string {
	deep := func(d int) string {
		return `{"messages":[{"role":"user","content":"a"}],"x":` + strings.Repeat("[", d-1) + strings.Repeat("]", d-1) + `}`
	}
	return []string{
		chatToolsBody, chatPartsBody, anthropicBody, completionsBody, completionsListBody,
		completionsIDsBody, completionsIDsNestedBody, embeddingsBody, embeddingsListBody,
		embeddingsIDsBody, responsesBody, responsesStringBody, cookbookBody,
		``, `{}`, `[]`, `null`, `{"messages":`, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
		`{"prompt":[[1],["a"]]}`, `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]}]}`,
		`{"max_tokens":1e400}`, "{\"messages\":[{\"content\":\"\\ud800\"}]}",
		// Hostile: nesting at and past the limit, tool results walked
		// before their type is known, escaped and duplicate keys, huge
		// and odd numbers, choices.
		deep(MaxDepth), deep(MaxDepth + 1), string(nestedToolResults(8, 16, true)), string(nestedToolResults((MaxDepth-3)/2, 4, false)),
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max\u005ftokens":100000}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_tokens":100000}`,
		`{"m\u0065ssages":[{"r\u006fle":"user","c\u006fntent":[{"t\u0079pe":"text","te\u0078t":"hi"}]}],"max_completion_tokens":5,"max\u005ftokens":7}`,
		`{"messages":[{"role":"user","content":[{"content":[{"text":"in","type":"text"}],"type":"tool_result"},{"content":"out","type":"document","text":"t"}]}]}`,
		`{"messages":[],"max_tokens":2147483647,"n":128}`, `{"prompt":"x","max_tokens":1e15,"n":2,"best_of":128}`,
		`{"messages":[],"max_tokens":-1}`, `{"messages":[],"max_tokens":"100"}`, `{"messages":[],"n":0}`, `{"messages":[],"n":129}`,
		`{"messages":[],"max_tokens":` + strings.Repeat("9", 400) + `}`,
		`{"messages":[{"role":"user","content":"\"\\\"\\\\\""}],"a\"b":1,"\\":2}`,
		// Shapes interpreted in place and the ones kept and read again:
		// members in any order, late system prompts, duplicates and
		// escaped keys inside messages, wrong types.
		smallChatBody, `{"messages":[{"role":"user","content":"a"}],"system":"s","max_tokens":3}`,
		`{"system":[{"type":"text","text":"s"}],"messages":[{"content":[{"content":"x","type":"tool_result"},{"type":"image"}],"role":"user"}]}`,
		`{"messages":[{"name":"n","content":"c","tool_calls":[{"function":{"arguments":{"a":1},"name":"f"}},{"x":1},null,3],"function_call":{"name":"g","arguments":"{}"}}]}`,
		`{"messages":[{"role":"user","content":"a","content":"b"}]}`, `{"messages":[{"role":1,"content":"a"}]}`,
		`{"messages":[{"ro\u006ce":"user","content":"a"}]}`, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		`{"messages":[{"role":"user","content":[{"content":5,"type":"text","text":"t"}]}]}`,
		`{"messages":[{"role":"user","content":[{"content":5,"type":"tool_result"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"tool\u005fresult","content":"x"}]}]}`,
		`{"messages":null,"system":null}`, `{"messages":{},"system":3}`, `{"messages":[1]}`,
		`{"model":"m","messages":[],"stream_options":{"include_usage":true}}`,
		`{"model":"m","input":[{"role":"user","content":"a"}],"instructions":"i"}`,
		`{"input":[{"role":"user","content":"a"}],"instructions":"i","model":"m"}`,
		deepPart(MaxDepth), deepPart(MaxDepth + 1), string(nestedToolResults((MaxDepth-3)/2+1, 4, true)),
		` {"model" : "m" , "messages" : [ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "a" } ] } ] } `,
	}
}

// deepPart is a chat body whose one content part holds arrays nested to
// depth d in all.
func deepPart(d int) string {
	const above = 5 // the body, messages, a message, its content, a part
	return `{"messages":[{"content":[{"type":"text","text":"a","x":` + strings.Repeat("[", d-above) + strings.Repeat("]", d-above) + `}]}]}`
}

// FuzzParse: Parse never panics, never modifies the body, works within the
// step budget, accepts exactly the JSON objects encoding/json accepts (up
// to MaxDepth), and agrees with encoding/json (which model servers written
// in Go decode with, and which keeps the last of duplicate keys as
// Python's json does) on every member the estimate reads. What it accepts
// can be estimated, and estimating walks the body as Parse did.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds() {
		for i := range fuzzPaths {
			f.Add(uint8(i), []byte(s))
		}
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, pathIdx uint8, body []byte) {
		checkParse(t, c, fuzzPaths[int(pathIdx)%len(fuzzPaths)], body)
	})
}

// checkParse checks Parse on one body as FuzzParse does.
func checkParse(t *testing.T, c Counter, path string, body []byte) {
	t.Helper()
	orig := bytes.Clone(body)
	req, n, err := parseWork(path, body)
	if !bytes.Equal(body, orig) {
		t.Fatal("Parse modified the body")
	}
	if n > stepBudget(len(body), 8) {
		t.Fatalf("Parse read %d bytes of a %d-byte body", n, len(body))
	}
	if err != nil {
		be, ok := err.(*BodyError)
		if !ok {
			t.Fatalf("error %T is not *BodyError", err)
		}
		if !json.Valid(body) && len(bytes.TrimSpace(body)) > 0 && be.Offset < 0 {
			t.Fatalf("invalid JSON %q: error %q names no offset", body, err)
		}
		return
	}
	texts, en := walkTexts(req)
	if en > stepBudget(len(body), 8) {
		t.Fatalf("the estimate's walk read %d bytes of a %d-byte body", en, len(body))
	}
	for _, tx := range texts {
		if !bytes.Contains(body, tx.raw) {
			t.Fatalf("text %q is not from the body", tx.raw)
		}
	}
	cost := Estimate(req, c, 16)
	if cost.Prompt < 0 || cost.Output < 0 || cost.Prompt > CostLimit || cost.Output > CostLimit || cost.Total() < max(cost.Prompt, cost.Output) {
		t.Fatalf("cost out of range %+v, total %d", cost, cost.Total())
	}
	if req.Kind != KindUnknown {
		agreeWithDecoder(t, req, body)
	}
}

// agreeWithDecoder checks the members the estimate reads against what
// encoding/json decodes from body.
func agreeWithDecoder(t *testing.T, req *Request, body []byte) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("Parse accepted what encoding/json refuses: %v", err)
	}
	number := func(key string) (float64, bool) {
		var f float64
		raw, ok := m[key]
		if !ok || string(raw) == "null" {
			return 0, false
		}
		if json.Unmarshal(raw, &f) != nil {
			f = math.Inf(1) // beyond float64: Parse saturates it
		}
		return f, true
	}
	capKeys := map[Kind][]string{
		KindChat: {"max_completion_tokens", "max_tokens"}, KindCompletions: {"max_tokens"},
		KindAnthropicMessages: {"max_tokens"}, KindResponses: {"max_output_tokens"},
	}[req.Kind]
	want := 0
	for _, k := range capKeys {
		if f, ok := number(k); ok && want == 0 {
			want = int(min(f, CostLimit))
		}
	}
	if req.MaxOutput != want {
		t.Fatalf("MaxOutput %d, the decoder reads %d", req.MaxOutput, want)
	}
	choices := 1
	if req.Kind == KindChat || req.Kind == KindCompletions {
		if f, ok := number("n"); ok {
			choices = int(f)
		}
		if f, ok := number("best_of"); ok && req.Kind == KindCompletions {
			choices = max(choices, int(f))
		}
	}
	if req.Choices != choices {
		t.Fatalf("Choices %d, the decoder reads %d", req.Choices, choices)
	}
	var model string
	if raw, ok := m["model"]; ok {
		_ = json.Unmarshal(raw, &model)
	}
	if req.Model != model && !strings.ContainsRune(model, '\uFFFD') {
		t.Fatalf("model %q, the decoder reads %q", req.Model, model)
	}
}

// FuzzLightMode: rewritten bodies are valid JSON that parses as the same
// kind, with messages left if there were any, and with the output cap that
// both Parse and encoding/json read no higher than asked: a rewrite must
// not leave a second copy of a key that a decoder would read instead.
func FuzzLightMode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(true, []byte(s), uint16(20), uint16(10))
		f.Add(false, []byte(s), uint16(1), uint16(0))
		f.Add(false, []byte(s), uint16(0), uint16(5))
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, anthropic bool, body []byte, maxIn, maxOut uint16) {
		kind, path := KindChat, "/v1/chat/completions"
		if anthropic {
			kind, path = KindAnthropicMessages, "/v1/messages"
		}
		req, err := Parse(path, body)
		orig := bytes.Clone(body)
		var rs readers
		out, changed, lerr := lightMode(&rs, kind, body, int(maxIn), int(maxOut), c)
		if !bytes.Equal(body, orig) {
			t.Fatal("LightMode modified its input")
		}
		if rs.n > stepBudget(len(body), 24) {
			t.Fatalf("LightMode read %d bytes of a %d-byte body", rs.n, len(body))
		}
		if err != nil || lerr != nil {
			return // LightMode may accept what Parse rejects and vice versa only in detail
		}
		if !changed {
			if !bytes.Equal(out, body) {
				t.Fatal("unchanged output differs")
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %s", out)
		}
		req2, err := Parse(path, out)
		if err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		if req2.Kind != req.Kind {
			t.Fatalf("kind %v became %v", req.Kind, req2.Kind)
		}
		if req.Messages > 0 && req2.Messages == 0 {
			t.Fatalf("all messages dropped: %s", out)
		}
		if maxOut > 0 {
			if req2.MaxOutput > int(maxOut) {
				t.Fatalf("output cap %d after capping at %d: %s", req2.MaxOutput, maxOut, out)
			}
			agreeWithDecoder(t, req2, out)
		}
	})
}

// FuzzStreamScanner: any input, split anywhere, gives the same result,
// whatever the line limit, within the step budget.
func FuzzStreamScanner(f *testing.F) {
	for _, s := range []string{openAIStream(true, "a", "b"), openAIStream(false, "x\ny"), anthropicStream + anthropicStreamEnd,
		responsesStream, completionsStream, vllmReasoningStream, "data: {\"usage\":\r\n\r\n"} {
		f.Add([]byte(s), uint16(len(s)/2), uint8(255))
		f.Add([]byte(s), uint16(len(s)/3), uint8(20))
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, stream []byte, split uint16, maxLine uint8) {
		i := int(split) % (len(stream) + 1)
		ParseUsage(stream)
		a, b := NewStreamScanner(c), NewStreamScanner(c)
		if maxLine < 255 {
			a.MaxLine, b.MaxLine = 8+4*int(maxLine), 8+4*int(maxLine)
		}
		a.Write(stream)
		b.Write(stream[:i])
		b.Write(stream[i:])
		ua, oka := a.Result()
		ub, okb := b.Result()
		if ua != ub || oka != okb {
			t.Fatalf("split at %d: %+v %v vs %+v %v", i, ub, okb, ua, oka)
		}
		if ua.Prompt < 0 || ua.Completion < 0 {
			t.Fatalf("negative usage %+v", ua)
		}
		// Events nest to a fixed depth, so scanning them is linear too.
		if a.rs.n > stepBudget(len(stream), 16) || b.rs.n > stepBudget(len(stream), 16) {
			t.Fatalf("the scanner read %d and %d bytes of a %d-byte stream", a.rs.n, b.rs.n, len(stream))
		}
	})
}
