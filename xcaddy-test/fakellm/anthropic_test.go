package main

import (
	"bufio"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
)

// message is the part of an Anthropic message the tests read.
type message struct {
	Type       string `json:"type"`
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type  string            `json:"type"`
		Text  string            `json:"text"`
		Name  string            `json:"name"`
		ID    string            `json:"id"`
		Input map[string]string `json:"input"`
	} `json:"content"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

const weatherTool = `"tools":[{"name":"weather","description":"the weather","input_schema":{"type":"object"}}]`

func TestMessagesText(t *testing.T) {
	f := start(t, instant())
	status, body := f.do(http.MethodPost, "/v1/messages",
		`{"model":"claude","system":"be brief","max_tokens":5,"ignore_eos":true,`+
			`"messages":[{"role":"user","content":"one two"},{"role":"assistant","content":[{"type":"text","text":"three"}]},`+
			`{"role":"user","content":[{"type":"text","text":"four five six"}]}]}`, "X-Test-Id", "m")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var m message
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || m.StopReason != "max_tokens" || len(m.Content) != 1 || m.Content[0].Type != "text" ||
		m.Content[0].Text != strings.Repeat(outputToken, 5) || m.Usage.InputTokens != 8 || m.Usage.OutputTokens != 5 {
		t.Errorf("message %s; want 5 tokens of text, stop max_tokens, usage 8 in (system and every message) / 5 out", body)
	}
	if r := f.record("m"); r.PromptTokens != 8 || r.OutputTokens != 5 || r.Path != "/v1/messages" {
		t.Errorf("record %+v", r)
	}
}

func TestMessagesToolUse(t *testing.T) {
	f := start(t, instant())
	status, body := f.do(http.MethodPost, "/v1/messages",
		`{"model":"claude","max_tokens":3,"ignore_eos":true,`+weatherTool+`,"messages":[{"role":"user","content":"rain?"}]}`)
	var m message
	if err := json.Unmarshal([]byte(body), &m); err != nil || status != http.StatusOK {
		t.Fatalf("status %d: %s (%v)", status, body, err)
	}
	if m.StopReason != "tool_use" || len(m.Content) != 1 || m.Content[0].Type != "tool_use" || m.Content[0].Name != "weather" ||
		m.Content[0].ID == "" || m.Content[0].Input["query"] != strings.Repeat(outputToken, 3) || m.Usage.OutputTokens != 3 {
		t.Errorf("message %s; want a call of weather with 3 tokens of input", body)
	}
	// The tool's result is answered in text: the loop ends.
	status, body = f.do(http.MethodPost, "/v1/messages",
		`{"model":"claude","max_tokens":3,"ignore_eos":true,`+weatherTool+`,"messages":[{"role":"user","content":"rain?"},`+
			`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"weather","input":{}}]},`+
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"light rain"}]}]}`)
	m = message{}
	if err := json.Unmarshal([]byte(body), &m); err != nil || status != http.StatusOK {
		t.Fatalf("status %d: %s (%v)", status, body, err)
	}
	if m.StopReason != "max_tokens" || len(m.Content) != 1 || m.Content[0].Type != "text" || m.Usage.InputTokens != 3 {
		t.Errorf("after the tool result: %s; want text, 3 input tokens (the question and the result)", body)
	}
}

// anthropicEvent is one event of an Anthropic stream: its name and data.
type anthropicEvent struct {
	name string
	data map[string]json.RawMessage
}

func readAnthropicStream(t *testing.T, resp *http.Response) []anthropicEvent {
	t.Helper()
	var out []anthropicEvent
	sc := bufio.NewScanner(resp.Body)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]json.RawMessage
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("event %s: %v", name, err)
			}
			if typ := strings.Trim(string(d["type"]), `"`); typ != name {
				t.Errorf("event %q carries type %q", name, typ)
			}
			out = append(out, anthropicEvent{name: name, data: d})
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

func TestMessagesStream(t *testing.T) {
	for _, tc := range []struct {
		name, tools, delta string
	}{
		{"text", "", `{"type":"text_delta","text":"tok "}`},
		{"tool", weatherTool + ",", `{"type":"input_json_delta","partial_json":"tok "}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, instant())
			resp, err := f.post(context.Background(), "/v1/messages",
				`{"model":"claude","max_tokens":4,"ignore_eos":true,"stream":true,`+tc.tools+`"messages":[{"role":"user","content":"one two three"}]}`)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("content type %q", ct)
			}
			events := readAnthropicStream(t, resp)
			var names []string
			tokens, partial := 0, ""
			for _, e := range events {
				names = append(names, e.name)
				if e.name == "content_block_delta" {
					var d, want map[string]string
					json.Unmarshal(e.data["delta"], &d)
					json.Unmarshal([]byte(tc.delta), &want)
					if maps.Equal(d, want) {
						tokens++
					}
					partial += d["partial_json"]
				}
			}
			want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
			if tc.tools != "" {
				want = strings.Replace(want, "ping ", "ping content_block_delta ", 1)
				want = strings.Replace(want, " content_block_stop", " content_block_delta content_block_stop", 1)
			}
			if got := strings.Join(names, " "); got != want {
				t.Errorf("events\n %s\nwant\n %s", got, want)
			}
			if tokens != 4 {
				t.Errorf("%d token deltas, want 4", tokens)
			}
			var start struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			}
			json.Unmarshal(events[0].data["message"], &start)
			var end struct {
				OutputTokens int `json:"output_tokens"`
			}
			json.Unmarshal(events[len(events)-2].data["usage"], &end)
			if start.Usage.InputTokens != 3 || end.OutputTokens != 4 {
				t.Errorf("usage: %d in at message_start, %d out at message_delta; want 3 and 4", start.Usage.InputTokens, end.OutputTokens)
			}
			if tc.tools != "" {
				var in map[string]string
				if err := json.Unmarshal([]byte(partial), &in); err != nil || in["query"] != strings.Repeat(outputToken, 4) {
					t.Errorf("tool input pieces join to %q (%v)", partial, err)
				}
			}
		})
	}
}

func TestMessagesErrorsInAnthropicShape(t *testing.T) {
	cfg := instant()
	cfg.RPM = 1
	f := start(t, cfg)
	for _, tc := range []struct {
		body   string
		status int
		typ    string
	}{
		{`{"model":"claude","messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "invalid_request_error"},
		{`{"model":"claude","max_tokens":4,"messages":[]}`, http.StatusBadRequest, "invalid_request_error"},
		{`{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":5}]}`, http.StatusBadRequest, "invalid_request_error"},
		{`{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, http.StatusOK, ""},
		{`{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, http.StatusTooManyRequests, "rate_limit_error"},
	} {
		status, body := f.do(http.MethodPost, "/v1/messages", tc.body)
		if status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.body, status, tc.status, body)
			continue
		}
		if tc.typ == "" {
			continue
		}
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" {
			t.Errorf("%s: body %s; want Anthropic's error shape of type %s", tc.body, body, tc.typ)
		}
	}
}
