package llmapi

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomJSON writes a random valid JSON value of at most depth levels.
func randomJSON(rng *rand.Rand, sb *strings.Builder, depth int) {
	ws := func() {
		if rng.IntN(4) == 0 {
			sb.WriteString([]string{" ", "\t", "\n", "\r\n  "}[rng.IntN(4)])
		}
	}
	ws()
	switch k := rng.IntN(9); {
	case k == 0 && depth > 0:
		sb.WriteByte('{')
		for n := rng.IntN(4); n > 0; n-- {
			randomString(rng, sb)
			ws()
			sb.WriteByte(':')
			randomJSON(rng, sb, depth-1)
			if n > 1 {
				sb.WriteByte(',')
			}
		}
		ws()
		sb.WriteByte('}')
	case k == 1 && depth > 0:
		sb.WriteByte('[')
		for n := rng.IntN(4); n > 0; n-- {
			randomJSON(rng, sb, depth-1)
			if n > 1 {
				sb.WriteByte(',')
			}
		}
		ws()
		sb.WriteByte(']')
	case k == 2:
		sb.WriteString([]string{"true", "false", "null"}[rng.IntN(3)])
	case k == 3:
		sb.WriteString([]string{"0", "-0", "12", "-3.25", "1e9", "2E-3", "0.5e+10", "7"}[rng.IntN(8)])
	default:
		randomString(rng, sb)
	}
	ws()
}

func randomString(rng *rand.Rand, sb *strings.Builder) {
	sb.WriteByte('"')
	for n := rng.IntN(6); n > 0; n-- {
		sb.WriteString([]string{"a", "é", "中", `\"`, `\\`, `\/`, `\n`, `\u00e9`, `\uD83D\uDE00`, " ", "\xff", "{", "]"}[rng.IntN(13)])
	}
	sb.WriteByte('"')
}

// readerValid reports whether a reader, with the given depth limit (0:
// jsontext's own), reads b as one JSON value.
func readerValid(b []byte, limit int) bool {
	var rs readers
	r := rs.open(b, limit)
	r.skip()
	r.end()
	return r.err == nil
}

// encodingJSONDepth is encoding/json's limit on nesting, which jsontext
// shares.
const encodingJSONDepth = 10000

// TestReaderAcceptsWhatEncodingJSONAccepts: the readers' decoder, with the
// options they give it, accepts what json.Valid accepts (invalid UTF-8,
// unpaired surrogates, repeated names) and nothing more, on random valid
// documents, on each of them mutated (a byte replaced, inserted or
// removed: the near misses where a validator errs), on token soup, on
// edge cases and at the nesting limit. Read token by token to see the
// depth, as request bodies are, it accepts the same.
func TestReaderAcceptsWhatEncodingJSONAccepts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	check := func(b []byte) {
		t.Helper()
		want := json.Valid(b)
		if got := readerValid(b, 0); got != want {
			t.Fatalf("%q: reader %v, json.Valid %v", b, got, want)
		}
		if got := readerValid(b, MaxDepth); got != want && depth(b) <= MaxDepth {
			t.Fatalf("%q: reader with a depth limit %v, json.Valid %v", b, got, want)
		}
	}
	special := []byte("{}[],:\"\\/ \t\n\r0123456789-+.eEtrufalsnbx\x00\x1f\x7f\xff")
	for n := 0; n < 30000; n++ {
		var sb strings.Builder
		randomJSON(rng, &sb, 4)
		doc := []byte(sb.String())
		check(doc)
		for m := 0; m < 4; m++ {
			b := append([]byte(nil), doc...)
			p := rng.IntN(len(b) + 1)
			c := special[rng.IntN(len(special))]
			switch rng.IntN(3) {
			case 0:
				if p < len(b) {
					b[p] = c
				}
			case 1:
				b = append(b[:p], append([]byte{c}, b[p:]...)...)
			case 2:
				if p < len(b) {
					b = append(b[:p], b[p+1:]...)
				}
			}
			check(b)
		}
	}
	tokens := []string{"{", "}", "[", "]", ",", ":", `"k"`, `"\u12"`, `"\q"`, "\"\x01\"", "0", "01", "-", "-1", "1.", "1.5",
		"1e", "1e+2", ".5", "true", "tru", "false", "null", "nul", " ", "\t", `"`, `\`, "x", "\xff", "+1", "00"}
	for n := 0; n < 100000; n++ {
		var sb strings.Builder
		for k := 1 + rng.IntN(8); k > 0; k-- {
			sb.WriteString(tokens[rng.IntN(len(tokens))])
		}
		check([]byte(sb.String()))
	}
	for _, depth := range []int{encodingJSONDepth - 1, encodingJSONDepth, encodingJSONDepth + 1} {
		check([]byte(strings.Repeat("[", depth) + strings.Repeat("]", depth)))
		check([]byte(strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)))
	}
	for _, s := range []string{"", " ", "{}", "[]", `""`, "0", " {} ", "{} {}", "{,}", "[1,]", `{"a":1,}`, `{"a"}`, `{"a":}`,
		"-0", "1e5", "01", "-01", "1.", ".1", "1e", "1e+", "1E-2", "-", "0x1", "[1,]", "{\"a\":1,}", "{\"a\"}", "{,}", "[,1]",
		"\"\\ud800\"", "\"\\u12\"", "\"\\uZZZZ\"", "\"\xff\xfe\"", "\xff", "\"\t\"", "\"\x7f\"", "true false", "nul", "nulll", "[]]", "[[]", "{}}",
		"\ufeff{}", "{\"a\":[1,{\"b\":null}]}", "[1 2]", "{\"a\":1 \"b\":2}", "\"abc", "\"\\\"", "[\"\\/\"]", "1 ", "\x00", "[-]", "[1e1.5]",
		"[-1.0e-0]", "{\"\":\"\"}", "[\"\\a\"]", "123abc", "[true,]", "{\"a\":}", "{\"a\":1,\"a\":2}", "\"\\ud800\\u0041\"", "\"\\udc00\\ud800\"",
		strings.Repeat("[{\"a\":", 5000) + "1" + strings.Repeat("}]", 5000),
		strings.Repeat("[", 10000) + strings.Repeat("]", 9999),
	} {
		check([]byte(s))
	}
}
