package llmapi

import (
	"bytes"
	"encoding/json"
	"testing"
)

var fuzzPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/messages", "/other"}

func fuzzSeeds() []string {
	return []string{
		chatToolsBody, chatPartsBody, anthropicBody, completionsBody, completionsListBody,
		completionsIDsBody, completionsIDsNestedBody, embeddingsBody, embeddingsListBody,
		embeddingsIDsBody, responsesBody, responsesStringBody, cookbookBody,
		``, `{}`, `[]`, `null`, `{"messages":`, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
		`{"prompt":[[1],["a"]]}`, `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]}]}`,
		`{"max_tokens":1e400}`, "{\"messages\":[{\"content\":\"\\ud800\"}]}",
	}
}

// FuzzParse: Parse never panics, never modifies the body, and what it
// accepts can be estimated.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds() {
		for i := range fuzzPaths {
			f.Add(uint8(i), []byte(s))
		}
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, pathIdx uint8, body []byte) {
		orig := bytes.Clone(body)
		req, err := Parse(fuzzPaths[int(pathIdx)%len(fuzzPaths)], body)
		if !bytes.Equal(body, orig) {
			t.Fatal("Parse modified the body")
		}
		if err != nil {
			if _, ok := err.(*BodyError); !ok {
				t.Fatalf("error %T is not *BodyError", err)
			}
			return
		}
		if cost := Estimate(req, c, 16); cost.Prompt < 0 || cost.Output < 0 {
			t.Fatalf("negative cost %+v", cost)
		}
	})
}

// FuzzLightMode: rewritten bodies are valid JSON that parses as the same
// kind, with messages left if there were any.
func FuzzLightMode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(true, []byte(s), uint16(20), uint16(10))
		f.Add(false, []byte(s), uint16(1), uint16(0))
	}
	c := mustCounter(f, Approx)
	f.Fuzz(func(t *testing.T, anthropic bool, body []byte, maxIn, maxOut uint16) {
		kind, path := KindChat, "/v1/chat/completions"
		if anthropic {
			kind, path = KindAnthropicMessages, "/v1/messages"
		}
		req, err := Parse(path, body)
		orig := bytes.Clone(body)
		out, changed, lerr := LightMode(kind, body, int(maxIn), int(maxOut), c)
		if !bytes.Equal(body, orig) {
			t.Fatal("LightMode modified its input")
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
		if req.Messages > 0 && req2.Messages == 0 {
			t.Fatalf("all messages dropped: %s", out)
		}
	})
}

// FuzzStreamScanner: any input, split anywhere, gives the same result,
// whatever the line limit.
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
	})
}
