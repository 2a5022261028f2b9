package llmapi

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// parseFast answers for a body only with what parseSlow, the reference
// path it stands in for, would return: the same Request to the last
// counted text, or the same error.

// sameParse checks parseFast and parseWith against parseSlow on one
// body, and returns whether parseFast answered.
func sameParse(t *testing.T, path string, body []byte) bool {
	t.Helper()
	var want, got, via Request
	var ws, gs scan
	wantErr := parseSlow(&ws, nil, &want, path, body)
	done, gotErr := parseFast(&gs, nil, &got, path, body)
	viaErr := parseWith(&scan{}, nil, &via, path, body)
	if !sameError(viaErr, wantErr) || !sameRequest(&via, &want) {
		t.Fatalf("%s %q:\nParse  %v %s\nslow   %v %s", path, body, viaErr, dumpRequest(&via), wantErr, dumpRequest(&want))
	}
	if !done {
		return false
	}
	if !sameError(gotErr, wantErr) || !sameRequest(&got, &want) {
		t.Fatalf("%s %q:\nfast %v %s\nslow %v %s", path, body, gotErr, dumpRequest(&got), wantErr, dumpRequest(&want))
	}
	if gs.n > stepBudget(len(body), 8) {
		t.Fatalf("%s %q: parseFast visited %d bytes of %d", path, body, gs.n, len(body))
	}
	return true
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y *BodyError
	if !errors.As(a, &x) || !errors.As(b, &y) {
		return false
	}
	return x.Field == y.Field && x.Msg == y.Msg && x.Offset == y.Offset &&
		(x.Err == nil) == (y.Err == nil) && (x.Err == nil || x.Err.Error() == y.Err.Error())
}

// sameRequest compares every field, and the kept texts as far as they
// count (a speculative walk leaves stale entries beyond nTexts); a text
// parseFast knows to be plain must be.
func sameRequest(a, b *Request) bool {
	x, y := *a, *b
	n := min(x.nTexts, len(x.texts))
	for i, t := range x.texts[:n] {
		u := y.texts[i]
		if string(t.raw) != string(u.raw) || &t.raw[0] != &u.raw[0] || t.compact != u.compact ||
			(t.plain || u.plain) && bytes.IndexByte(t.raw, '\\') >= 0 {
			return false
		}
	}
	x.texts, y.texts = [inlineTexts]textRef{}, [inlineTexts]textRef{}
	return reflect.DeepEqual(x, y)
}

func dumpRequest(r *Request) string {
	var texts []string
	for _, t := range r.texts[:min(r.nTexts, len(r.texts))] {
		texts = append(texts, string(t.raw))
	}
	return fmt.Sprintf("%+v texts %q", *r, texts)
}

// fastSeeds adds to fuzzSeeds the shapes parseFast interprets itself and
// the ones it must leave to the walker.
func fastSeeds() []string {
	return append(fuzzSeeds(), smallChatBody, chatToolsBody, chatPartsBody, anthropicBody,
		`{"messages":[{"role":"user","content":"a"}],"system":"s","max_tokens":3}`,
		`{"system":[{"type":"text","text":"s"}],"messages":[{"content":[{"content":"x","type":"tool_result"},{"type":"image"}],"role":"user"}]}`,
		`{"messages":[{"name":"n","content":"c","tool_calls":[{"function":{"arguments":{"a":1},"name":"f"}},{"x":1},null,3],"function_call":{"name":"g","arguments":"{}"}}]}`,
		`{"messages":[{"role":"user","content":"a","content":"b"}]}`,
		`{"messages":[{"role":1,"content":"a"}]}`,
		`{"messages":[{"ro\u006ce":"user","content":"a"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		`{"messages":[{"role":"user","content":[{"content":5,"type":"text","text":"t"}]}]}`,
		`{"messages":[{"role":"user","content":[{"content":5,"type":"tool_result"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"tool\u005fresult","content":"x"}]}]}`,
		`{"messages":null,"system":null}`, `{"messages":{},"system":3}`, `{"messages":[1]}`,
		`{"model":"m","messages":[],"stream_options":{"include_usage":true}}`,
		`{"model":"m","input":[{"role":"user","content":"a"}],"instructions":"i"}`,
		deepPart(MaxDepth), deepPart(MaxDepth+1), string(nestedToolResults((MaxDepth-3)/2+1, 4, true)),
		` {"model" : "m" , "messages" : [ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "a" } ] } ] } `,
	)
}

// deepPart is a chat body whose one content part holds arrays nested to
// depth d in all.
func deepPart(d int) string {
	const above = 5 // the body, messages, a message, its content, a part
	return `{"messages":[{"content":[{"type":"text","text":"a","x":` + strings.Repeat("[", d-above) + strings.Repeat("]", d-above) + `}]}]}`
}

func FuzzFastParse(f *testing.F) {
	for _, s := range fastSeeds() {
		for i := range fuzzPaths {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, pathIdx uint8, body []byte) {
		sameParse(t, fuzzPaths[int(pathIdx)%len(fuzzPaths)], body)
	})
}

var fastParseRounds = flag.Int("fastparse.rounds", 3000, "random bodies TestFastParseMatchesSlow generates, each also mutated")

// TestFastParseMatchesSlow: on random request-shaped bodies, and on each
// of them mutated (the near misses where a validator or a key match errs),
// parseFast agrees with parseSlow; and it answers for the bodies the
// gateway meets.
func TestFastParseMatchesSlow(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", smallChatBody}, {"/v1/chat/completions", chatToolsBody},
		{"/v1/chat/completions", chatPartsBody}, {"/v1/messages", anthropicBody},
		{"/v1/chat/completions", bigChatBody(2000)}, {"/v1/responses", responsesBody},
		{"/v1/completions", completionsBody}, {"/v1/embeddings", embeddingsBody},
	} {
		if !sameParse(t, tc.path, []byte(tc.body)) {
			t.Errorf("parseFast left %s %.60q to parseSlow", tc.path, tc.body)
		}
	}
	for _, s := range fastSeeds() {
		for _, p := range fuzzPaths {
			sameParse(t, p, []byte(s))
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	special := []byte("{}[],:\"\\/ \t\n0123456789-.etrufalsnu\x00\x1f\xff")
	answered := 0
	for n := 0; n < *fastParseRounds; n++ {
		var sb strings.Builder
		randomRequest(rng, &sb)
		doc := []byte(sb.String())
		path := fuzzPaths[rng.IntN(len(fuzzPaths))]
		if sameParse(t, path, doc) {
			answered++
		}
		for m := 0; m < 8; m++ {
			b := append([]byte(nil), doc...)
			for k := 1 + rng.IntN(2); k > 0; k-- {
				p := rng.IntN(len(b) + 1)
				c := special[rng.IntN(len(special))]
				switch rng.IntN(3) {
				case 0:
					if p < len(b) {
						b[p] = c
					}
				case 1:
					b = append(b[:p], append([]byte{c}, b[p:]...)...)
				case 2:
					if p < len(b) {
						b = append(b[:p], b[p+1:]...)
					}
				}
			}
			sameParse(t, path, b)
		}
	}
	t.Logf("parseFast answered for %d of %d random bodies", answered, *fastParseRounds)
}

// randomRequest writes a random body of the shapes the APIs use, with
// the oddities a client may send: members in any order, nulls, values of
// the wrong type, duplicates, escaped keys, nested tool results, white
// space.
func randomRequest(rng *rand.Rand, sb *strings.Builder) {
	ws := func() {
		if rng.IntN(6) == 0 {
			sb.WriteString([]string{" ", "\n", "\t ", "\r\n"}[rng.IntN(4)])
		}
	}
	key := func(k string) {
		ws()
		switch rng.IntN(100) {
		case 0:
			k = strings.Replace(k, "e", `\u0065`, 1)
		case 1:
			k += "x"
		}
		sb.WriteString(`"` + k + `"`)
		ws()
		sb.WriteByte(':')
		ws()
	}
	str := func() {
		sb.WriteString([]string{`"hi"`, `""`, `"a \"q\" \\ \n é"`, `"text"`, `"tool_result"`, `"\u00e9\ud83d\ude00"`, `"x"`}[rng.IntN(7)])
	}
	var value func(d int)
	value = func(d int) {
		ws()
		switch k := rng.IntN(10); {
		case k == 0:
			sb.WriteString("null")
		case k == 1:
			sb.WriteString([]string{"1", "0", "-2.5e3", "true", "false", "128", "1e400"}[rng.IntN(7)])
		case k == 2 && d > 0:
			sb.WriteByte('[')
			for n := rng.IntN(3); n > 0; n-- {
				value(d - 1)
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		case k == 3 && d > 0:
			sb.WriteByte('{')
			for n := rng.IntN(3); n > 0; n-- {
				key([]string{"a", "type", "text", "name"}[rng.IntN(4)])
				value(d - 1)
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte('}')
		default:
			str()
		}
		ws()
	}
	// members writes an object of members chosen from names, each written
	// by its function, some twice, some left out.
	type member struct {
		name  string
		write func()
	}
	object := func(ms []member) {
		sb.WriteByte('{')
		rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		first := true
		for _, m := range ms {
			n := 1
			switch rng.IntN(25) {
			case 0:
				n = 2
			case 1, 2, 3, 4, 5, 6:
				n = 0
			}
			for ; n > 0; n-- {
				if !first {
					sb.WriteByte(',')
				}
				first = false
				key(m.name)
				m.write()
			}
		}
		ws()
		sb.WriteByte('}')
	}
	var content func(d int)
	part := func(d int) {
		typ := []string{`"text"`, `"image_url"`, `"tool_result"`, `"tool_use"`, `"thinking"`, `"refusal"`, `"input_text"`, `"document"`, `null`, `3`, `"tool\u005fresult"`}[rng.IntN(11)]
		object([]member{
			{"type", func() { sb.WriteString(typ) }},
			{"text", func() { value(1) }},
			{"content", func() {
				if rng.IntN(3) == 0 {
					value(1)
				} else {
					content(d - 1)
				}
			}},
			{"name", str}, {"input", func() { value(2) }}, {"thinking", str}, {"refusal", str},
			{"cache_control", func() { value(2) }},
		})
	}
	content = func(d int) {
		switch k := rng.IntN(6); {
		case k == 0:
			sb.WriteString("null")
		case k == 1:
			value(1)
		case k <= 3 || d <= 0:
			str()
		default:
			sb.WriteByte('[')
			for n := rng.IntN(4); n > 0; n-- {
				ws()
				if rng.IntN(12) == 0 {
					value(1)
				} else {
					part(d)
				}
				ws()
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		}
	}
	function := func() {
		if rng.IntN(6) == 0 {
			value(1)
			return
		}
		object([]member{{"name", func() { value(0) }}, {"arguments", func() { value(2) }}})
	}
	message := func() {
		if rng.IntN(20) == 0 {
			value(1)
			return
		}
		object([]member{
			{"role", func() {
				if rng.IntN(10) == 0 {
					value(1)
				} else {
					str()
				}
			}},
			{"content", func() { content(3) }},
			{"name", func() { value(0) }},
			{"tool_calls", func() {
				if rng.IntN(5) == 0 {
					value(1)
					return
				}
				sb.WriteByte('[')
				for n := rng.IntN(3); n > 0; n-- {
					if rng.IntN(4) == 0 {
						value(1)
					} else {
						object([]member{{"id", str}, {"function", function}, {"type", str}})
					}
					if n > 1 {
						sb.WriteByte(',')
					}
				}
				sb.WriteByte(']')
			}},
			{"function_call", function},
			{"tool_call_id", str},
		})
	}
	object([]member{
		{"model", func() { value(0) }},
		{"messages", func() {
			if rng.IntN(10) == 0 {
				value(1)
				return
			}
			sb.WriteByte('[')
			for n := rng.IntN(4); n > 0; n-- {
				ws()
				message()
				ws()
				if n > 1 {
					sb.WriteByte(',')
				}
			}
			sb.WriteByte(']')
		}},
		{"system", func() { content(2) }},
		{"max_tokens", func() { value(0) }},
		{"stream", func() { value(0) }},
		{"stream_options", func() { value(1) }},
		{"tools", func() { value(2) }},
		{"input", func() { content(2) }},
		{"prompt", func() { value(2) }},
		{"n", func() { value(0) }},
		{"temperature", func() { value(0) }},
		{"metadata", func() { value(3) }},
	})
}
