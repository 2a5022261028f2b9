package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Anthropic's Messages API (POST /v1/messages), as the official clients
// use it: a message with text or tool_use content blocks, and the
// event stream message_start, content_block_start, ping,
// content_block_delta..., content_block_stop, message_delta (the stop
// reason and the output tokens), message_stop. Errors are Anthropic's
// {"type":"error","error":{"type","message"}}.
//
// Generation is the fake's usual one: max_tokens output tokens with
// ignore_eos (a field of the fake's, as for OpenAI), else DefaultOutput.
// A request with tools, whose last message carries no tool_result, is
// answered by a call to a tool (tool_choice's, else the first), whose
// input is {"query": the generated tokens}; one with a tool_result is
// answered in text, so a tool loop ends.

// messagesRequest is the part of an Anthropic request the fake reads.
type messagesRequest struct {
	Model     string            `json:"model"`
	System    json.RawMessage   `json:"system"`
	Messages  []json.RawMessage `json:"messages"`
	MaxTokens *int              `json:"max_tokens"`
	Stream    bool              `json:"stream"`
	Tools     []struct {
		Name string `json:"name"`
	} `json:"tools"`
	ToolChoice *struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tool_choice"`
	IgnoreEOS bool `json:"ignore_eos"`
}

// anthropicMessage is one entry of messages.
type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parseMessages reads a request of Anthropic's /v1/messages.
func parseMessages(_ api, body []byte) (spec, error) {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return spec{}, fmt.Errorf("invalid JSON body: %v", err)
	}
	if req.MaxTokens == nil {
		return spec{}, errors.New("max_tokens: Field required")
	}
	if len(req.Messages) == 0 {
		return spec{}, errors.New("messages: at least one message is required")
	}
	prompt, err := countText(req.System, true)
	if err != nil {
		return spec{}, fmt.Errorf("system: %v", err)
	}
	var last anthropicMessage
	for i, raw := range req.Messages {
		if err := json.Unmarshal(raw, &last); err != nil {
			return spec{}, fmt.Errorf("messages[%d]: %v", i, err)
		}
		n, err := countText(last.Content, true)
		if err != nil {
			return spec{}, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		prompt += n
	}
	sp := spec{model: req.Model, prompt: prompt, limit: req.MaxTokens,
		ignoreEOS: req.IgnoreEOS, stream: req.Stream}
	if len(req.Tools) > 0 && !hasToolResult(last.Content) {
		sp.tool = req.Tools[0].Name
		if tc := req.ToolChoice; tc != nil {
			switch tc.Type {
			case "none":
				sp.tool = ""
			case "tool":
				sp.tool = tc.Name
			}
		}
	}
	return sp, nil
}

// hasToolResult reports whether content holds a tool_result block.
func hasToolResult(raw json.RawMessage) bool {
	var blocks []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return false
	}
	for _, b := range blocks {
		if b.Type == "tool_result" {
			return true
		}
	}
	return false
}

// stopReason is Anthropic's name for why generation stopped.
func (g generation) stopReason() string {
	switch {
	case g.tool != "":
		return "tool_use"
	case g.finishReason == "length":
		return "max_tokens"
	default:
		return "end_turn"
	}
}

// respondMessage spends the whole generation time, then writes the message:
// a text block of the tokens, or a tool call whose input is
// {"query": the tokens}.
func (s *Server) respondMessage(ctx context.Context, w http.ResponseWriter, g generation) error {
	text, err := s.generateAll(ctx, g)
	if err != nil {
		return err
	}
	block := map[string]any{"type": "text", "text": text}
	if g.tool != "" {
		block = map[string]any{"type": "tool_use", "id": "toolu_" + g.id, "name": g.tool, "input": map[string]string{"query": text}}
	}
	var usage any = map[string]int{"input_tokens": g.usage.PromptTokens, "output_tokens": g.usage.CompletionTokens}
	if g.garbageUsage {
		usage = map[string]any{"input_tokens": "many", "output_tokens": -7}
	}
	return writeJSON(w, http.StatusOK, map[string]any{
		"id": "msg_" + g.id, "type": "message", "role": "assistant", "model": g.model,
		"content": []any{block}, "stop_reason": g.stopReason(), "stop_sequence": nil,
		"usage": usage,
	})
}

// streamMessage writes Anthropic's event stream: one content block, text
// (a text_delta per token) or a tool call (its input as input_json_delta
// pieces, one per token), flushed event by event. The output tokens come
// in message_delta, the prompt's in message_start (with output_tokens 1,
// as Anthropic reports it there).
func (s *Server) streamMessage(ctx context.Context, w http.ResponseWriter, g generation) error {
	out := startEvents(ctx, w)
	startUsage := map[string]any{"input_tokens": g.usage.PromptTokens, "output_tokens": 1}
	endUsage := map[string]any{"output_tokens": g.usage.CompletionTokens}
	if g.garbageUsage {
		startUsage = map[string]any{"input_tokens": "many", "output_tokens": -7}
		endUsage = map[string]any{"output_tokens": "lots"}
	}
	block := map[string]any{"type": "text", "text": ""}
	if g.tool != "" {
		block = map[string]any{"type": "tool_use", "id": "toolu_" + g.id, "name": g.tool, "input": map[string]any{}}
	}
	head := []map[string]any{
		{"type": "message_start", "message": map[string]any{"id": "msg_" + g.id, "type": "message", "role": "assistant",
			"model": g.model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": startUsage}},
		{"type": "content_block_start", "index": 0, "content_block": block},
		{"type": "ping"},
	}
	tail := []map[string]any{
		{"type": "content_block_stop", "index": 0},
		{"type": "message_delta", "delta": map[string]any{"stop_reason": g.stopReason(), "stop_sequence": nil}, "usage": endUsage},
		{"type": "message_stop"},
	}
	if g.tool != "" {
		// The tool's input, {"query": the tokens}, opens before them and
		// closes after.
		head = append(head, g.blockDelta(`{"query": "`))
		tail = append([]map[string]any{g.blockDelta(`"}`)}, tail...)
	}
	send := func(evs ...map[string]any) error {
		for _, ev := range evs {
			if err := out.json(ev["type"].(string), ev); err != nil {
				return err
			}
		}
		return nil
	}
	if err := send(head...); err != nil {
		return err
	}
	if err := s.eachToken(ctx, g, func(int) error { return send(g.blockDelta(outputToken)) }); err != nil {
		return err
	}
	g.generated()
	return send(tail...)
}

// blockDelta is the content_block_delta event of one piece of the block:
// text, or the tool's input JSON.
func (g generation) blockDelta(piece string) map[string]any {
	delta := map[string]any{"type": "text_delta", "text": piece}
	if g.tool != "" {
		delta = map[string]any{"type": "input_json_delta", "partial_json": piece}
	}
	return map[string]any{"type": "content_block_delta", "index": 0, "delta": delta}
}
