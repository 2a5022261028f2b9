package llmapi

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// referenceParseUsage is ParseUsage for a valid JSON response, written
// with encoding/json: the last top-level usage member, its counts read in
// order (Anthropic's cache counts add up, other repeated counts keep the
// last), a fraction truncated, an exponent read as a float.
func referenceParseUsage(t *testing.T, body []byte) (Usage, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return Usage{}, false // not an object
	}
	raw, ok := top["usage"]
	if !ok || raw[0] != '{' {
		return Usage{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		num, isNum := v.(json.Number)
		if !isNum {
			continue
		}
		n, ok := referenceTokenCount(string(num))
		if !ok {
			continue
		}
		k := key.(string)
		if k == "cache_creation_input_tokens" || k == "cache_read_input_tokens" {
			counts["cache"] += n
			k = "cached"
		}
		counts[k] = n
	}
	get := func(k string) int {
		if n, ok := counts[k]; ok {
			return n
		}
		return -1
	}
	prompt, completion := get("prompt_tokens"), get("completion_tokens")
	if prompt < 0 {
		prompt = get("input_tokens")
	}
	if completion < 0 {
		completion = get("output_tokens")
	}
	if _, ok := counts["cached"]; ok {
		prompt = max(prompt, 0) + counts["cache"]
	}
	if prompt < 0 && completion < 0 {
		return Usage{}, false
	}
	return Usage{Prompt: max(prompt, 0), Completion: max(completion, 0), Reported: completion >= 0}, true
}

// referenceTokenCount reads a JSON number as a token count.
func referenceTokenCount(n string) (int, bool) {
	if strings.ContainsAny(n, "eE") {
		f, err := strconv.ParseFloat(n, 64)
		if err != nil {
			return 0, false
		}
		return int(max(min(f, 1<<31-1), 0)), true
	}
	if strings.HasPrefix(n, "-") {
		return 0, true
	}
	whole, _, _ := strings.Cut(n, ".")
	v, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || v > 1<<31-1 {
		return 1<<31 - 1, true
	}
	return int(v), true
}

// sameUsage checks ParseUsage against the reference on b, when b is JSON;
// on anything else it must only answer, with counts that are not
// negative.
func sameUsage(t *testing.T, b []byte) {
	t.Helper()
	got, ok := ParseUsage(b)
	if got.Prompt < 0 || got.Completion < 0 {
		t.Fatalf("ParseUsage(%q) = %+v", b, got)
	}
	if !json.Valid(b) {
		return
	}
	want, wok := referenceParseUsage(t, b)
	if got != want || ok != wok {
		t.Fatalf("ParseUsage(%q) = %+v, %v; encoding/json reads %+v, %v", b, got, ok, want, wok)
	}
}

func usageSeeds() []string {
	return []string{smallChatResponse,
		`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"usage\": {}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"fp"}`,
		`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],"model":"m","usage":{"prompt_tokens":8,"total_tokens":8}}`,
		`{"id":"msg_1","type":"message","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":6}}`,
		`{"usage":{"prompt_tokens":3.0,"completion_tokens":4e1}}`, `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":2}}`,
		`{"us\u0061ge":{"pr\u006fmpt_tokens":7}}`, `{"usage":{"prompt_tokens":-5,"output_tokens":"x","input_tokens":null}}`,
		`{"usage":{}}`, `{"usage":null}`, `{"usage":{"prompt_tokens":5`, `{"usage":{"prompt_tokens":5,}}`, `{"usage" : { "prompt_tokens" : 5 } }`,
		`{"a":"\`, `{"a":"\"}`, `{"a":[[[[`, `]]]]`, `"`, `{"a\":1}`, `{"a":[}],"usage":{"prompt_tokens":1}}`, `{"a":tru,"usage":{"completion_tokens":2}}`,
		`{"a":1 "usage":{}}`, `<html>`, ``, ` `, `{`, `{"usage":{"prompt_tokens":99999999999999999999}}`,
		`{"usage":{"prompt_tokens":2147483646.99999999999,"completion_tokens":1e400,"input_tokens":12.9999999999999999}}`,
		`{"usage":{"cache_read_input_tokens":1,"cache_read_input_tokens":2,"input_tokens":3}}`,
		`{"foo\"usage":{"prompt_tokens":5}}`, `{"usage":{"prompt_tokens":1},"data":[{"usage":{"prompt_tokens":2}}]}`,
		`{"usage":{"prompt_tokens":1},"x":{"usage":{"prompt_tokens":2}}}`, `{"usage":{"prompt_tokens":1},"us\u0061ge":{"prompt_tokens":2}}`,
		`{"a":"\\","usage":{"prompt_tokens":3}}`, `{"k":"\\\"usage\":{\"prompt_tokens\":9}}"}`, `{"usage":{"prompt_tokens":4},"id":"usage"}`,
	}
}

// FuzzParseUsage: ParseUsage reads what encoding/json reads from any JSON
// response, and answers anything else. FuzzScan's corpus, JSON values of
// every shape, runs here.
func FuzzParseUsage(f *testing.F) {
	for _, s := range usageSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameUsage(t, b)
	})
}

// TestParseUsageMatchesDecoder: on the seeds, random responses and their
// mutations, ParseUsage and encoding/json agree.
func TestParseUsageMatchesDecoder(t *testing.T) {
	for _, s := range usageSeeds() {
		sameUsage(t, []byte(s))
	}
	rng := rand.New(rand.NewPCG(9, 10))
	special := []byte("{}[],:\"\\ \t\n0123456789-.eEusagepromt_\x00\xff")
	for n := 0; n < 20000; n++ {
		var sb strings.Builder
		randomJSON(rng, &sb, 4)
		doc := sb.String()
		if rng.IntN(2) == 0 {
			doc = `{"x":` + doc + `,"usage":{"prompt_tokens":` + []string{"1", "2.5", "-1", "3e2", "x"}[rng.IntN(5)] + `,"completion_tokens":4}}`
		}
		b := []byte(doc)
		sameUsage(t, b)
		for m := 0; m < 4; m++ {
			c := append([]byte(nil), b...)
			p := rng.IntN(len(c) + 1)
			switch x := special[rng.IntN(len(special))]; rng.IntN(3) {
			case 0:
				if p < len(c) {
					c[p] = x
				}
			case 1:
				c = append(c[:p], append([]byte{x}, c[p:]...)...)
			case 2:
				if p < len(c) {
					c = append(c[:p], c[p+1:]...)
				}
			}
			sameUsage(t, c)
		}
	}
}
