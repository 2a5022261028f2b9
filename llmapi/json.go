package llmapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxDepth is the deepest nesting of arrays and objects that Parse and
// LightMode accept, the body's own object counting as the first level. It
// bounds the walker's recursion and a hostile body's cost.
const MaxDepth = 64

// Options of every decoder: members the gateway does not read may repeat
// (see duplicateMsg), and strings may hold invalid UTF-8, as encoding/json
// accepts.
var decodeOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// reader reads one JSON text with a jsontext.Decoder, one token a call;
// every value it returns is a slice of that text. Its first error ends the
// read: later calls do nothing and next reports 0, so callers check err
// once, at the end.
type reader struct {
	dec  jsontext.Decoder
	src  bytes.Buffer
	text []byte
	// limit is the deepest nesting accepted (0: jsontext's own, 10000).
	limit int
	err   error
	// raw is the scalar or member name last read, start where the value
	// last begun starts.
	raw   []byte
	start int
	// unescaped holds the last member name that had to be decoded.
	unescaped []byte
}

// depthErr is the error of a reader that met a bracket nested deeper than
// its limit, at offset.
type depthErr struct{ offset int }

func (e *depthErr) Error() string { return fmt.Sprintf("nested too deep at offset %d", e.offset) }

func (r *reader) reset(text []byte, limit int) {
	r.text, r.limit, r.err, r.raw = text, limit, nil, nil
	r.src = *bytes.NewBuffer(text)
	r.dec.Reset(&r.src, decodeOptions...)
}

// next reads the next token and returns its kind: '"', '0', 't', 'f' or
// 'n' for a scalar or member name, read whole into raw; '{' or '[' for
// the start of an object or array, '}' or ']' for its end; 0 after an
// error or at the end of the text.
func (r *reader) next() jsontext.Kind {
	if r.err != nil {
		return 0
	}
	from := int(r.dec.InputOffset())
	tok, err := r.dec.ReadToken()
	if err != nil {
		r.err = err
		return 0
	}
	end := int(r.dec.InputOffset())
	k := tok.Kind()
	switch k {
	case '{', '[':
		r.start = end - 1
		if r.limit > 0 && r.dec.StackDepth() > r.limit {
			r.err = &depthErr{end - 1}
			return 0
		}
		return k
	case '}', ']':
		return k
	case '"':
		// Only white space, a colon or a comma come between the last
		// token and a string's opening quote.
		for r.text[from] != '"' {
			from++
		}
	default:
		for from = end; from > 0 && !isDelim(r.text[from-1]); from-- {
		}
	}
	r.start, r.raw = from, r.text[from:end]
	return k
}

// isDelim reports whether c may come before a number or a literal.
func isDelim(c byte) bool {
	return c <= ' ' || c == ':' || c == ',' || c == '[' || c == '{'
}

// member reads the next member name of the object being read, and reports
// false at the object's end.
func (r *reader) member() bool { return r.next() == '"' }

// element reads the start of the next element of the array being read,
// and returns its kind; 0 at the array's end.
func (r *reader) element() jsontext.Kind {
	if k := r.next(); k != ']' {
		return k
	}
	return 0
}

// name returns the member name last read, decoded as JSON decoders match
// names ("max\u005ftokens" is max_tokens). It is valid until the next
// name is decoded.
func (r *reader) name() []byte {
	raw := r.raw
	if len(raw) < 2 {
		return nil
	}
	if bytes.IndexByte(raw, '\\') >= 0 {
		r.unescaped = unquote(r.unescaped[:0], raw)
		return r.unescaped
	}
	return raw[1 : len(raw)-1]
}

// finish reads the rest of the value begun with a token of kind k and
// returns the value as it stands in the text; nil after an error.
func (r *reader) finish(k jsontext.Kind) []byte {
	switch k {
	case 0:
		return nil
	case '{', '[':
		start, depth := r.start, r.dec.StackDepth()
		for r.dec.StackDepth() >= depth && r.step() {
		}
		return r.since(start)
	}
	return r.raw
}

// step reads the next token inside a value being stepped over, and
// reports whether there was one.
func (r *reader) step() bool {
	tok, err := r.dec.ReadToken()
	switch {
	case err != nil:
		r.err = err
		return false
	case r.limit > 0 && r.dec.StackDepth() > r.limit && (tok.Kind() == '{' || tok.Kind() == '['):
		r.err = &depthErr{int(r.dec.InputOffset()) - 1}
		return false
	}
	return true
}

// since returns the text from start to where the reader is, nil after an
// error.
func (r *reader) since(start int) []byte {
	if r.err != nil {
		return nil
	}
	return r.text[start:r.dec.InputOffset()]
}

// value reads the next value whole. Without a limit to check, jsontext
// steps over it in one call.
func (r *reader) value() []byte {
	if r.limit > 0 || r.err != nil {
		return r.finish(r.next())
	}
	v, err := r.dec.ReadValue()
	if err != nil {
		r.err = err
		return nil
	}
	end := int(r.dec.InputOffset())
	return r.text[end-len(v) : end]
}

// skip steps over the next value.
func (r *reader) skip() { r.value() }

// firstTooDeep returns the offset in text, one JSON value, of its first
// bracket nested deeper than limit levels, or -1.
func firstTooDeep(text []byte, limit int) int {
	var r reader
	r.reset(text, limit)
	for r.next() != 0 {
	}
	var deep *depthErr
	if errors.As(r.err, &deep) {
		return deep.offset
	}
	return -1
}

// end reads the end of the text: nothing but white space may follow the
// value read.
func (r *reader) end() {
	if r.err != nil {
		return
	}
	if _, err := r.dec.ReadToken(); err == nil {
		r.err = errTrailing
	} else if err != io.EOF {
		r.err = err
	}
}

var errTrailing = errors.New("a second value after the first")

// readers is a stack of readers: a walk reads a value kept from the text
// with the next reader while the one below is still reading. It counts the
// bytes its readers are given, which tests hold to a small multiple of the
// body: no byte is handed to readers more than a fixed number of times,
// however deep the body nests.
type readers struct {
	first reader // most walks need no other
	more  []*reader
	depth int
	used  int // the readers opened since release
	n     int // bytes read
}

// open returns a reader of text, with the given depth limit (0: none;
// text read by an earlier reader has been checked).
func (rs *readers) open(text []byte, limit int) *reader {
	r := &rs.first
	if rs.depth > 0 {
		if rs.depth > len(rs.more) {
			rs.more = append(rs.more, new(reader))
		}
		r = rs.more[rs.depth-1]
	}
	rs.depth++
	rs.used = max(rs.used, rs.depth)
	rs.n += len(text)
	r.reset(text, limit)
	return r
}

// close returns the reader last opened.
func (rs *readers) close() { rs.depth-- }

// release drops every reference to what the readers read.
func (rs *readers) release() {
	if rs.used > 0 {
		rs.first.reset(nil, 0)
		for _, r := range rs.more[:rs.used-1] {
			r.reset(nil, 0)
		}
	}
	rs.depth, rs.used, rs.n = 0, 0, 0
}

// members calls f with each member name (decoded, valid during the call)
// and raw value of the object raw, and reports whether raw is one; raw
// that is not an object has none.
func (rs *readers) members(raw []byte, f func(name, value []byte)) bool {
	if rawType(raw) != '{' {
		return false
	}
	r := rs.open(raw, 0)
	defer rs.close()
	r.next()
	for r.member() {
		name := r.name()
		if v := r.value(); v != nil {
			f(name, v)
		}
	}
	return r.err == nil
}

// member returns the raw value of the last member named key of the object
// raw (JSON's last-wins rule), or nil.
func (rs *readers) member(raw []byte, key string) []byte {
	var v []byte
	rs.members(raw, func(k, val []byte) {
		if string(k) == key {
			v = val
		}
	})
	return v
}

// each calls f with each raw element of the array raw.
func (rs *readers) each(raw []byte, f func(elem []byte)) {
	if rawType(raw) != '[' {
		return
	}
	r := rs.open(raw, 0)
	defer rs.close()
	r.next()
	for {
		k := r.element()
		if k == 0 {
			return
		}
		f(r.finish(k))
	}
}

// unquote appends the contents of the JSON string raw (quotes included),
// decoded, to dst. A decoder has read raw, so its escapes are well formed;
// runs between them are copied whole (faster than jsontext.AppendUnquote
// on non-ASCII text). An unpaired surrogate becomes U+FFFD.
func unquote(dst, raw []byte) []byte {
	s := raw[1 : len(raw)-1]
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		c := s[i+1]
		s = s[i+2:]
		switch c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hexRune(s)
			s = s[4:]
			if utf16.IsSurrogate(r) && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
				if pair := utf16.DecodeRune(r, hexRune(s[2:])); pair != utf8.RuneError {
					r, s = pair, s[6:]
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
	}
}

// hexRune reads the four hex digits of a \u escape.
func hexRune(b []byte) rune {
	n, _ := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n)
}

// rawType returns the first byte of a JSON value ('{', '[', '"', 't', 'f',
// 'n', or a number's first character), or 0 for an absent value. Values
// are kept without the white space around them.
func rawType(raw []byte) byte {
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// present reports whether a member was given a value other than null.
func present(raw []byte) bool {
	t := rawType(raw)
	return t != 0 && t != 'n'
}

// typeName names the JSON type that starts with c (see rawType), for
// error messages.
func typeName(c byte) string {
	switch c {
	case 0:
		return "nothing"
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
