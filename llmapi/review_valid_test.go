package llmapi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRevValidEdgeCases(t *testing.T) {
	cases := []string{"-0", "1e5", "01", "-01", "1.", ".1", "1e", "1e+", "1E-2", "-", "0x1", "[1,]", "{\"a\":1,}", "{\"a\"}", "{,}", "[,1]",
		"\"\\ud800\"", "\"\\u12\"", "\"\\uZZZZ\"", "\"\xff\xfe\"", "\xff", "\"\t\"", "\"\x7f\"", "true false", "nul", "nulll", "[]]", "[[]", "{}}",
		" {} ", "\ufeff{}", "{\"a\":[1,{\"b\":null}]}", "[1 2]", "{\"a\":1 \"b\":2}", "\"abc", "\"\\\"", "[\"\\/\"]", "1 ", "\x00", "[-]", "[1e1.5]", "[-1.0e-0]", "{\"\":\"\"}", "[\"\\a\"]", "123abc", "[true,]", "{\"a\":}",
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("{\"a\":", 10000) + "1" + strings.Repeat("}", 10000),
		strings.Repeat("{\"a\":", 10001) + "1" + strings.Repeat("}", 10001),
		strings.Repeat("[{\"a\":", 5000) + "1" + strings.Repeat("}]", 5000),
		strings.Repeat("[", 10000) + strings.Repeat("]", 9999),
	}
	for _, c := range cases {
		if got, want := validJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("validJSON(%.40q) = %v, json.Valid %v", c, got, want)
		}
	}
}
