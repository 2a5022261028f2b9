package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

type testMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func messagesOf(t *testing.T, body []byte) []testMsg {
	t.Helper()
	var v struct{ Messages []testMsg }
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("output is not valid JSON: %v\n%s", err, body)
	}
	return v.Messages
}

func contentText(t *testing.T, m testMsg) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(m.Content, &s); err != nil {
		return string(m.Content)
	}
	return s
}

func roles(msgs []testMsg) string {
	var r []string
	for _, m := range msgs {
		r = append(r, m.Role)
	}
	return strings.Join(r, ",")
}

// topMembers returns the top-level members of body, in order.
func topMembers(body []byte) (keys []string, vals map[string]string) {
	vals = map[string]string{}
	var rs readers
	rs.members(body, func(k, v []byte) {
		keys = append(keys, string(k))
		vals[string(k)] = string(v)
	})
	return keys, vals
}

func chatBody(extra string, msgs ...string) string {
	return `{"model":"m",` + extra + `"messages":[` + strings.Join(msgs, ",\n ") + `],"user":"u1","seed":7}`
}

func msg(role, content string) string {
	return fmt.Sprintf(`{"role":%q,"content":%s}`, role, encodeString(content))
}

func para(n int) string {
	en, _ := testdataText()
	return longText(en, n)[:n]
}

// promptOf is the prompt LightMode's output is estimated at.
func promptOf(t *testing.T, kind Kind, body []byte, c Counter) int {
	t.Helper()
	path := map[Kind]string{KindChat: "/v1/chat/completions", KindAnthropicMessages: "/v1/messages"}[kind]
	req, err := Parse(path, body)
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, body)
	}
	return Estimate(req, c, 0).Prompt
}

func TestLightModeChatTrimming(t *testing.T) {
	c := mustCounter(t, CL100kBase)
	body := []byte(chatBody(`"temperature":0.5,"tools":[{"type":"function","function":{"name":"f"}}],`,
		msg("system", "You are terse."),
		msg("user", "first question "+para(600)),
		msg("assistant", "first answer "+para(600)),
		msg("developer", "Answer in English."),
		msg("user", "second question "+para(300)),
		msg("assistant", "second answer "+para(300)),
		msg("user", "third question"),
	))
	orig := bytes.Clone(body)
	full := promptOf(t, KindChat, body, c)

	// Every limit keeps the system prompts and the newest messages that
	// fit: as the limit grows, older messages come back one by one, each
	// exactly when the prompt with it reaches the limit.
	type result struct {
		roles  string
		prompt int
	}
	var results []result
	for limit := 1; limit <= full; limit++ {
		out, changed, err := LightMode(KindChat, body, limit, 0, c)
		if err != nil {
			t.Fatal(err)
		}
		if changed != (limit < full) {
			t.Fatalf("limit %d: changed=%v", limit, changed)
		}
		msgs := messagesOf(t, out)
		if contentText(t, msgs[len(msgs)-1]) != "third question" {
			t.Fatalf("limit %d: newest message not kept", limit)
		}
		r := result{roles(msgs), promptOf(t, KindChat, out, c)}
		if len(results) == 0 || results[len(results)-1].roles != r.roles {
			results = append(results, r)
			if r.prompt > limit && len(results) > 1 {
				t.Errorf("limit %d: prompt %d exceeds it", limit, r.prompt)
			}
			if len(results) > 1 && r.prompt != limit {
				t.Errorf("limit %d: %s appears later than its prompt %d", limit, r.roles, r.prompt)
			}
		}
		// Other members are kept verbatim and in order.
		keys, vals := topMembers(out)
		okeys, ovals := topMembers(body)
		if !reflect.DeepEqual(keys, okeys) {
			t.Fatalf("keys %v, want %v", keys, okeys)
		}
		for k, v := range ovals {
			if k != "messages" && vals[k] != v {
				t.Fatalf("member %s changed: %s", k, vals[k])
			}
		}
	}
	var got []string
	for _, r := range results {
		got = append(got, r.roles)
	}
	want := []string{
		"system,developer,user",
		"system,developer,assistant,user",
		"system,developer,user,assistant,user",
		"system,assistant,developer,user,assistant,user",
		"system,user,assistant,developer,user,assistant,user",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sequence of kept messages:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !bytes.Equal(body, orig) {
		t.Fatal("LightMode modified its input")
	}

	// Everything fits: the body comes back untouched.
	out, changed, err := LightMode(KindChat, body, full, 0, c)
	if err != nil || changed || &out[0] != &body[0] {
		t.Errorf("fitting body: changed=%v err=%v", changed, err)
	}
}

func TestLightModeToolGroups(t *testing.T) {
	c := mustCounter(t, CL100kBase)
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"search","arguments":"{\"q\":\"` + strings.Repeat("long query ", 40) + `\"}"}},{"id":"c2","type":"function","function":{"name":"search","arguments":"{}"}}]}`
	body := []byte(chatBody("",
		msg("system", "sys"),
		msg("user", "question"),
		call,
		`{"role":"tool","tool_call_id":"c1","content":"result one"}`,
		`{"role":"tool","tool_call_id":"c2","content":"result two"}`,
		msg("user", "and now?"),
	))
	full := promptOf(t, KindChat, body, c)
	seen := map[string]bool{}
	for limit := 1; limit <= full; limit++ {
		out, _, err := LightMode(KindChat, body, limit, 0, c)
		if err != nil {
			t.Fatal(err)
		}
		r := roles(messagesOf(t, out))
		seen[r] = true
		if strings.HasPrefix(strings.TrimPrefix(r, "system,"), "tool") {
			t.Fatalf("limit %d: tool result without its call: %s", limit, r)
		}
	}
	for _, want := range []string{"system,user", "system,assistant,tool,tool,user", "system,user,assistant,tool,tool,user"} {
		if !seen[want] {
			t.Errorf("no limit produced %s; got %v", want, seen)
		}
	}
}

func TestLightModeTruncatesNewest(t *testing.T) {
	c := mustCounter(t, CL100kBase)
	en, zh := testdataText()
	for name, text := range map[string]string{"english": en, "chinese": zh} {
		t.Run(name, func(t *testing.T) {
			body := []byte(chatBody("", msg("system", "Summarize."), msg("user", "older"), msg("user", text)))
			out, changed, err := LightMode(KindChat, body, 500, 0, c)
			if err != nil || !changed {
				t.Fatalf("changed=%v err=%v", changed, err)
			}
			msgs := messagesOf(t, out)
			if roles(msgs) != "system,user" {
				t.Fatalf("roles %s", roles(msgs))
			}
			got := contentText(t, msgs[1])
			head, tail, ok := strings.Cut(got, truncationMarker)
			if !ok || !strings.HasPrefix(text, head) || !strings.HasSuffix(text, tail) || len(head) < 100 || len(tail) < 100 {
				t.Fatalf("truncated text does not keep start and end:\n%.300q", got)
			}
			p := promptOf(t, KindChat, out, c)
			t.Logf("%d bytes -> %d bytes, prompt %d tokens (limit 500)", len(text), len(got), p)
			if p > 500 || p < 400 {
				t.Errorf("prompt %d, want close to and at most 500", p)
			}
		})
	}

	// Content parts: text parts shrink, the image stays.
	body := []byte(chatBody("", `{"role":"user","content":[{"type":"text","text":`+string(encodeString(para(20000)))+`},{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"What does the chart show?"}]}`))
	out, _, err := LightMode(KindChat, body, 300, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`{"type":"image_url","image_url":{"url":"https://x/y.png"}}`)) || !bytes.Contains(out, []byte(truncationMarker[1:4])) {
		t.Errorf("parts not truncated as expected: %.400s", out)
	}
	if p := promptOf(t, KindChat, out, c); p > 300 {
		t.Errorf("parts: prompt %d exceeds 300", p)
	}

	// System prompts alone exceed the limit: the newest message keeps a floor.
	body = []byte(chatBody("", msg("system", para(4000)), msg("user", para(4000))))
	out, _, _ = LightMode(KindChat, body, 100, 0, c)
	msgs := messagesOf(t, out)
	if roles(msgs) != "system,user" || c.Count(contentText(t, msgs[1])) > MinKeepTokens+5 || c.Count(contentText(t, msgs[1])) < MinKeepTokens/2 {
		t.Errorf("floor: %s, %d tokens", roles(msgs), c.Count(contentText(t, msgs[1])))
	}
}

func TestLightModeAnthropic(t *testing.T) {
	c := mustCounter(t, CL100kBase)
	toolUse := `{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t1","name":"lookup","input":{"q":"x"}}]}`
	toolResult := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + strings.Repeat("data ", 50) + `"}]}`
	mk := func(msgs ...string) []byte {
		return []byte(`{"model":"claude","max_tokens":1024,"system":[{"type":"text","text":"Be brief."}],"messages":[` + strings.Join(msgs, ",") + `],"metadata":{"user_id":"x"}}`)
	}

	// Trimming never leaves an assistant turn first, nor a result without its call.
	body := mk(msg("user", "q1 "+para(400)), msg("assistant", "a1"), msg("user", "q2"), toolUse, toolResult, msg("assistant", "answer "+para(200)), msg("user", "follow-up"))
	full := promptOf(t, KindAnthropicMessages, body, c)
	seen := map[string]bool{}
	for limit := 1; limit <= full; limit++ {
		out, _, err := LightMode(KindAnthropicMessages, body, limit, 0, c)
		if err != nil {
			t.Fatal(err)
		}
		msgs := messagesOf(t, out)
		r := roles(msgs)
		seen[r] = true
		if msgs[0].Role != "user" {
			t.Fatalf("limit %d: first message is %s", limit, msgs[0].Role)
		}
		if bytes.Contains(msgs[0].Content, []byte("tool_result")) {
			t.Fatalf("limit %d: tool_result without its tool_use", limit)
		}
		if !bytes.Contains(out, []byte(`"system":[{"type":"text","text":"Be brief."}]`)) {
			t.Fatalf("system prompt lost")
		}
	}
	for _, want := range []string{"user", "user,assistant,user,assistant,user", "user,assistant,user,assistant,user,assistant,user"} {
		if !seen[want] {
			t.Errorf("no limit produced %s; got %v", want, seen)
		}
	}

	// A trailing assistant prefill brings its user turn back, truncated.
	body = mk(msg("user", "Write a poem about "+para(3000)), msg("assistant", "Roses are"))
	out, _, _ := LightMode(KindAnthropicMessages, body, 60, 0, c)
	if msgs := messagesOf(t, out); roles(msgs) != "user,assistant" || contentText(t, msgs[1]) != "Roses are" {
		t.Errorf("prefill: %s", out)
	}

	// An oversized tool result is truncated inside its block; the call stays.
	big := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":` + string(encodeString(para(20000))) + `}]}]}`
	body = mk(msg("user", "q"), toolUse, big)
	out, _, err := LightMode(KindAnthropicMessages, body, 400, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	msgs := messagesOf(t, out)
	if roles(msgs) != "user,assistant,user" && roles(msgs) != "assistant,user" {
		t.Fatalf("tool result truncation: %s", roles(msgs))
	}
	if !bytes.Contains(out, []byte(`"tool_use_id":"t1"`)) || !bytes.Contains(out, []byte(`"name":"lookup"`)) || len(out) > 4000 {
		t.Errorf("tool result not truncated in place: %d bytes", len(out))
	}
}

func TestLightModeMaxTokens(t *testing.T) {
	c := mustCounter(t, Approx)
	tests := []struct {
		name      string
		kind      Kind
		body      string
		maxTokens int
		want      string // "" = unchanged
	}{
		{"lowers max_completion_tokens", KindChat, `{"messages":[],"max_completion_tokens":300}`, 100, `{"messages":[],"max_completion_tokens":100}`},
		{"lowers both", KindChat, `{"max_tokens":500,"messages":[],"max_completion_tokens":300}`, 100, `{"max_tokens":100,"messages":[],"max_completion_tokens":100}`},
		{"keeps lower", KindChat, `{"messages":[],"max_tokens":50}`, 100, ""},
		{"adds max_tokens", KindChat, `{"messages":[], "x":{"a":1}}`, 100, `{"messages":[],"x":{"a":1},"max_tokens":100}`},
		{"replaces null", KindChat, `{"max_tokens":null,"messages":[]}`, 100, `{"max_tokens":100,"messages":[]}`},
		{"anthropic", KindAnthropicMessages, `{"max_tokens":1024,"messages":[]}`, 256, `{"max_tokens":256,"messages":[]}`},
		{"anthropic ignores max_completion_tokens", KindAnthropicMessages, `{"max_tokens":10,"max_completion_tokens":1024,"messages":[]}`, 256, ""},
		{"completions untouched", KindCompletions, `{"prompt":"x","max_tokens":1000}`, 10, ""},
		{"responses untouched", KindResponses, `{"input":"x","max_output_tokens":1000}`, 10, ""},
		{"no limits", KindChat, `{"messages":[],"max_tokens":1000}`, 0, ""},
		{"escaped key", KindChat, `{"max\u005ftokens":500,"messages":[]}`, 100, `{"max\u005ftokens":100,"messages":[]}`},
		{"escaped key, lower", KindChat, `{"messages":[],"max\u005ftokens":50}`, 100, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			out, changed, err := LightMode(tt.kind, body, 0, tt.maxTokens, c)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if changed || !bytes.Equal(out, body) {
					t.Errorf("changed: %s", out)
				}
				return
			}
			if !changed || string(out) != tt.want {
				t.Errorf("LightMode =\n %s\nwant\n %s", out, tt.want)
			}
		})
	}
}

func TestLightModeErrors(t *testing.T) {
	c := mustCounter(t, Approx)
	for _, body := range []string{``, `{"messages":`, `[1]`, `{"messages":{}}`, `{"messages":[1]}`, `{"max_tokens":"x","messages":[]}`,
		// Duplicates, which the upstream would read differently.
		`{"max_tokens":1,"max_tokens":500,"messages":[]}`,
		`{"max_tokens":1,"max\u005ftokens":500,"messages":[]}`,
		`{"messages":[{"role":"user","content":"a","cont\u0065nt":"b"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a","te\u0078t":"b"}]}]}`,
		// Nesting beyond MaxDepth.
		`{"messages":[{"role":"user","content":"a","x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}]}`,
	} {
		_, _, err := LightMode(KindChat, []byte(body), 10, 10, c)
		var be *BodyError
		if !errors.As(err, &be) {
			t.Errorf("%q: err = %v, want *BodyError", body, err)
		}
	}
}

// callCounter counts the calls to its inner counter.
type callCounter struct {
	Counter
	calls *int
}

func (c callCounter) Count(s string) int { *c.calls++; return c.Counter.Count(s) }

// A body of many small parts or messages costs LightMode a bounded number
// of tokenizer calls, not one per part: each part is within the counter's
// budget, but together they would cost a call each.
func TestLightModeBoundsTokenizerCalls(t *testing.T) {
	var parts, msgs []string
	for i := range 20000 {
		parts = append(parts, fmt.Sprintf(`{"type":"text","text":"w%d"}`, i))
		msgs = append(msgs, msg("system", fmt.Sprint("s", i)))
	}
	for _, tc := range []struct {
		name string
		kind Kind
		body string
	}{
		{"parts", KindAnthropicMessages, `{"max_tokens":100,"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`},
		{"system messages", KindChat, chatBody("", append(msgs, msg("user", para(20000)))...)},
	} {
		calls := 0
		const exact = 4096
		c := &boundedCounter{inner: callCounter{mustCounter(t, CL100kBase), &calls}, exactBytes: exact}
		// Parts of a few bytes cannot be cut (the marker is longer), so
		// the parts body may come back as it was.
		out, changed, err := LightMode(tc.kind, []byte(tc.body), 2000, 0, c)
		if err != nil || !changed && tc.kind == KindChat {
			t.Fatalf("%s: changed %v, %v", tc.name, changed, err)
		}
		t.Logf("%s: %d bytes to %d, %d tokenizer calls", tc.name, len(tc.body), len(out), calls)
		if limit := lightModeBudget * exact / minCallBytes * 2; calls > limit {
			t.Errorf("%s: %d tokenizer calls, want at most %d", tc.name, calls, limit)
		}
		if len(out) > len(tc.body) {
			t.Errorf("%s: LightMode grew the body from %d to %d bytes", tc.name, len(tc.body), len(out))
		}
	}
}
