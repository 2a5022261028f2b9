// Package llmapi parses OpenAI- and Anthropic-style request bodies,
// estimates their token cost, extracts usage from responses (JSON and SSE),
// and rewrites bodies for light mode. It knows nothing about Caddy or HTTP.
// Estimates only drive scheduling; the usage an upstream reports is what
// gets charged, so bounded work is favoured over exactness.
//
// All JSON is read by one streaming walker on jsontext. Parse never
// modifies or copies the body: a Request refers to it.
//
// Bodies are hostile input: work is linear in the body's size whatever the
// nesting, nesting beyond MaxDepth is refused, keys are matched after
// decoding escapes, duplicates of the members read are refused (so the
// walker reads what the model server will), and token counts saturate at
// CostLimit.
package llmapi
