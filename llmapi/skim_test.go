package llmapi

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// referenceParseUsage is ParseUsage as the StreamScanner reads usage:
// with scan.member and decodeUsage, which ParseUsage's skimming restates.
func referenceParseUsage(body []byte) (Usage, bool) {
	var sc scan
	p, c, ok := decodeUsage(&sc, sc.member(body, "usage"))
	if !ok {
		return Usage{}, false
	}
	return Usage{Prompt: max(p, 0), Completion: max(c, 0), Reported: c >= 0}, true
}

// sameUsage checks the skimming functions and ParseUsage against the
// scanner's primitives on b.
func sameUsage(t *testing.T, b []byte) {
	t.Helper()
	var s scan
	if got, want := skimValue(b, 0), s.valueEnd(b, 0); got != want {
		t.Fatalf("skimValue(%q) = %d, valueEnd %d", b, got, want)
	}
	if b[0] == '"' {
		if got, want := skimString(b, 0), s.stringEnd(b, 0); got != want {
			t.Fatalf("skimString(%q) = %d, stringEnd %d", b, got, want)
		}
	}
	gp, gc, gok, ge := skimUsageAt(b, 0)
	wp, wc, wok := decodeUsage(&s, b)
	if gp != wp || gc != wc || gok != wok || ge >= 0 && ge != s.valueEnd(b, 0) {
		t.Fatalf("skimUsageAt(%q) = %d, %d, %v, end %d; decodeUsage %d, %d, %v, valueEnd %d", b, gp, gc, gok, ge, wp, wc, wok, s.valueEnd(b, 0))
	}
	lp, lc, lok := skimLastUsage(b)
	wp, wc, wok = decodeUsage(&s, s.member(b, "usage"))
	if lp != wp || lc != wc || lok != wok {
		t.Fatalf("skimLastUsage(%q) = %d, %d, %v; decodeUsage of member %d, %d, %v", b, lp, lc, lok, wp, wc, wok)
	}
	gu, gok := ParseUsage(b)
	wu, wok := referenceParseUsage(b)
	if gu != wu || gok != wok {
		t.Fatalf("ParseUsage(%q) = %+v, %v; reference %+v, %v", b, gu, gok, wu, wok)
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
	}
}

// FuzzParseUsage: ParseUsage, and each skimming primitive, reads any input
// as the scanner's primitives read it.
func FuzzParseUsage(f *testing.F) {
	for _, s := range usageSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			ParseUsage(b)
			return
		}
		sameUsage(t, b)
	})
}

// TestSkimMatchesScan: on the seeds, random responses and their
// mutations, skimming and the scanner agree.
func TestSkimMatchesScan(t *testing.T) {
	for _, s := range usageSeeds() {
		if s != "" {
			sameUsage(t, []byte(s))
		}
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
			if len(c) > 0 {
				sameUsage(t, c)
			}
		}
	}
}
