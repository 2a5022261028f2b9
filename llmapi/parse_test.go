package llmapi

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestKindFromPath(t *testing.T) {
	for path, want := range map[string]Kind{
		"/v1/chat/completions":                      KindChat,
		"/openai/deployments/x/chat/completions/":   KindChat,
		"/v1/chat/completions?api-version=2024-1-1": KindChat,
		"/v1/completions":                           KindCompletions,
		"/v1/responses":                             KindResponses,
		"/v1/embeddings":                            KindEmbeddings,
		"/v1/messages":                              KindAnthropicMessages,
		"/anthropic/v1/messages":                    KindAnthropicMessages,
		"/v1/models":                                KindUnknown,
		"/":                                         KindUnknown,
		"":                                          KindUnknown,
	} {
		if got := KindFromPath(path); got != want {
			t.Errorf("KindFromPath(%q) = %v, want %v", path, got, want)
		}
	}
	if KindAnthropicMessages.String() != "anthropic_messages" || Kind(99).String() != "unknown" {
		t.Error("Kind.String")
	}
}

// parsed is what a Request exposes, with its texts decoded.
type parsed struct {
	Kind                    Kind
	Inferred                bool
	Model                   string
	Stream, IncludeUsage    bool
	MaxOutput, Choices      int
	Texts                   []string
	Messages, Names, Images int
	TokenIDs                int
}

func parsedOf(r *Request) parsed {
	return parsed{Kind: r.Kind, Inferred: r.Inferred, Model: r.Model, Stream: r.Stream, IncludeUsage: r.IncludeUsage,
		MaxOutput: r.MaxOutput, Choices: r.Choices, Texts: r.Texts(),
		Messages: r.Messages, Names: r.Names, Images: r.Images, TokenIDs: r.TokenIDs}
}

func TestParse(t *testing.T) {
	toolsJSON := `[{"type":"function","function":{"name":"lookup_order","description":"Look up an order by its ID.","parameters":{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}}}]`
	tests := []struct {
		name, path, body string
		want             parsed
	}{
		{"chat with tools", "/v1/chat/completions", chatToolsBody, parsed{
			Kind: KindChat, Model: "gpt-4o-mini", Stream: true, IncludeUsage: true, MaxOutput: 300,
			Texts: []string{
				"You are a support assistant for an online bookshop. Answer briefly.",
				"Where is my order #4411?",
				"lookup_order", `{"order_id":"4411"}`,
				`{"status":"shipped","carrier":"DHL","eta":"2024-06-03"}`,
				"Your order shipped with DHL and should arrive on 3 June.",
				"Great, and can I still add a book to it?", "dana",
				toolsJSON,
			},
			Messages: 6, Names: 1,
		}},
		{"chat content parts", "/v1/chat/completions", chatPartsBody, parsed{
			Kind: KindChat, Model: "gpt-4o", MaxOutput: 120,
			Texts:    []string{"Describe images for a blind reader.", "What is in this picture?", "Be concise."},
			Messages: 2, Images: 1,
		}},
		{"chat max_completion_tokens wins", "/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"max_completion_tokens":20}`, parsed{
				Kind: KindChat, Model: "m", MaxOutput: 20, Texts: []string{"hi"}, Messages: 1,
			}},
		{"chat legacy functions", "/v1/chat/completions",
			`{"messages":[{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}},{"role":"function","name":"f","content":"42"}],"functions":[{"name":"f"}]}`, parsed{
				Kind: KindChat, Texts: []string{"f", "{}", "42", "f", `[{"name":"f"}]`}, Messages: 2, Names: 1,
			}},
		{"anthropic", "/v1/messages", anthropicBody, parsed{
			Kind: KindAnthropicMessages, Model: "claude-sonnet-4-5", Stream: true, MaxOutput: 1024,
			Texts: []string{
				"You are a careful code reviewer.", "Only comment on correctness.",
				"Review: func add(a, b int) int { return a - b }",
				"Let me run the tests.", "run_tests", `{"package":"./math"}`,
				"--- FAIL: TestAdd: add(1, 2) = -1, want 3", "What do you conclude?",
				`[{"name":"run_tests","description":"Run go test","input_schema":{"type":"object","properties":{"package":{"type":"string"}}}}]`,
			},
			Messages: 4,
		}},
		{"anthropic string system", "/v1/messages",
			`{"model":"c","max_tokens":10,"system":"Be terse.","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA"}},{"type":"text","text":"What?"}]}]}`, parsed{
				Kind: KindAnthropicMessages, Model: "c", MaxOutput: 10, Texts: []string{"Be terse.", "What?"}, Messages: 2, Images: 1,
			}},
		{"completions string", "/v1/completions", completionsBody, parsed{
			Kind: KindCompletions, Model: "gpt-3.5-turbo-instruct", MaxOutput: 7, Texts: []string{"Say this is a test"},
		}},
		{"completions strings", "/v1/completions", completionsListBody, parsed{
			Kind: KindCompletions, Model: "m", MaxOutput: 16, Texts: []string{"hello world", "second prompt"},
		}},
		{"completions token ids", "/v1/completions", completionsIDsBody, parsed{
			Kind: KindCompletions, Model: "m", MaxOutput: 5, TokenIDs: 4,
		}},
		{"completions nested token ids", "/v1/completions", completionsIDsNestedBody, parsed{
			Kind: KindCompletions, Model: "m", TokenIDs: 5,
		}},
		{"embeddings string", "/v1/embeddings", embeddingsBody, parsed{
			Kind: KindEmbeddings, Model: "text-embedding-3-small", Texts: []string{"The food was delicious and the waiter was friendly."},
		}},
		{"embeddings strings", "/v1/embeddings", embeddingsListBody, parsed{
			Kind: KindEmbeddings, Model: "text-embedding-3-small", Texts: []string{"hello world", "goodbye world"},
		}},
		{"embeddings token ids", "/v1/embeddings", embeddingsIDsBody, parsed{
			Kind: KindEmbeddings, Model: "text-embedding-3-small", TokenIDs: 5,
		}},
		{"responses items", "/v1/responses", responsesBody, parsed{
			Kind: KindResponses, Model: "gpt-4.1", Stream: true, MaxOutput: 500,
			Texts: []string{
				"Talk like a pirate.", "Are semicolons optional in JavaScript?",
				"search", `{"q":"asi"}`, "Automatic semicolon insertion exists.",
				`[{"type":"function","name":"search","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}]`,
			},
			Messages: 2, Images: 1,
		}},
		{"responses string", "/v1/responses", responsesStringBody, parsed{
			Kind: KindResponses, Model: "gpt-4.1", Texts: []string{"Tell me a three sentence bedtime story about a unicorn."}, Messages: 1,
		}},
		{"escapes and unicode", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"line\nnext \"quoted\" \u00e9\ud83d\ude00 中文"}]}`, parsed{
				Kind: KindChat, Texts: []string{"line\nnext \"quoted\" é😀 中文"}, Messages: 1,
			}},
		{"nulls are absent", "/v1/chat/completions",
			`{"model":null,"stream":null,"max_tokens":null,"stream_options":null,"messages":[{"role":"user","content":null}]}`, parsed{
				Kind: KindChat, Messages: 1,
			}},
		{"integral float cap", "/v1/chat/completions", `{"messages":[],"max_tokens":64.0}`, parsed{Kind: KindChat, MaxOutput: 64}},
		{"huge cap clamped", "/v1/chat/completions", `{"messages":[],"max_tokens":1e300}`, parsed{Kind: KindChat, MaxOutput: CostLimit}},
		{"cap 2^31-1", "/v1/messages", `{"messages":[],"max_tokens":2147483647}`, parsed{Kind: KindAnthropicMessages, MaxOutput: CostLimit}},
		{"cap 1e15", "/v1/chat/completions", `{"messages":[],"max_completion_tokens":1000000000000000}`, parsed{Kind: KindChat, MaxOutput: CostLimit}},
		{"cap beyond float64", "/v1/responses", `{"input":"x","max_output_tokens":1e400}`, parsed{Kind: KindResponses, MaxOutput: CostLimit, Texts: []string{"x"}, Messages: 1}},
		{"cap of many digits", "/v1/completions", `{"prompt":"x","max_tokens":` + strings.Repeat("9", 400) + `}`, parsed{Kind: KindCompletions, MaxOutput: CostLimit, Texts: []string{"x"}}},
		{"n", "/v1/chat/completions", `{"messages":[],"max_tokens":10,"n":4}`, parsed{Kind: KindChat, MaxOutput: 10, Choices: 4}},
		{"n null", "/v1/chat/completions", `{"messages":[],"n":null}`, parsed{Kind: KindChat, Choices: 1}},
		{"n and best_of", "/v1/completions", `{"prompt":"x","n":2,"best_of":5}`, parsed{Kind: KindCompletions, Choices: 5, Texts: []string{"x"}}},
		{"n above best_of", "/v1/completions", `{"prompt":"x","n":3,"best_of":1.0}`, parsed{Kind: KindCompletions, Choices: 3, Texts: []string{"x"}}},
		{"n at the limit", "/v1/chat/completions", `{"messages":[],"n":128}`, parsed{Kind: KindChat, Choices: MaxChoices}},
		{"n ignored where the API has none", "/v1/messages", `{"messages":[],"n":1000}`, parsed{Kind: KindAnthropicMessages, Choices: 1}},
		{"escaped keys", "/v1/chat/completions", `{"m\u0065ssages":[{"r\u006fle":"user","c\u006Fntent":[{"t\u0079pe":"text","te\u0078t":"hi"}]}],"max\u005ftokens":100,"\u006e":2}`,
			parsed{Kind: KindChat, MaxOutput: 100, Choices: 2, Texts: []string{"hi"}, Messages: 1}},
		{"content before type", "/v1/messages", `{"messages":[{"role":"user","content":[{"content":[{"text":"in","type":"text"}],"type":"tool_result"},{"content":[{"text":"not counted","type":"text"},{"type":"image"}],"type":"document"}]}]}`,
			parsed{Kind: KindAnthropicMessages, Texts: []string{"in"}, Messages: 1}},
		{"content before a type that is not a string", "/v1/messages", `{"messages":[{"role":"user","content":[{"content":"x","type":null}]}]}`,
			parsed{Kind: KindAnthropicMessages, Messages: 1}},
		{"deepest nesting allowed", "/v1/messages", string(nestedToolResults((MaxDepth-3)/2, 3, true)), parsed{Kind: KindAnthropicMessages, Model: "m", MaxOutput: 1, Texts: []string{"aaa"}, Messages: 1}},
		{"depth 64 in an unknown member", "/v1/chat/completions", `{"messages":[],"x":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`, parsed{Kind: KindChat}},
		{"unknown path, empty body", "/v1/models", "", parsed{}},
		{"unknown path, other JSON", "/v1/rerank", `{"query":"q","documents":["a"]}`, parsed{}},
		{"inferred chat", "/generate", `{"messages":[{"role":"user","content":"hi"}]}`, parsed{
			Kind: KindChat, Inferred: true, Texts: []string{"hi"}, Messages: 1,
		}},
		{"inferred anthropic", "/proxy", `{"system":"s","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, parsed{
			Kind: KindAnthropicMessages, Inferred: true, MaxOutput: 5, Texts: []string{"s", "hi"}, Messages: 2,
		}},
		{"inferred completions", "/x", `{"prompt":"abc"}`, parsed{Kind: KindCompletions, Inferred: true, Texts: []string{"abc"}}},
		{"inferred embeddings", "/x", `{"input":["a","b"]}`, parsed{Kind: KindEmbeddings, Inferred: true, Texts: []string{"a", "b"}}},
		{"inferred responses", "/x", `{"input":"a","instructions":"b"}`, parsed{Kind: KindResponses, Inferred: true, Texts: []string{"b", "a"}, Messages: 2}},
		{"ambiguous input", "/x", `{"model":"m","input":"a"}`, parsed{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			orig := bytes.Clone(body)
			got, err := Parse(tt.path, body)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !bytes.Equal(body, orig) {
				t.Fatal("Parse modified the body")
			}
			if tt.want.Choices == 0 {
				tt.want.Choices = 1
			}
			if p := parsedOf(got); !reflect.DeepEqual(p, tt.want) {
				t.Errorf("Parse =\n %#v\nwant\n %#v", p, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, path, body, want string
		field                  string
	}{
		{"empty", "/v1/chat/completions", "", "request body is empty; expected a JSON object", ""},
		{"whitespace", "/v1/messages", " \n\t", "request body is empty; expected a JSON object", ""},
		{"truncated", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hel`,
			"request body is not valid JSON: it ends in the middle of a value (truncated?)", ""},
		{"syntax", "/v1/chat/completions", "{\n  \"model\": \"m\",\n}",
			`request body is not valid JSON: invalid character '}' looking for beginning of object key string at offset 18 (line 3, column 1)`, ""},
		{"syntax unknown path", "/v1/other", `{"a":}`,
			`request body is not valid JSON: invalid character '}' looking for beginning of value at offset 5 (line 1, column 6)`, ""},
		{"trailing garbage", "/v1/embeddings", `{"input":"a"} x`,
			`request body is not valid JSON: invalid character 'x' after top-level value at offset 14 (line 1, column 15)`, ""},
		{"array body", "/v1/chat/completions", `[{"role":"user"}]`, "request body must be a JSON object, got array", ""},
		{"string body", "/v1/chat/completions", `"hi"`, "request body must be a JSON object, got string", ""},
		{"messages object", "/v1/chat/completions", `{"messages":{"role":"user"}}`, `"messages" must be an array, got object`, "messages"},
		{"message string", "/v1/chat/completions", `{"messages":["hi"]}`, `"messages[0]" must be an object, got string`, "messages[0]"},
		{"role number", "/v1/chat/completions", `{"messages":[{"role":1,"content":"x"}]}`, `"messages[0].role" must be a string, got number`, "messages[0].role"},
		{"content number", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}`,
			`"messages[1].content" must be a string, an array of content parts, or null, got number`, "messages[1].content"},
		{"part text number", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`,
			`"messages[0].content[0].text" must be a string, got number`, "messages[0].content[0].text"},
		{"part type missing is fine, wrong type not", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":true}]}]}`,
			`"messages[0].content[0].type" must be a string, got boolean`, "messages[0].content[0].type"},
		{"anthropic content", "/v1/messages", `{"messages":[{"role":"user","content":{}}]}`,
			`"messages[0].content" must be a string or an array of content blocks, got object`, "messages[0].content"},
		{"anthropic system", "/v1/messages", `{"system":7,"messages":[]}`, `"system" must be a string or an array of text blocks, got number`, "system"},
		{"model", "/v1/chat/completions", `{"model":["a"],"messages":[]}`, `"model" must be a string, got array`, "model"},
		{"stream", "/v1/chat/completions", `{"stream":"yes","messages":[]}`, `"stream" must be a boolean, got string`, "stream"},
		{"include_usage", "/v1/chat/completions", `{"stream_options":{"include_usage":1},"messages":[]}`,
			`"stream_options.include_usage" must be a boolean, got number`, "stream_options.include_usage"},
		{"max_tokens string", "/v1/chat/completions", `{"max_tokens":"100","messages":[]}`, `"max_tokens" must be a non-negative integer, got string`, "max_tokens"},
		{"max_tokens negative", "/v1/messages", `{"max_tokens":-1,"messages":[]}`, `"max_tokens" must be a non-negative integer, got -1`, "max_tokens"},
		{"max_output_tokens fraction", "/v1/responses", `{"max_output_tokens":1.5,"input":"x"}`, `"max_output_tokens" must be a non-negative integer, got 1.5`, "max_output_tokens"},
		{"prompt object", "/v1/completions", `{"prompt":{}}`, `"prompt" must be a string or an array, got object`, "prompt"},
		{"prompt mixed", "/v1/completions", `{"prompt":["a",1]}`,
			`"prompt" must be a string, an array of strings, an array of token IDs or an array of token-ID arrays, with elements of one type`, "prompt"},
		{"prompt float ids", "/v1/completions", `{"prompt":[1.5]}`,
			`"prompt" must be a string, an array of strings, an array of token IDs or an array of token-ID arrays, with elements of one type`, "prompt"},
		{"input bool", "/v1/embeddings", `{"input":true}`, `"input" must be a string or an array, got boolean`, "input"},
		{"responses input number", "/v1/responses", `{"input":3}`, `"input" must be a string or an array of input items, got number`, "input"},
		{"responses item", "/v1/responses", `{"input":["x"]}`, `"input[0]" must be an object, got string`, "input[0]"},
		{"instructions", "/v1/responses", `{"instructions":{},"input":"x"}`, `"instructions" must be a string, got object`, "instructions"},
		{"stream_options string", "/v1/chat/completions", `{"stream_options":"yes","messages":[]}`, `"stream_options" must be an object, got string`, "stream_options"},
		// Read in place, with the item's type after them: content is
		// walked as if the item were a message, then dropped, its error
		// too, and the output read again.
		{"item output before its type", "/v1/responses", `{"input":[{"content":5,"output":{},"type":"function_call_output"}]}`,
			`"input[0].output" must be a string, an array of content parts, or null, got object`, "input[0].output"},

		// Nesting.
		{"depth 65", "/v1/chat/completions", `{"messages":[],"x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
			"request body is nested deeper than 64 levels of arrays and objects (at offset 82); flatten it", ""},
		{"tool results too deep", "/v1/messages", string(nestedToolResults((MaxDepth-3)/2+1, 3, false)),
			fmt.Sprintf("request body is nested deeper than 64 levels of arrays and objects (at offset %d); flatten it", tooDeep(nestedToolResults((MaxDepth-3)/2+1, 3, false))), ""},
		{"beyond encoding/json's limit", "/v1/chat/completions", `{"messages":[],"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
			"request body is nested deeper than 64 levels of arrays and objects (at offset 82); flatten it", ""},

		// Duplicates, plain and escaped, at every level the parser reads.
		{"duplicate max_tokens", "/v1/chat/completions", `{"max_tokens":1,"messages":[],"max_tokens":100000}`,
			`"max_tokens" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "max_tokens"},
		{"escaped duplicate max_tokens", "/v1/chat/completions", `{"max_tokens":1,"max\u005ftokens":100000,"messages":[]}`,
			`"max_tokens" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "max_tokens"},
		{"duplicate model", "/v1/rerank", `{"model":"a","m\u006fdel":"b"}`,
			`"model" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "model"},
		{"duplicate include_usage", "/v1/chat/completions", `{"stream_options":{"include_usage":false,"include_usage":true},"messages":[]}`,
			`"stream_options.include_usage" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "stream_options.include_usage"},
		{"duplicate content", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"a","c\u006fntent":"bbbb"}]}`,
			`"messages[1].content" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "messages[1].content"},
		{"duplicate text", "/v1/messages", `{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"bbbb"}]}]}`,
			`"messages[0].content[0].text" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "messages[0].content[0].text"},
		{"duplicate nested content", "/v1/messages", `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"content":"a","type":"tool_result","content":"b"}]}]}]}`,
			`"messages[0].content[0].content[0].content" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "messages[0].content[0].content[0].content"},
		{"duplicate arguments", "/v1/chat/completions", `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}","arguments":"{\"a\":1}"}}]}]}`,
			`"messages[0].tool_calls[0].function.arguments" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "messages[0].tool_calls[0].function.arguments"},
		{"duplicate function_call name", "/v1/chat/completions", `{"messages":[{"role":"assistant","function_call":{"name":"f","n\u0061me":"g"},"content":null}]}`,
			`"messages[0].function_call.name" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "messages[0].function_call.name"},
		{"duplicate item type", "/v1/responses", `{"input":[{"type":"message","type":"reasoning"}]}`,
			`"input[0].type" appears more than once in the same object (keys are compared after decoding escapes such as \u005f); send it once`, "input[0].type"},

		// Output caps and choices.
		{"max_tokens negative huge", "/v1/chat/completions", `{"max_tokens":-1e300,"messages":[]}`, `"max_tokens" must be a non-negative integer, got -1e300`, "max_tokens"},
		{"max_tokens bool", "/v1/chat/completions", `{"max_tokens":true,"messages":[]}`, `"max_tokens" must be a non-negative integer, got boolean`, "max_tokens"},
		{"max_tokens long fraction", "/v1/messages", `{"max_tokens":1.` + strings.Repeat("5", 100) + `,"messages":[]}`,
			`"max_tokens" must be a non-negative integer, got 1.55555555555555555555555555555555555555...`, "max_tokens"},
		{"n zero", "/v1/chat/completions", `{"n":0,"messages":[]}`, `"n" must be a positive integer, got 0`, "n"},
		{"n negative", "/v1/completions", `{"n":-2,"prompt":"x"}`, `"n" must be a positive integer, got -2`, "n"},
		{"n fraction", "/v1/chat/completions", `{"n":1.5,"messages":[]}`, `"n" must be a positive integer, got 1.5`, "n"},
		{"n string", "/v1/chat/completions", `{"n":"4","messages":[]}`, `"n" must be a positive integer, got string`, "n"},
		{"n too many", "/v1/chat/completions", `{"n":129,"messages":[]}`, `"n" must be at most 128, got 129`, "n"},
		{"n beyond float64", "/v1/chat/completions", `{"n":1e400,"messages":[]}`, `"n" must be at most 128, got 1e400`, "n"},
		{"best_of too many", "/v1/completions", `{"best_of":1000,"prompt":"x"}`, `"best_of" must be at most 128, got 1000`, "best_of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.path, []byte(tt.body))
			var be *BodyError
			if !errors.As(err, &be) {
				t.Fatalf("Parse error = %v (%T), want *BodyError", err, err)
			}
			if err.Error() != tt.want {
				t.Errorf("error =\n %s\nwant\n %s", err, tt.want)
			}
			if be.Field != tt.field {
				t.Errorf("Field = %q, want %q", be.Field, tt.field)
			}
			if strings.Contains(tt.name, "syntax") && be.Offset < 0 {
				t.Errorf("Offset = %d for a syntax error", be.Offset)
			}
			if want := tooDeep([]byte(tt.body)); want >= 0 && be.Offset != int64(want) {
				t.Errorf("Offset = %d, want %d: the first bracket too deep", be.Offset, want)
			}
		})
	}
}
