package llmapi

import (
	"os"
	"strings"
	"sync"
	"testing"
)

// Realistic request bodies shared by the tests, fuzz seeds and benchmarks.

const chatToolsBody = `{
  "model": "gpt-4o-mini",
  "messages": [
    {"role": "system", "content": "You are a support assistant for an online bookshop. Answer briefly."},
    {"role": "user", "content": "Where is my order #4411?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"4411\"}"}}
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"shipped\",\"carrier\":\"DHL\",\"eta\":\"2024-06-03\"}"},
    {"role": "assistant", "content": "Your order shipped with DHL and should arrive on 3 June."},
    {"role": "user", "name": "dana", "content": "Great, and can I still add a book to it?"}
  ],
  "tools": [
    {"type": "function", "function": {"name": "lookup_order", "description": "Look up an order by its ID.",
      "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}
  ],
  "tool_choice": "auto",
  "temperature": 0.2,
  "max_completion_tokens": 300,
  "stream": true,
  "stream_options": {"include_usage": true},
  "x_vendor_extension": {"keep": ["me", 1, true]}
}`

const chatPartsBody = `{"model":"gpt-4o","messages":[
 {"role":"developer","content":[{"type":"text","text":"Describe images for a blind reader."}]},
 {"role":"user","content":[
   {"type":"text","text":"What is in this picture?"},
   {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},
   {"type":"input_text","text":"Be concise."}
 ]}],
 "max_tokens":120}`

const anthropicBody = `{
  "model": "claude-sonnet-4-5",
  "max_tokens": 1024,
  "system": [
    {"type": "text", "text": "You are a careful code reviewer."},
    {"type": "text", "text": "Only comment on correctness.", "cache_control": {"type": "ephemeral"}}
  ],
  "messages": [
    {"role": "user", "content": "Review: func add(a, b int) int { return a - b }"},
    {"role": "assistant", "content": [
      {"type": "text", "text": "Let me run the tests."},
      {"type": "tool_use", "id": "toolu_1", "name": "run_tests", "input": {"package": "./math"}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_1", "content": "--- FAIL: TestAdd: add(1, 2) = -1, want 3"},
      {"type": "text", "text": "What do you conclude?"}
    ]}
  ],
  "tools": [{"name": "run_tests", "description": "Run go test", "input_schema": {"type": "object", "properties": {"package": {"type": "string"}}}}],
  "stream": true,
  "metadata": {"user_id": "u-42"}
}`

const completionsBody = `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7,"temperature":0}`
const completionsListBody = `{"model":"m","prompt":["hello world","second prompt"],"max_tokens":16}`
const completionsIDsBody = `{"model":"m","prompt":[15339,1917,0,1],"max_tokens":5}`
const completionsIDsNestedBody = `{"model":"m","prompt":[[15339,1917],[1,2,3]]}`

const embeddingsBody = `{"model":"text-embedding-3-small","input":"The food was delicious and the waiter was friendly.","encoding_format":"float"}`
const embeddingsListBody = `{"model":"text-embedding-3-small","input":["hello world","goodbye world"]}`
const embeddingsIDsBody = `{"model":"text-embedding-3-small","input":[[1,2,3],[4,5]]}`

const responsesBody = `{
  "model": "gpt-4.1",
  "instructions": "Talk like a pirate.",
  "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "Are semicolons optional in JavaScript?"},
                                 {"type": "input_image", "image_url": "https://example.com/a.png"}]},
    {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{\"q\":\"asi\"}"},
    {"type": "function_call_output", "call_id": "c1", "output": "Automatic semicolon insertion exists."}
  ],
  "tools": [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}],
  "max_output_tokens": 500,
  "stream": true
}`
const responsesStringBody = `{"model":"gpt-4.1","input":"Tell me a three sentence bedtime story about a unicorn."}`

var testdataText = sync.OnceValues(func() (string, string) {
	en, err := os.ReadFile("testdata/en.md")
	if err != nil {
		panic(err)
	}
	zh, err := os.ReadFile("testdata/zh.txt")
	if err != nil {
		panic(err)
	}
	return string(en), string(zh)
})

// longText returns about n bytes of paragraphs from src, reshuffled
// deterministically so that a long text is not one passage repeated.
func longText(src string, n int) string {
	paras := strings.Split(src, "\n\n")
	var b strings.Builder
	x := uint32(2463534242)
	for b.Len() < n {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b.WriteString(paras[int(x%uint32(len(paras)))])
		b.WriteString("\n\n")
	}
	return b.String()
}

func mustCounter(tb testing.TB, name string) Counter {
	tb.Helper()
	c, err := NewCounter(name)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Texts returns the prompt text, one entry per separately tokenized string
// (message contents, names, tool calls, tool definitions), decoded from
// the body.
func (r *Request) Texts() []string {
	var sc scratch
	return textStrings(nil, r.gatherTexts(&sc, 1))
}
