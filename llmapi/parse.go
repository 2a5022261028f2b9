package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Fixed token costs used where text is not counted.
const (
	// ImageTokens is charged per image part. It is OpenAI's price of a
	// low-detail image; a high-detail one costs more, but its real price
	// depends on pixel sizes the gateway does not decode, and the
	// upstream's reported usage corrects the estimate afterwards.
	ImageTokens = 85
	// MessageOverhead is charged per chat message: the 3 tokens of
	// framing OpenAI documents for its chat formats, plus 1 for the
	// role, which is a single token for every standard role.
	MessageOverhead = 4
	// ReplyPriming is charged once per chat-style request for the tokens
	// that open the assistant's reply.
	ReplyPriming = 3
)

// MaxChoices is the largest n (and best_of) a request may ask for: OpenAI's
// own limit for n. Each choice is generated in full, so the output cap is
// multiplied by it; a larger count is refused rather than clamped, because
// the upstream would generate what the client asked for.
const MaxChoices = 128

// Request is what the gateway needs to know about a request body to
// schedule it.
//
// A Request parsed from a body refers to that body instead of copying its
// prompt: Estimate reads the prompt text from it, so that a queued request
// costs its body and a fixed few hundred bytes, not its prompt twice. The
// caller must therefore neither modify nor reuse the body while the Request
// is in use.
type Request struct {
	Kind Kind
	// Inferred reports that the path did not name an API and Kind was
	// guessed from the body's shape.
	Inferred bool
	Model    string
	Stream   bool
	// IncludeUsage is stream_options.include_usage: an OpenAI-style
	// stream carries usage only when the client asked for it.
	IncludeUsage bool
	// MaxOutput is the client's output cap per choice
	// (max_completion_tokens, max_tokens or max_output_tokens, as the API
	// names it), 0 if absent. Caps beyond CostLimit saturate at it.
	MaxOutput int
	// Choices is how many completions the upstream generates: the larger
	// of n and best_of where the API has them (chat, completions), else 1.
	Choices int

	// Messages counts chat-style messages, system prompts and responses
	// input messages; each costs MessageOverhead.
	Messages int
	// Names counts "name" fields on messages; each costs one token on top
	// of its text, as OpenAI documents.
	Names int
	// Images counts image parts; each costs ImageTokens.
	Images int
	// TokenIDs counts prompt tokens given as token-ID arrays.
	TokenIDs int

	body   []byte // the body parsed, which holds the prompt text
	noBody bool
}

// Texts returns the prompt text, one entry per separately tokenized string
// (message contents, names, tool calls, tool definitions), decoded from
// the body. It copies every string, on every call: it is meant for tests
// and diagnostics, not for the request path.
func (r *Request) Texts() []string {
	var s scan
	return textStrings(r.walkTexts(&s))
}

// BodyError reports a request body the gateway cannot use. Its message is
// written for the API client, to be returned in a 400 response.
type BodyError struct {
	// Field is the JSON path of the offending value, such as
	// "messages[2].content"; empty when the problem is the body as a whole.
	Field string
	// Msg says what is wrong; when Field is set, it reads as a predicate
	// of the field ("must be a string, got number").
	Msg string
	// Offset is the byte offset of a JSON syntax error or of the bracket
	// that nests too deep, -1 otherwise.
	Offset int64
	// Err is the underlying decoding error, if any.
	Err error
}

// Error returns the message for the client, naming the field first.
func (e *BodyError) Error() string {
	if e.Field != "" {
		return strconv.Quote(e.Field) + " " + e.Msg
	}
	return e.Msg
}

// Unwrap returns the underlying decoding error, for errors.As.
func (e *BodyError) Unwrap() error { return e.Err }

// seg is one step of the JSON path to the value a walker is at. The path
// is a stack on the walker, turned into a string only when an error names
// it: no string is built per message or part.
type seg struct {
	name string // member name; "" for an array element
	idx  int
}

func appendPath(b []byte, segs []seg) []byte {
	for _, sg := range segs {
		if sg.name == "" {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(sg.idx), 10)
			b = append(b, ']')
			continue
		}
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, sg.name...)
	}
	return b
}

func fieldError(field, format string, args ...any) *BodyError {
	return &BodyError{Field: field, Msg: fmt.Sprintf(format, args...), Offset: -1}
}

// duplicateError refuses a member given twice. JSON decoders disagree on
// duplicates (Go's and Python's keep the last, others the first), so a body
// with two max_tokens could be estimated with one and served with the
// other; refusing it is the only way to see what the upstream will.
func duplicateError(field string) *BodyError {
	return fieldError(field, "%s", duplicateMsg)
}

const duplicateMsg = "appears more than once in the same object (keys are compared after decoding escapes such as \\u005f); send it once"

func depthError(off int) *BodyError {
	return &BodyError{
		Msg:    fmt.Sprintf("request body is nested deeper than %d levels of arrays and objects (at offset %d); flatten it", MaxDepth, off),
		Offset: int64(off),
	}
}

// topLevel holds the raw values of interest of every supported API, as
// subslices of the body: decoding waits until the kind is known, and a value
// of the wrong type is reported with a clear message instead of a
// reflection error.
type topLevel struct {
	Model               []byte
	Stream              []byte
	StreamOptions       []byte
	MaxTokens           []byte
	MaxCompletionTokens []byte
	MaxOutputTokens     []byte
	N                   []byte
	BestOf              []byte
	Messages            []byte
	System              []byte
	Prompt              []byte
	Input               []byte
	Instructions        []byte
	Tools               []byte
	Functions           []byte

	// Only used to infer the kind when the path does not name it.
	AnthropicVersion   []byte
	StopSequences      []byte
	PreviousResponseID []byte
	EncodingFormat     []byte
	Dimensions         []byte
}

// slot returns where the member named key goes, or nil for members the
// gateway does not read.
func (t *topLevel) slot(key []byte) *[]byte {
	switch string(key) {
	case "model":
		return &t.Model
	case "stream":
		return &t.Stream
	case "stream_options":
		return &t.StreamOptions
	case "max_tokens":
		return &t.MaxTokens
	case "max_completion_tokens":
		return &t.MaxCompletionTokens
	case "max_output_tokens":
		return &t.MaxOutputTokens
	case "n":
		return &t.N
	case "best_of":
		return &t.BestOf
	case "messages":
		return &t.Messages
	case "system":
		return &t.System
	case "prompt":
		return &t.Prompt
	case "input":
		return &t.Input
	case "instructions":
		return &t.Instructions
	case "tools":
		return &t.Tools
	case "functions":
		return &t.Functions
	case "anthropic_version":
		return &t.AnthropicVersion
	case "stop_sequences":
		return &t.StopSequences
	case "previous_response_id":
		return &t.PreviousResponseID
	case "encoding_format":
		return &t.EncodingFormat
	case "dimensions":
		return &t.Dimensions
	}
	return nil
}

// Parse reads a request body sent to path. The kind comes from the path's
// suffix; for other paths it is inferred from the body's shape, and a body
// of no known shape yields KindUnknown with an empty prompt. An empty body is
// an error for the known APIs and fine otherwise (GET /v1/models).
//
// Errors are *BodyError: invalid JSON, nesting deeper than MaxDepth, a
// member the gateway reads given twice, and values of the wrong type, which
// make the cost unknowable. Missing fields are not errors; the upstream
// reports those in its own words.
//
// Parse never modifies body, and its work is linear in len(body) whatever
// the nesting. The Request refers to body (see Request).
func Parse(path string, body []byte) (*Request, error) {
	var s scan
	return parse(&s, path, body)
}

func parse(s *scan, path string, body []byte) (*Request, error) {
	kind := KindFromPath(path)
	if len(bytes.TrimSpace(body)) == 0 {
		if kind == KindUnknown {
			return &Request{noBody: true, Choices: 1}, nil
		}
		return nil, &BodyError{Msg: "request body is empty; expected a JSON object", Offset: -1}
	}
	if err := validate(body); err != nil {
		return nil, err
	}
	var top topLevel
	if err := readTop(s, body, &top); err != nil {
		return nil, err
	}
	req := &Request{Kind: kind, Choices: 1, body: body}
	if kind == KindUnknown {
		req.Kind = inferKind(&top)
		req.Inferred = req.Kind != KindUnknown
	}
	w := walker{s: s, r: req}
	if err := w.parse(&top); err != nil {
		return nil, err
	}
	return req, nil
}

// validate checks that body is one JSON object.
func validate(body []byte) error {
	if !json.Valid(body) {
		// Only now pay for a decode, to learn where the error is.
		var v struct{}
		err := json.Unmarshal(body, &v)
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return syntaxError(body, syn)
		}
		return &BodyError{Msg: "request body is not valid JSON", Offset: -1, Err: err}
	}
	if rawType(body) != '{' {
		return &BodyError{Msg: "request body must be a JSON object, got " + typeName(body), Offset: -1}
	}
	return nil
}

// readTop collects the top-level members of a valid body. Stepping over
// every member's value visits every byte of the body once, so this is also
// where nesting is measured.
func readTop(s *scan, body []byte, top *topLevel) error {
	i := s.skipWS(body, 0)
	_, err := s.object(body, i, func(k, _ []byte, v int) (int, error) {
		e, deep := s.valueEndDepth(body, v, MaxDepth-1)
		if deep >= 0 {
			return -1, depthError(deep)
		}
		slot := top.slot(k)
		if slot == nil || e < 0 {
			return e, nil
		}
		if *slot != nil {
			return e, duplicateError(string(k))
		}
		*slot = body[v:e]
		return e, nil
	})
	return err
}

func syntaxError(body []byte, syn *json.SyntaxError) *BodyError {
	// encoding/json counts the offending byte in Offset.
	off := max(syn.Offset-1, 0)
	if strings.HasSuffix(syn.Error(), "exceeded max depth") {
		// encoding/json stops at 10000 levels, long past MaxDepth:
		// report where MaxDepth was passed.
		var s scan
		if _, deep := s.valueEndDepth(body, s.skipWS(body, 0), MaxDepth); deep >= 0 {
			return depthError(deep)
		}
		return depthError(int(off))
	}
	if syn.Offset >= int64(len(body)) && syn.Error() == "unexpected end of JSON input" {
		return &BodyError{
			Msg:    "request body is not valid JSON: it ends in the middle of a value (truncated?)",
			Offset: int64(len(body)), Err: syn,
		}
	}
	line := 1 + bytes.Count(body[:off], []byte{'\n'})
	col := off - int64(bytes.LastIndexByte(body[:off], '\n'))
	return &BodyError{
		Msg:    fmt.Sprintf("request body is not valid JSON: %s at offset %d (line %d, column %d)", syn.Error(), off, line, col),
		Offset: off, Err: syn,
	}
}

func inferKind(top *topLevel) Kind {
	switch {
	case rawType(top.Messages) == '[':
		// OpenAI chat puts system prompts among the messages; these
		// fields exist only in Anthropic's API.
		if present(top.System) || present(top.AnthropicVersion) || present(top.StopSequences) {
			return KindAnthropicMessages
		}
		return KindChat
	case present(top.Prompt):
		return KindCompletions
	case present(top.Input):
		if present(top.Instructions) || present(top.MaxOutputTokens) || present(top.PreviousResponseID) {
			return KindResponses
		}
		if present(top.EncodingFormat) || present(top.Dimensions) {
			return KindEmbeddings
		}
		if rawType(top.Input) == '[' {
			// Responses input lists items (objects); embeddings input
			// lists strings or token IDs.
			if first := firstElement(top.Input); first != nil {
				if rawType(first) == '{' {
					return KindResponses
				}
				return KindEmbeddings
			}
		}
	}
	return KindUnknown
}

// textRef is one separately tokenized piece of prompt text, as it stands
// in the body: a JSON string (quotes included), decoded when counted, or,
// for tool definitions and arguments given as objects, any JSON value,
// counted as its compact text.
type textRef struct {
	raw     []byte
	compact bool
}

// String returns the text that is tokenized.
func (t textRef) String() string {
	if !t.compact {
		return decodeString(t.raw)
	}
	var b bytes.Buffer
	b.Grow(len(t.raw))
	if json.Compact(&b, t.raw) != nil {
		return ""
	}
	return b.String()
}

// textStrings returns the texts to tokenize. They share one allocation,
// which the caller drops once counted: a prompt of a million one-letter
// strings costs one buffer, not a million strings.
func textStrings(texts []textRef) []string {
	if len(texts) == 0 {
		return nil
	}
	size := 0
	for _, t := range texts {
		size += len(t.raw)
	}
	var all strings.Builder
	all.Grow(size)
	var scratch bytes.Buffer
	ends := make([]int, len(texts))
	for i, t := range texts {
		switch {
		case t.compact:
			scratch.Reset()
			if json.Compact(&scratch, t.raw) == nil {
				all.Write(scratch.Bytes())
			}
		default:
			all.Write(stringBytes(t.raw))
		}
		ends[i] = all.Len()
	}
	joined := all.String() // no copy
	out := make([]string, len(texts))
	start := 0
	for i, e := range ends {
		out[i], start = joined[start:e], e
	}
	return out
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
	texts   []textRef
	path    []seg // where the walk is, for error messages
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
	texts, messages, names, images, tokenIDs int
}

func (w *walker) mark() mark {
	r := w.r
	return mark{len(w.texts), r.Messages, r.Names, r.Images, r.TokenIDs}
}

func (w *walker) reset(m mark) {
	r := w.r
	w.texts = w.texts[:m.texts]
	r.Messages, r.Names, r.Images, r.TokenIDs = m.messages, m.names, m.images, m.tokenIDs
}

// walkTexts walks r's body again and returns its prompt texts.
func (r *Request) walkTexts(s *scan) []textRef {
	if r == nil || r.body == nil || r.Kind == KindUnknown {
		return nil
	}
	var top topLevel
	if readTop(s, r.body, &top) != nil {
		return nil
	}
	w := walker{s: s, r: &Request{Kind: r.Kind}, collect: true}
	if w.parse(&top) != nil {
		return nil
	}
	return w.texts
}

func (w *walker) parse(top *topLevel) error {
	r := w.r
	if r.Kind == KindUnknown {
		return nil
	}
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

	switch r.Kind {
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
	if w.collect && rawType(raw) == '"' && len(raw) > 2 {
		w.texts = append(w.texts, textRef{raw: raw})
	}
}

// addJSON adds a JSON value (tool definitions, tool inputs) as one text of
// its compact form: servers render them into the prompt in a form of about
// that size.
func (w *walker) addJSON(raw []byte) {
	if w.collect && present(raw) {
		w.texts = append(w.texts, textRef{raw: raw, compact: true})
	}
}

// rawType returns the first byte of a JSON value ('{', '[', '"', 't', 'f',
// 'n', or a number's first character), or 0 for an absent value.
func rawType(raw []byte) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

func present(raw []byte) bool {
	t := rawType(raw)
	return t != 0 && t != 'n'
}

func typeName(raw []byte) string {
	switch rawType(raw) {
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

func getString(raw []byte, field string) (string, error) {
	switch rawType(raw) {
	case 0, 'n':
		return "", nil
	case '"':
		return decodeString(raw), nil
	}
	return "", fieldError(field, "must be a string, got %s", typeName(raw))
}

// stringIs reports whether raw is the JSON string s, without allocating
// unless raw holds escapes.
func stringIs(raw []byte, s string) bool {
	if len(raw) < 2 || raw[0] != '"' {
		return false
	}
	return string(stringBytes(raw)) == s
}

func getBool(raw []byte, field string) (bool, error) {
	switch rawType(raw) {
	case 0, 'n':
		return false, nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	}
	return false, fieldError(field, "must be a boolean, got %s", typeName(raw))
}

// getInt reads a non-negative integer token count. Integral floats (100.0,
// 1e3) are accepted, as the Python servers behind these APIs do. Values
// beyond CostLimit, up to 1e300 and beyond, saturate at CostLimit: such a
// cap is as good as none, and saturating keeps all cost arithmetic far
// from overflow.
func getInt(raw []byte, field string) (int, error) {
	switch t := rawType(raw); {
	case t == 0 || t == 'n':
		return 0, nil
	case t == '-' || t >= '0' && t <= '9':
		f, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
		if err != nil && math.IsInf(f, 1) {
			return CostLimit, nil // beyond float64: 1e400
		}
		if err == nil && f >= 0 && f == math.Trunc(f) {
			return int(min(f, CostLimit)), nil
		}
		return 0, fieldError(field, "must be a non-negative integer, got %s", clip(bytes.TrimSpace(raw)))
	}
	return 0, fieldError(field, "must be a non-negative integer, got %s", typeName(raw))
}

// getChoices reads n or best_of: 1 when absent, else an integer from 1 to
// MaxChoices.
func getChoices(raw []byte, field string) (int, error) {
	switch t := rawType(raw); {
	case t == 0 || t == 'n':
		return 1, nil
	case t == '-' || t >= '0' && t <= '9':
		f, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
		switch {
		case (err == nil || math.IsInf(f, 1)) && f > MaxChoices && f == math.Trunc(f):
			return 0, fieldError(field, "must be at most %d, got %s", MaxChoices, clip(bytes.TrimSpace(raw)))
		case err == nil && f >= 1 && f == math.Trunc(f):
			return int(f), nil
		}
		return 0, fieldError(field, "must be a positive integer, got %s", clip(bytes.TrimSpace(raw)))
	}
	return 0, fieldError(field, "must be a positive integer, got %s", typeName(raw))
}

// clip shortens a number quoted in an error message: a client that sends
// a megabyte of digits gets them back abbreviated.
func clip(b []byte) string {
	const n = 40
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// stringBytes returns the contents of a JSON string value (quotes
// included), decoded; it allocates only for a string with escapes, so that
// switching on string(stringBytes(raw)) allocates nothing.
func stringBytes(raw []byte) []byte {
	if len(raw) < 2 {
		return nil
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		return in
	}
	return appendUnquoted(make([]byte, 0, len(in)), in)
}

// decodeString decodes a JSON string value (quotes included).
func decodeString(raw []byte) string {
	if len(raw) < 2 {
		return ""
	}
	if bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 {
		return string(raw[1 : len(raw)-1])
	}
	return string(appendString(make([]byte, 0, len(raw)), raw))
}

// firstElement returns the first element of a JSON array, or nil.
func firstElement(raw []byte) []byte {
	var s scan
	var first []byte
	s.array(raw, s.skipWS(raw, 0), func(_, i int) (int, error) {
		e := s.valueEnd(raw, i)
		if e > 0 {
			first = raw[i:e]
		}
		return -1, nil // stop: only the first is wanted
	})
	return first
}

// isTokenID reports whether raw is an integer literal.
func isTokenID(raw []byte) bool {
	if len(raw) > 0 && raw[0] == '-' {
		raw = raw[1:]
	}
	if len(raw) == 0 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
