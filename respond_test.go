package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// anthropicErrorBody is Anthropic's error shape, as the gateway writes it
// on /v1/messages.
type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Details struct {
			ErrorCode string `json:"error_code"`
			Reason    string `json:"reason"`
		} `json:"details"`
	} `json:"error"`
}

// TestAnthropicErrorShape: the gateway's own answers to Anthropic's
// /v1/messages come in Anthropic's error shape, with the contract's code
// in error.details.error_code (where the official Anthropic clients read
// an error's code), the quota's meter beside it, and the same status and
// headers as on the OpenAI routes; the OpenAI routes keep OpenAI's shape.
func TestAnthropicErrorShape(t *testing.T) {
	u := newFakeUpstream(t)
	h, _ := mustLoad(t, fqConfig(queueName(t), u, `"reject_unknown_tenants":true,"max_body":2048,`+
		`"tenants":{"acme":{},"metered":{"wait_budget":"1s","quota":{"tokens_per_min":60,"burst_allow":0}}}`))
	g := newGateway(t, h)
	message := func(tenant, body string) result {
		r := g.newRequest(context.Background(), tenant, []byte(body), "Anthropic-Version", "2023-06-01")
		r.URL.Path = "/v1/messages"
		return g.do(r)
	}
	const hello = `{"model":"claude","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`
	wantOK(t, message("metered", hello))

	for _, tc := range []struct {
		name, tenant, body string
		status             int
		typ, code, reason  string
	}{
		{"unknown tenant", "mallory", hello, http.StatusForbidden, "permission_error", "unknown_tenant", ""},
		{"malformed body", "acme", `{"messages": [`, http.StatusBadRequest, "invalid_request_error", "invalid_request", ""},
		{"body too large", "acme", `{"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x ", 2048) + `"}]}`,
			http.StatusRequestEntityTooLarge, "request_too_large", "request_too_large", ""},
		{"quota", "metered", hello, http.StatusTooManyRequests, "rate_limit_error", "quota_exceeded", "tokens"},
	} {
		res := message(tc.tenant, tc.body)
		if res.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, res.status, tc.status, res.body)
			continue
		}
		var body anthropicErrorBody
		dec := json.NewDecoder(bytes.NewReader(res.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			t.Errorf("%s: body %s is not Anthropic's error shape: %v", tc.name, res.body, err)
			continue
		}
		if body.Type != "error" || body.Error.Type != tc.typ || body.Error.Message == "" ||
			body.Error.Details.ErrorCode != tc.code || body.Error.Details.Reason != tc.reason {
			t.Errorf("%s: %s; want type error, error.type %s, details.error_code %s, reason %q", tc.name, res.body, tc.typ, tc.code, tc.reason)
		}
		if ct := res.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", tc.name, ct)
		}
		if tc.status == http.StatusTooManyRequests && (res.header.Get("Retry-After") == "" || res.header.Get("X-Ratelimit-Limit-Tokens") != "60") {
			t.Errorf("%s: headers %v; want Retry-After and x-ratelimit-limit-tokens 60", tc.name, res.header)
		}
	}
	// The OpenAI routes keep OpenAI's shape.
	wantError(t, g.post("mallory", chatBody("")), http.StatusForbidden, "unknown_tenant")
}
