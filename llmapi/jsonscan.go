package llmapi

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A minimal JSON scanner for the hot paths (response bodies and stream
// chunks) where only a few members matter: walking bytes is several times
// faster than reflection-based decoding and allocates nothing. It trusts its
// input to be JSON; on anything else it stops early, never panics, and
// callers fall back to encoding/json or ignore the value.

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i] == '"',
// or -1.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index just past the value starting at b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := stringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if j == i {
				return -1
			}
			return j
		}
		j++
	}
	return j
}

// eachMember calls f with the raw key (between the quotes, escapes intact)
// and the raw value of each member of the object in b, until f returns
// false. It reports whether b held an object that was walked to its end or
// to where f stopped.
func eachMember(b []byte, f func(key, value []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for i < len(b) {
		if b[i] != '"' {
			return false
		}
		ke := stringEnd(b, i)
		if ke < 0 {
			return false
		}
		key := b[i+1 : ke-1]
		i = skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		ve := valueEnd(b, i)
		if ve < 0 {
			return false
		}
		if !f(key, b[i:ve]) {
			return true
		}
		i = skipWS(b, ve)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return true
		default:
			return false
		}
	}
	return false
}

// member returns the raw value of the last member named key of the object
// in b (JSON's last-wins rule), or nil.
func member(b []byte, key string) []byte {
	var v []byte
	eachMember(b, func(k, val []byte) bool {
		if string(k) == key {
			v = val
		}
		return true
	})
	return v
}

// eachElement calls f with each raw element of the array in b.
func eachElement(b []byte, f func(elem []byte)) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return
	}
	i = skipWS(b, i+1)
	for i < len(b) && b[i] != ']' {
		e := valueEnd(b, i)
		if e < 0 {
			return
		}
		f(b[i:e])
		i = skipWS(b, e)
		if i >= len(b) || b[i] != ',' && b[i] != ']' {
			return
		}
		if b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
}

// appendString appends the decoded JSON string raw (quotes included) to
// dst. Other values append nothing.
func appendString(dst, raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst
	}
	s := raw[1 : len(raw)-1]
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch s[i] {
		case 'n':
			dst = append(dst, '\n')
		case 't':
			dst = append(dst, '\t')
		case 'r':
			dst = append(dst, '\r')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'u':
			r, n := hex4(s[i+1:])
			if n == 0 {
				continue
			}
			i += n
			if utf16.IsSurrogate(r) && i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
				if r2, n2 := hex4(s[i+3:]); n2 > 0 {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						r = d
						i += 2 + n2
					}
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, s[i])
		}
	}
	return dst
}

func hex4(b []byte) (rune, int) {
	if len(b) < 4 {
		return 0, 0
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, 0
		}
		r = r<<4 | rune(c)
	}
	return r, 4
}

// decodeUsage reads a usage object: OpenAI's prompt_tokens and
// completion_tokens, or input_tokens and output_tokens of the responses API
// and Anthropic, plus Anthropic's cache reads and writes. prompt and
// completion are -1 when the object does not report them. It walks the
// object's members without decoding them (this runs once per response);
// members that are not numbers (nested details, null) are ignored.
func decodeUsage(raw []byte) (prompt, completion int, ok bool) {
	if len(raw) == 0 || raw[0] != '{' {
		return -1, -1, false
	}
	pt, ct, it, ot, cache := -1, -1, -1, -1, -1
	walked := eachMember(raw, func(key, value []byte) bool {
		n, isNum := tokenCount(value)
		if !isNum {
			return true
		}
		switch string(key) {
		case "prompt_tokens":
			pt = n
		case "completion_tokens":
			ct = n
		case "input_tokens":
			it = n
		case "output_tokens":
			ot = n
		case "cache_creation_input_tokens", "cache_read_input_tokens":
			cache = max(cache, 0) + n
		}
		return true
	})
	if !walked {
		return -1, -1, false
	}
	prompt, completion = pt, ct
	if prompt < 0 {
		prompt = it
	}
	if completion < 0 {
		completion = ot
	}
	// Anthropic's input_tokens leaves out cached tokens; the prompt the
	// estimate counted includes them.
	if cache >= 0 {
		prompt = max(prompt, 0) + cache
	}
	return prompt, completion, prompt >= 0 || completion >= 0
}

// tokenCount reads a JSON number as a token count, clamped to [0, 2^31-1];
// some servers write counts as 12.0, so a fraction is truncated.
func tokenCount(v []byte) (int, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	if bytes.ContainsAny(v, "eE") {
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return 0, false
		}
		return int(max(min(f, 1<<31-1), 0)), true
	}
	neg, n := false, 0
	for i, c := range v {
		switch {
		case c == '-' && i == 0:
			neg = true
		case c >= '0' && c <= '9':
			if n < 1<<31-1 {
				n = min(n*10+int(c-'0'), 1<<31-1)
			}
		case c == '.':
			if neg {
				return 0, true
			}
			return n, true
		default:
			return 0, false
		}
	}
	if neg {
		return 0, true
	}
	return n, true
}
