package llmapi

import (
	"bytes"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A minimal JSON scanner for the request path and for response bodies and
// stream chunks, where only a few members matter: walking bytes is several
// times faster than reflection-based decoding and allocates nothing. It
// trusts its input to be JSON; on anything else it stops early, never
// panics, and callers fall back to encoding/json or ignore the value.
//
// Every walk is linear: each primitive advances over the bytes it is given
// once, and the request parser (parse.go) descends into the values it
// interprets in place, so that no enclosing level skips a value again that
// an inner level walks (see scan.n).

// MaxDepth is the deepest nesting of arrays and objects that Parse and
// LightMode accept, the body's own object counting as the first level. No
// API the gateway understands needs more than a dozen; the cap keeps the
// parser's recursion, and a hostile body's cost, bounded.
const MaxDepth = 64

// scan counts the work of one walk over a body. Tests and fuzz targets hold
// n, the bytes that the primitives below advanced over, to a small multiple
// of the body's size: that is what makes parsing linear whatever the
// nesting. Counting costs one addition per primitive call.
type scan struct {
	n    int
	kbuf []byte // holds the last escaped key decoded (see key)
}

func (s *scan) skipWS(b []byte, i int) int {
	j := i
	for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
		j++
	}
	s.n += j - i
	return j
}

// stringEnd returns the index just past the string starting at b[i] == '"',
// or -1. Most strings (keys, roles, types, short texts) end within a word
// or two without an escape: it looks for the closing quote eight bytes at a
// time, and leaves a string with an escape, or longer than 64 bytes, to
// stringEndFrom.
func (s *scan) stringEnd(b []byte, i int) int {
	j := i + 1
	for j+8 <= len(b) && j-i <= 64 {
		x := load64(b, j)
		if m := hasByte(x, '"') | hasByte(x, '\\'); m != 0 {
			k := j + bits.TrailingZeros64(m)>>3
			if b[k] == '"' {
				s.n += k + 1 - i
				return k + 1
			}
			return s.stringEndFrom(b, i, k)
		}
		j += 8
	}
	return s.stringEndFrom(b, i, j)
}

// stringEndFrom is stringEnd for the string starting at b[i], carried on
// from b[j], where a character starts. It looks word by word for the next
// quote or backslash over 32 bytes, then jumps from quote to quote with
// bytes.IndexByte and counts the backslashes before each: a quote preceded
// by an odd number of them is escaped. After an escaped quote it looks
// word by word again, so that a string dense with them does not cost a
// jump per quote.
func (s *scan) stringEndFrom(b []byte, i, j int) int {
	for {
		// b[j] starts a character.
		for lim := min(len(b), j+32); j < lim; {
			j = quoteOrEscape(b, j, lim)
			if j >= lim {
				break
			}
			if b[j] == '"' {
				s.n += j + 1 - i
				return j + 1
			}
			j += 2 // a backslash and the character it escapes
		}
		if j >= len(b) {
			s.n += len(b) - i
			return -1
		}
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			s.n += len(b) - i
			return -1
		}
		q := j + k
		p := q - 1
		for p > i && b[p] == '\\' {
			p--
		}
		s.n += q - p // the backslashes are looked at twice
		if (q-1-p)%2 == 0 {
			s.n += q + 1 - i
			return q + 1
		}
		j = q + 1 // b[q] is escaped
	}
}

// valueEnd returns the index just past the value starting at b[i], or -1.
func (s *scan) valueEnd(b []byte, i int) int {
	e, _ := s.valueEndDepth(b, i, -1)
	return e
}

// valueEndDepth is valueEnd that refuses nesting: when the value holds more
// than room levels of arrays and objects (itself included), it returns -1
// and the offset of the first bracket too deep; deep is -1 otherwise. A
// negative room is no limit.
func (s *scan) valueEndDepth(b []byte, i, room int) (end, deep int) {
	if i >= len(b) {
		return -1, -1
	}
	switch b[i] {
	case '"':
		return s.stringEnd(b, i), -1
	case '{', '[':
		depth := 0
		from := i
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				s.n += j - from
				e := s.stringEnd(b, j)
				if e < 0 {
					return -1, -1
				}
				j, from = e-1, e
			case '{', '[':
				depth++
				if depth > room && room >= 0 {
					s.n += j + 1 - from
					return -1, j
				}
			case '}', ']':
				depth--
				if depth == 0 {
					s.n += j + 1 - from
					return j + 1, -1
				}
			}
		}
		s.n += len(b) - from
		return -1, -1
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			s.n += j - i
			if j == i {
				return -1, -1
			}
			return j, -1
		}
		j++
	}
	s.n += j - i
	return j, -1
}

// key returns the member name of the raw key (between its quotes): the raw
// bytes themselves, or, for a key written with escapes ("max\u005ftokens"),
// its decoded form, so that keys are matched as JSON decoders match them.
// A decoded key is only valid until the next key is decoded with s.
func (s *scan) key(raw []byte) []byte {
	s.n += len(raw)
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	s.n += len(raw)
	s.kbuf = appendUnquoted(s.kbuf[:0], raw)
	return s.kbuf
}

// object walks the object starting at b[i] == '{'. For each member it calls
// f with the decoded key, the raw key (between its quotes, escapes intact)
// and the index of the value; f returns the index
// just past the value, or -1 when it could not find it. After f returns an
// error, the remaining members are stepped over and the first error is
// returned, with the object's end: a caller that discards the error (see
// part) can carry on from there without walking the object again. end is
// -1 for anything that is not a well-formed object.
func (s *scan) object(b []byte, i int, f func(key, rawKey []byte, v int) (int, error)) (end int, err error) {
	if i >= len(b) || b[i] != '{' {
		return -1, nil
	}
	i = s.skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return -1, err
		}
		ke := s.stringEnd(b, i)
		if ke < 0 {
			return -1, err
		}
		k := b[i+1 : ke-1]
		i = s.skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return -1, err
		}
		i = s.skipWS(b, i+1)
		var ve int
		if err == nil {
			ve, err = f(s.key(k), k, i)
		} else {
			ve = s.valueEnd(b, i)
		}
		if ve < 0 {
			return -1, err
		}
		i = s.skipWS(b, ve)
		if i >= len(b) {
			return -1, err
		}
		switch b[i] {
		case ',':
			i = s.skipWS(b, i+1)
		case '}':
			return i + 1, err
		default:
			return -1, err
		}
	}
	return -1, err
}

// array walks the array starting at b[i] == '[' as object walks an object,
// calling f with each element's position in the array and its index in b.
func (s *scan) array(b []byte, i int, f func(n, e int) (int, error)) (end int, err error) {
	if i >= len(b) || b[i] != '[' {
		return -1, nil
	}
	i = s.skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for n := 0; i < len(b); n++ {
		var ee int
		if err == nil {
			ee, err = f(n, i)
		} else {
			ee = s.valueEnd(b, i)
		}
		if ee < 0 {
			return -1, err
		}
		i = s.skipWS(b, ee)
		if i >= len(b) {
			return -1, err
		}
		switch b[i] {
		case ',':
			i = s.skipWS(b, i+1)
		case ']':
			return i + 1, err
		default:
			return -1, err
		}
	}
	return -1, err
}

// eachMember calls f with the decoded key (valid during the call only), the
// raw key and the raw value of each member of the object in b, until f
// returns false. It reports whether b held an object that was walked to its
// end or to where f stopped.
func (s *scan) eachMember(b []byte, f func(key, rawKey, value []byte) bool) bool {
	i := s.skipWS(b, 0)
	stopped := false
	end, _ := s.object(b, i, func(k, rk []byte, v int) (int, error) {
		e := s.valueEnd(b, v)
		if e >= 0 && !f(k, rk, b[v:e]) {
			stopped = true
			return -1, nil
		}
		return e, nil
	})
	return end >= 0 || stopped
}

// member returns the raw value of the last member named key of the object
// in b (JSON's last-wins rule), or nil. It is eachMember's walk without
// its closures, and it decodes a key only when it could be key written
// with escapes: it runs on every response and every stream chunk.
func (s *scan) member(b []byte, key string) []byte {
	var v []byte
	i := s.skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil
	}
	i = s.skipWS(b, i+1)
	for i < len(b) && b[i] == '"' {
		ke := s.stringEnd(b, i)
		if ke < 0 {
			return v
		}
		k := b[i+1 : ke-1]
		i = s.skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return v
		}
		i = s.skipWS(b, i+1)
		e := s.valueEnd(b, i)
		if e < 0 {
			return v
		}
		// A raw key of key's length is key only as it stands; an escape
		// makes a raw key longer than what it decodes to.
		if len(k) == len(key) && string(k) == key || len(k) > len(key) && string(s.key(k)) == key {
			v = b[i:e]
		}
		if i = s.skipWS(b, e); i >= len(b) || b[i] != ',' {
			return v
		}
		i = s.skipWS(b, i+1)
	}
	return v
}

// eachElement calls f with each raw element of the array in b.
func (s *scan) eachElement(b []byte, f func(elem []byte)) {
	s.array(b, s.skipWS(b, 0), func(_, i int) (int, error) {
		e := s.valueEnd(b, i)
		if e >= 0 {
			f(b[i:e])
		}
		return e, nil
	})
}

// elements returns the raw elements of the JSON array raw.
func (s *scan) elements(raw []byte) [][]byte {
	var a [][]byte
	s.eachElement(raw, func(e []byte) { a = append(a, e) })
	return a
}

// appendString appends the decoded JSON string raw (quotes included) to
// dst. Other values append nothing.
func appendString(dst, raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst
	}
	return appendUnquoted(dst, raw[1:len(raw)-1])
}

// appendUnquoted appends the decoded contents s of a JSON string (between
// its quotes) to dst.
func appendUnquoted(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			// The run up to the next escape, in one copy.
			n := bytes.IndexByte(s[i:], '\\')
			if n < 0 {
				n = len(s) - i
			}
			dst = append(dst, s[i:i+n]...)
			i += n - 1
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
func decodeUsage(s *scan, raw []byte) (prompt, completion int, ok bool) {
	if len(raw) == 0 || raw[0] != '{' {
		return -1, -1, false
	}
	pt, ct, it, ot, cache := -1, -1, -1, -1, -1
	walked := s.eachMember(raw, func(key, _, value []byte) bool {
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
	return combineUsage(pt, ct, it, ot, cache)
}

// combineUsage makes a usage object's token counts (-1: absent) into the
// prompt and completion an answer reports: OpenAI's prompt_tokens and
// completion_tokens, else Anthropic's input_tokens and output_tokens; ok
// when either is known.
func combineUsage(pt, ct, it, ot, cache int) (prompt, completion int, ok bool) {
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

// hasExponent reports whether v holds an e or E, with no call: token
// counts are a few digits.
func hasExponent(v []byte) bool {
	for _, c := range v {
		if c|0x20 == 'e' {
			return true
		}
	}
	return false
}

// tokenCount reads a JSON number as a token count, clamped to [0, 2^31-1];
// some servers write counts as 12.0, so a fraction is truncated.
func tokenCount(v []byte) (int, bool) {
	if n, ok := smallInt(v); ok {
		return min(n, 1<<31-1), true
	}
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	if hasExponent(v) {
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
