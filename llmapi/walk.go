package llmapi

import (
	"bytes"
	"encoding/json"
	"sync"
	"unsafe"
)

// textRef is one separately tokenized piece of prompt text, as it stands
// in the body: a JSON string (quotes included), decoded when counted, or,
// for tool definitions and arguments given as objects, any JSON value,
// counted as its compact text.
type textRef struct {
	raw     []byte
	compact bool
	plain   bool // a string known to hold no escapes
}

// textStrings returns the texts to tokenize. A text without escapes is
// its bytes in the body, not a copy (the body is not modified while its
// Request is in use, see Request); the others are decoded into one shared
// allocation, which the caller drops once counted: a prompt of a million
// escaped one-letter strings costs one buffer, not a million strings.
func textStrings(texts []textRef) []string { return appendTextStrings(nil, texts) }

// appendTextStrings is textStrings appending to dst, so that the request
// path can reuse a pooled slice (see scratch).
func appendTextStrings(dst []string, texts []textRef) []string {
	if len(texts) == 0 {
		return dst
	}
	size := 0
	for _, t := range texts {
		if t.compact || bytes.IndexByte(t.raw, '\\') >= 0 {
			size += len(t.raw)
		}
	}
	if size == 0 {
		// The common case: nothing to decode, nothing to copy.
		for _, t := range texts {
			dst = append(dst, bodyString(stringBytes(t.raw)))
		}
		return dst
	}
	// The decoded texts, one after another in one buffer; their places
	// in dst and ends in all.
	all := make([]byte, 0, size)
	var scratch bytes.Buffer
	type decoded struct{ at, end int }
	var endsBuf [16]decoded
	ends := endsBuf[:0]
	for _, t := range texts {
		switch {
		case t.compact:
			scratch.Reset()
			if json.Compact(&scratch, t.raw) == nil {
				all = append(all, scratch.Bytes()...)
			}
		case bytes.IndexByte(t.raw, '\\') >= 0:
			if len(t.raw) >= 2 { // quoted
				all = appendUnquoted(all, t.raw[1:len(t.raw)-1])
			}
		default:
			dst = append(dst, bodyString(stringBytes(t.raw)))
			continue
		}
		// Decoded: its end in all, for now (all may still move as it
		// grows past a compacted value's estimate).
		dst = append(dst, "")
		ends = append(ends, decoded{len(dst) - 1, len(all)})
	}
	joined := bodyString(all) // all is not written again
	start := 0
	for _, d := range ends {
		dst[d.at], start = joined[start:d.end], d.end
	}
	return dst
}

// bodyString is b as a string without a copy: b is a piece of a request
// body, which nobody modifies while its Request is in use, and the
// counters neither modify nor keep what they are given.
func bodyString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// scratch is the working memory of one walk over a body: the scanner, the
// walk's path, the texts it gathers and their strings. It is pooled, so
// that parsing and estimating a request allocate only what they return
// (the Request) and the texts' one buffer; release drops every reference
// into the body, and memory a large body made it grow is not kept.
type scratch struct {
	s     scan
	req   Request // the throwaway counts of a collecting walk
	path  []seg
	texts []textRef
	strs  []string
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// Bounds on what a pooled scratch keeps: a body that needed more gets
// fresh memory next time rather than pinning its peak in the pool.
const (
	maxPooledTexts = 1 << 10
	maxPooledPath  = 64
	maxPooledKey   = 4 << 10
)

func (sc *scratch) release() {
	clear(sc.texts)
	clear(sc.strs)
	clear(sc.path)
	sc.req = Request{}
	sc.s.n = 0
	if cap(sc.s.kbuf) > maxPooledKey {
		sc.s.kbuf = nil
	}
	sc.texts, sc.strs, sc.path = sc.texts[:0], sc.strs[:0], sc.path[:0]
	if cap(sc.texts) > maxPooledTexts {
		sc.texts, sc.strs = nil, nil
	}
	if cap(sc.path) > maxPooledPath {
		sc.path = nil
	}
	scratchPool.Put(sc)
}

// walker interprets a body's members for one kind of API. Parse runs it to
// validate the body and count its messages, names and images; Estimate and
// LightMode run it again with collect set to gather the prompt texts, which
// are never kept between calls.
//
// Values that can nest without bound (content blocks within tool results)
// are walked in place, as the enclosing object is walked, so that no level
// steps over a value that an inner level then walks again; values of fixed
// depth (a message's members) are collected first and interpreted after,
// which costs one extra pass over them, once.
type walker struct {
	s       *scan
	r       *Request
	collect bool
	every   int // when collecting, keep every every-th text (0 or 1: all)
	texts   []textRef
	path    []seg // where the walk is, for error messages
	// prewalked: parseFast added the messages and the system prompt to
	// r already.
	prewalked bool
}

func (w *walker) push(name string) { w.path = append(w.path, seg{name: name}) }
func (w *walker) pushElem(i int)   { w.path = append(w.path, seg{idx: i}) }
func (w *walker) pop()             { w.path = w.path[:len(w.path)-1] }

// errorf reports a problem with the value the walk is at.
func (w *walker) errorf(format string, args ...any) *BodyError {
	return fieldError(string(appendPath(nil, w.path)), format, args...)
}

// errorIn reports a problem with the member name of the object the walk
// is at.
func (w *walker) errorIn(name, format string, args ...any) *BodyError {
	w.push(name)
	defer w.pop()
	return w.errorf(format, args...)
}

// mark is the state of a walk, restored when a speculative walk is undone.
type mark struct {
	texts, messages, names, images, tokenIDs, nTexts int
	textBytes                                        int64
}

func (w *walker) mark() mark {
	r := w.r
	return mark{len(w.texts), r.Messages, r.Names, r.Images, r.TokenIDs, r.nTexts, r.textBytes}
}

func (w *walker) reset(m mark) {
	r := w.r
	w.texts = w.texts[:m.texts]
	r.Messages, r.Names, r.Images, r.TokenIDs = m.messages, m.names, m.images, m.tokenIDs
	r.nTexts, r.textBytes = m.nTexts, m.textBytes
}

// maxTexts is the most prompt texts an estimate gathers. A body of more
// (a million one-letter prompts) has every k-th gathered and counted, and
// the count scaled by bytes: gathering all would cost tens of bytes of
// transient memory per byte of body.
const maxTexts = 1 << 16

// walkTexts walks r's body again and returns its prompt texts, every
// every-th of them (0 or 1: all).
func (r *Request) walkTexts(s *scan, every int) []textRef {
	var sc scratch
	return r.gatherTexts(s, &sc, every)
}

// gatherTexts is walkTexts with its working memory in sc, whose texts it
// returns (sc.s is not used: s may be another scanner).
func (r *Request) gatherTexts(s *scan, sc *scratch, every int) []textRef {
	if r == nil || r.body == nil || r.Kind == KindUnknown {
		return nil
	}
	var top topLevel
	if readTop(s, r.body, &top) != nil {
		return nil
	}
	sc.req = Request{Kind: r.Kind}
	w := walker{s: s, r: &sc.req, collect: true, every: every, texts: sc.texts[:0], path: sc.path[:0]}
	err := w.parse(&top)
	sc.texts, sc.path = w.texts, w.path[:0]
	if err != nil {
		return nil
	}
	return w.texts
}

func (w *walker) parse(top *topLevel) error {
	if w.r.Kind == KindUnknown {
		return nil
	}
	if err := w.settings(top); err != nil {
		return err
	}
	return w.prompt(top)
}

// settings reads the members that are not prompt: the model, streaming,
// the output cap and the number of choices. Only stream_options needs
// w.s and w.path.
func (w *walker) settings(top *topLevel) error {
	r := w.r
	var err error
	if r.Model, err = getString(top.Model, "model"); err != nil {
		return err
	}
	if r.Kind != KindEmbeddings {
		if r.Stream, err = getBool(top.Stream, "stream"); err != nil {
			return err
		}
		if err := w.parseStreamOptions(top.StreamOptions); err != nil {
			return err
		}
	}
	// The first cap present wins, in the API's order of preference.
	var caps []string
	var raws [][]byte
	switch r.Kind {
	case KindChat:
		caps = []string{"max_completion_tokens", "max_tokens"}
		raws = [][]byte{top.MaxCompletionTokens, top.MaxTokens}
	case KindCompletions, KindAnthropicMessages:
		caps, raws = []string{"max_tokens"}, [][]byte{top.MaxTokens}
	case KindResponses:
		caps, raws = []string{"max_output_tokens"}, [][]byte{top.MaxOutputTokens}
	}
	for i, raw := range raws {
		n, err := getInt(raw, caps[i])
		if err != nil {
			return err
		}
		if r.MaxOutput == 0 {
			r.MaxOutput = n
		}
	}
	switch r.Kind {
	case KindChat, KindCompletions:
		n, err := getChoices(top.N, "n")
		if err != nil {
			return err
		}
		r.Choices = n
		if r.Kind == KindCompletions {
			// best_of candidates are all generated; n of them return.
			best, err := getChoices(top.BestOf, "best_of")
			if err != nil {
				return err
			}
			r.Choices = max(n, best)
		}
	}
	return nil
}

// prompt adds the prompt's texts and counts, in the API's order.
func (w *walker) prompt(top *topLevel) error {
	switch w.r.Kind {
	case KindChat:
		if err := w.addMessages(top.Messages, false); err != nil {
			return err
		}
		w.addJSON(top.Tools)
		w.addJSON(top.Functions)
	case KindAnthropicMessages:
		if err := w.addSystem(top.System); err != nil {
			return err
		}
		if err := w.addMessages(top.Messages, true); err != nil {
			return err
		}
		w.addJSON(top.Tools)
	case KindCompletions:
		return w.addTokenInput(top.Prompt, "prompt")
	case KindEmbeddings:
		return w.addTokenInput(top.Input, "input")
	case KindResponses:
		if err := w.addInstructions(top.Instructions); err != nil {
			return err
		}
		if err := w.addResponsesInput(top.Input); err != nil {
			return err
		}
		w.addJSON(top.Tools)
	}
	return nil
}

func (w *walker) parseStreamOptions(raw []byte) error {
	if !present(raw) {
		return nil
	}
	if rawType(raw) != '{' {
		return fieldError("stream_options", "must be an object, got %s", typeName(raw))
	}
	var v [1][]byte
	w.push("stream_options")
	_, err := w.fields(raw, []string{"include_usage"}, v[:])
	w.pop()
	if err != nil {
		return err
	}
	w.r.IncludeUsage, err = getBool(v[0], "stream_options.include_usage")
	return err
}

// fields collects the raw values of the members of the object at b[0]
// named in names into vals, in the same order, and returns the object's
// end. A name given twice is an error.
func (w *walker) fields(b []byte, names []string, vals [][]byte) (int, error) {
	return w.s.object(b, 0, func(k, _ []byte, v int) (int, error) {
		e := w.s.valueEnd(b, v)
		if e < 0 {
			return -1, nil
		}
		for j, name := range names {
			if string(k) == name {
				if vals[j] != nil {
					return e, w.errorIn(name, "%s", duplicateMsg)
				}
				vals[j] = b[v:e]
				break
			}
		}
		return e, nil
	})
}

// Members of a chat or Anthropic message.
const (
	msgRole = iota
	msgContent
	msgName
	msgToolCalls
	msgFunctionCall
	msgFields
)

var messageFields = []string{"role", "content", "name", "tool_calls", "function_call"}

func (w *walker) addMessages(raw []byte, anthropic bool) error {
	if w.prewalked {
		return nil
	}
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '[':
	default:
		return fieldError("messages", "must be an array, got %s", typeName(raw))
	}
	w.push("messages")
	_, err := w.s.array(raw, 0, func(n, i int) (int, error) {
		w.pushElem(n)
		_, e, err := w.message(raw[i:], anthropic)
		w.pop()
		if e < 0 {
			return -1, err
		}
		return i + e, err
	})
	w.pop()
	return err
}

// message adds one message's prompt, from the message at b[0], and returns
// its role (decoded, nil if none) and end.
func (w *walker) message(b []byte, anthropic bool) (role []byte, end int, err error) {
	if rawType(b) != '{' {
		return nil, w.s.valueEnd(b, 0), w.errorf("must be an object, got %s", typeName(b))
	}
	var m [msgFields][]byte
	if end, err = w.fields(b, messageFields, m[:]); err != nil || end < 0 {
		return nil, end, err
	}
	if rawType(m[msgRole]) != '"' && present(m[msgRole]) {
		return nil, end, w.errorIn("role", "must be a string, got %s", typeName(m[msgRole]))
	}
	if rawType(m[msgRole]) == '"' {
		role = stringBytes(m[msgRole])
	}
	w.r.Messages++
	w.push("content")
	_, err = w.content(m[msgContent], anthropic)
	w.pop()
	if err != nil {
		return nil, end, err
	}
	if present(m[msgName]) {
		if rawType(m[msgName]) != '"' {
			return nil, end, w.errorIn("name", "must be a string, got %s", typeName(m[msgName]))
		}
		w.addText(m[msgName])
		w.r.Names++
	}
	if calls := m[msgToolCalls]; present(calls) {
		if rawType(calls) != '[' {
			return nil, end, w.errorIn("tool_calls", "must be an array, got %s", typeName(calls))
		}
		w.push("tool_calls")
		_, err = w.s.array(calls, 0, func(n, i int) (int, error) {
			w.pushElem(n)
			e, err := w.addCall(calls, i)
			w.pop()
			return e, err
		})
		w.pop()
		if err != nil {
			return nil, end, err
		}
	}
	if present(m[msgFunctionCall]) {
		w.push("function_call")
		err = w.addFunction(m[msgFunctionCall])
		w.pop()
		if err != nil {
			return nil, end, err
		}
	}
	return role, end, nil
}

// addCall adds the OpenAI tool call at b[i]: its function's name and
// arguments. It returns the call's end.
func (w *walker) addCall(b []byte, i int) (int, error) {
	e := w.s.valueEnd(b, i)
	if e < 0 {
		return -1, nil
	}
	raw := b[i:e]
	if rawType(raw) == '{' {
		var f [1][]byte
		if _, err := w.fields(raw, []string{"function"}, f[:]); err != nil {
			return e, err
		}
		if rawType(f[0]) == '{' {
			w.push("function")
			err := w.addFunction(f[0])
			w.pop()
			return e, err
		}
	}
	w.addJSON(raw)
	return e, nil
}

func (w *walker) addFunction(raw []byte) error {
	if rawType(raw) != '{' {
		w.addJSON(raw)
		return nil
	}
	var v [2][]byte
	if _, err := w.fields(raw, []string{"name", "arguments"}, v[:]); err != nil {
		return err
	}
	w.addText(v[0])
	if rawType(v[1]) == '"' {
		w.addText(v[1])
	} else {
		w.addJSON(v[1])
	}
	return nil
}

// Members of a content part or block, or of a responses input item.
const (
	partType = iota
	partText
	partRefusal
	partThinking
	partName
	partInput
	partContent
	partArguments
	partOutput
	partSummary
	partFields
)

var partNames = []string{"type", "text", "refusal", "thinking", "name", "input", "content", "arguments", "output", "summary"}

func partField(k []byte) int {
	for j, name := range partNames {
		if string(k) == name {
			return j
		}
	}
	return -1
}

// content adds the message content at b[0] and returns its end; an absent
// value (empty b) ends at 0.
func (w *walker) content(b []byte, anthropic bool) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	switch b[0] {
	case 'n':
		return w.s.valueEnd(b, 0), nil
	case '"':
		e := w.s.stringEnd(b, 0)
		if e > 0 {
			w.addText(b[:e])
		}
		return e, nil
	case '[':
		return w.s.array(b, 0, func(n, i int) (int, error) {
			w.pushElem(n)
			e, err := w.part(b[i:], anthropic)
			w.pop()
			if e < 0 {
				return -1, err
			}
			return i + e, err
		})
	}
	e := w.s.valueEnd(b, 0)
	if anthropic {
		return e, w.errorf("must be a string or an array of content blocks, got %s", typeName(b))
	}
	return e, w.errorf("must be a string, an array of content parts, or null, got %s", typeName(b))
}

// part adds the content part or block at b[0] and returns its end.
//
// A tool_result block's content is more content, which may hold further
// tool results: that is where nesting is unbounded, so the content is walked
// in place. When the block's type comes after its content in the object,
// the content is walked on speculation and its texts and errors are
// dropped if the type turns out to be another.
func (w *walker) part(b []byte, anthropic bool) (int, error) {
	if rawType(b) != '{' {
		return w.s.valueEnd(b, 0), w.errorf("must be an object, got %s", typeName(b))
	}
	var v [partFields][]byte
	var (
		walked     bool
		before     mark
		contentErr error
	)
	end, err := w.s.object(b, 0, func(k, _ []byte, i int) (int, error) {
		j := partField(k)
		if j >= 0 && v[j] != nil {
			return w.s.valueEnd(b, i), w.errorIn(partNames[j], "%s", duplicateMsg)
		}
		if j == partContent && (v[partType] == nil || stringIs(v[partType], "tool_result")) {
			before, walked = w.mark(), true
			w.push("content")
			e, err := w.content(b[i:], anthropic)
			w.pop()
			if e < 0 {
				return -1, nil
			}
			v[j], contentErr = b[i:i+e], err
			return i + e, nil
		}
		e := w.s.valueEnd(b, i)
		if j >= 0 && e >= 0 {
			v[j] = b[i:e]
		}
		return e, nil
	})
	if err == nil && present(v[partType]) && rawType(v[partType]) != '"' {
		err = w.errorIn("type", "must be a string, got %s", typeName(v[partType]))
	}
	if err == nil && stringIs(v[partType], "tool_result") {
		return end, contentErr
	}
	if walked {
		w.reset(before)
	}
	if err != nil {
		return end, err
	}
	switch string(stringBytes(v[partType])) {
	case "text", "input_text", "output_text":
		if rawType(v[partText]) != '"' {
			return end, w.errorIn("text", "must be a string, got %s", typeName(v[partText]))
		}
		w.addText(v[partText])
	case "image_url", "input_image", "image":
		w.r.Images++
	case "refusal":
		w.addText(v[partRefusal])
	case "thinking":
		w.addText(v[partThinking])
	case "tool_use", "server_tool_use":
		w.addText(v[partName])
		w.addJSON(v[partInput])
	default:
		// Audio, files, documents, redacted thinking: their cost is not
		// knowable from the body; count any text they carry.
		if rawType(v[partText]) == '"' {
			w.addText(v[partText])
		}
	}
	return end, nil
}

func (w *walker) addSystem(raw []byte) error {
	if w.prewalked {
		return nil
	}
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"', '[':
		w.r.Messages++
		w.push("system")
		_, err := w.content(raw, true)
		w.pop()
		return err
	}
	return fieldError("system", "must be a string or an array of text blocks, got %s", typeName(raw))
}

func (w *walker) addInstructions(raw []byte) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		w.r.Messages++
		w.addText(raw)
		return nil
	}
	return fieldError("instructions", "must be a string, got %s", typeName(raw))
}

func (w *walker) addResponsesInput(raw []byte) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		w.r.Messages++ // the API wraps a string input as a user message
		w.addText(raw)
		return nil
	case '[':
	default:
		return fieldError("input", "must be a string or an array of input items, got %s", typeName(raw))
	}
	w.push("input")
	_, err := w.s.array(raw, 0, func(n, i int) (int, error) {
		w.pushElem(n)
		e, err := w.addItem(raw, i)
		w.pop()
		return e, err
	})
	w.pop()
	return err
}

// addItem adds the responses input item at b[i] and returns its end. Items
// do not nest, so their members are collected first.
func (w *walker) addItem(b []byte, i int) (int, error) {
	if b[i] != '{' {
		return w.s.valueEnd(b, i), w.errorf("must be an object, got %s", typeName(b[i:]))
	}
	var v [partFields][]byte
	e, err := w.fields(b[i:], partNames, v[:])
	if e < 0 {
		return -1, err
	}
	e += i
	if err != nil {
		return e, err
	}
	if present(v[partType]) && rawType(v[partType]) != '"' {
		return e, w.errorIn("type", "must be a string, got %s", typeName(v[partType]))
	}
	switch string(stringBytes(v[partType])) {
	case "message", "":
		w.r.Messages++
		w.push("content")
		_, err = w.content(v[partContent], false)
		w.pop()
	case "function_call":
		w.addText(v[partName])
		w.addText(v[partArguments])
	case "function_call_output", "custom_tool_call_output":
		w.push("output")
		_, err = w.content(v[partOutput], false)
		w.pop()
	case "custom_tool_call":
		w.addText(v[partName])
		w.addText(v[partInput])
	case "reasoning":
		if rawType(v[partSummary]) == '[' {
			// A malformed summary is the upstream's to report; the
			// text of a well-formed one counts.
			before := w.mark()
			w.push("summary")
			if _, serr := w.content(v[partSummary], false); serr != nil {
				w.reset(before)
			}
			w.pop()
		}
	default:
		if rawType(v[partText]) == '"' {
			w.addText(v[partText])
		}
	}
	return e, err
}

// addTokenInput adds a completions prompt or an embeddings input: a
// string, an array of strings, an array of token IDs, or an array of such
// arrays.
func (w *walker) addTokenInput(raw []byte, field string) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		w.addText(raw)
		return nil
	case '[':
	default:
		return fieldError(field, "must be a string or an array, got %s", typeName(raw))
	}
	// The APIs accept only arrays of one element type.
	var first byte
	ok := true
	w.s.array(raw, 0, func(_, i int) (int, error) {
		t := raw[i]
		if first == 0 {
			first = t
		}
		switch {
		case t == '"' && first == '"':
			e := w.s.stringEnd(raw, i)
			if e > 0 {
				w.addText(raw[i:e])
			}
			return e, nil
		case t == '[' && first == '[':
			return w.s.array(raw, i, func(_, j int) (int, error) {
				e := w.s.valueEnd(raw, j)
				ok = ok && e > 0 && isTokenID(raw[j:e])
				w.r.TokenIDs++
				return e, nil
			})
		}
		e := w.s.valueEnd(raw, i)
		if e > 0 && isTokenID(raw[i:e]) && first != '"' && first != '[' {
			w.r.TokenIDs++
		} else {
			ok = false
		}
		return e, nil
	})
	if ok {
		return nil
	}
	return fieldError(field, "must be a string, an array of strings, an array of token IDs or an array of token-ID arrays, with elements of one type")
}

// addText adds a JSON string value as one text; other types are ignored,
// because callers only use it for fields whose type does not affect
// validity.
func (w *walker) addText(raw []byte) {
	if rawType(raw) == '"' && len(raw) > 2 {
		w.add(textRef{raw: raw})
	}
}

// addJSON adds a JSON value (tool definitions, tool inputs) as one text of
// its compact form: servers render them into the prompt in a form of about
// that size.
func (w *walker) addJSON(raw []byte) {
	if present(raw) {
		w.add(textRef{raw: raw, compact: true})
	}
}

// addJSON is walker.addJSON outside a walk.
func (r *Request) addJSON(raw []byte) {
	if present(raw) {
		r.keep(textRef{raw: raw, compact: true})
	}
}

// add counts a text, and keeps it when collecting (every every-th); the
// first inlineTexts are kept in the Request too.
func (w *walker) add(t textRef) {
	r := w.r
	if w.collect && (w.every <= 1 || r.nTexts%w.every == 0) {
		w.texts = append(w.texts, t)
	}
	r.keep(t)
}

// keep counts a text, and keeps it among the first.
func (r *Request) keep(t textRef) {
	if r.nTexts < len(r.texts) {
		r.texts[r.nTexts] = t
	}
	r.nTexts++
	r.textBytes += int64(len(t.raw))
}
