// Package llmapi parses OpenAI- and Anthropic-style request bodies,
// estimates their token cost, extracts usage from responses (JSON and SSE),
// and rewrites bodies for light mode.
//
// The package is pure: it knows nothing about Caddy or HTTP, so the
// scheduler's cost model can be tested and benchmarked on plain byte slices.
// Everything here is an estimate that only drives scheduling; the usage an
// upstream reports afterwards is what gets charged, so the code favours
// bounded, predictable work over exactness.
//
// All JSON is read by one streaming walker on jsontext
// (github.com/go-json-experiment/json/jsontext), which validates as it
// reads. Parse never modifies the body it is given: the gateway forwards
// the bytes it received, not a re-encoding of what this package
// understood. Nor does it copy the prompt: a Request refers to its body,
// which must stay unchanged while the Request is in use.
//
// Bodies come from anyone who can reach the gateway, so the walker is
// built for hostile input: its work is linear in the body's size whatever
// the nesting, nesting beyond MaxDepth is refused, keys are matched after
// decoding escapes and duplicates of the members it reads are refused (so
// that it reads what the model server will), and token counts saturate at
// CostLimit instead of overflowing. Responses come from the upstream:
// what is not JSON there counts for nothing.
package llmapi
