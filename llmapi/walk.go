package llmapi

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// textRef is one separately tokenized piece of prompt text in the body: a
// JSON string (quotes included), or, when compact, any JSON value.
type textRef struct {
	raw     []byte
	compact bool
}

// textStrings appends the texts to tokenize to dst, copied out of the body
// into one allocation, so a million tiny strings cost one buffer.
func textStrings(dst []string, texts []textRef) []string {
	if len(texts) == 0 {
		return dst
	}
	size := 0
	for _, t := range texts {
		size += len(t.raw)
	}
	var all strings.Builder
	all.Grow(size)
	var buf []byte
	var compact *bytes.Buffer
	for _, t := range texts {
		start := all.Len()
		switch {
		case t.compact:
			if compact == nil {
				compact = new(bytes.Buffer)
			}
			compact.Reset()
			if json.Compact(compact, t.raw) == nil {
				all.Write(compact.Bytes())
			}
		case bytes.IndexByte(t.raw, '\\') >= 0:
			buf = unquote(buf[:0], t.raw)
			all.Write(buf)
		default:
			all.Write(t.raw[1 : len(t.raw)-1])
		}
		// The builder only appends, so earlier Strings stay valid.
		dst = append(dst, all.String()[start:])
	}
	return dst
}

// scratch is the pooled working memory of one walk over a body, so that
// parsing and estimating allocate only what they return. release drops
// every reference into the body and does not keep oversized memory.
type scratch struct {
	rs      readers
	req     Request // the throwaway counts of a collecting walk
	path    []seg
	pathBuf [16]seg // path's first memory
	texts   []textRef
	calls   []textRef // a message's tool calls' texts (see walker)
	strs    []string
	tail    []byte // the end of a response (see ParseUsage)
}

var scratchPool = sync.Pool{New: func() any {
	sc := new(scratch)
	sc.path = sc.pathBuf[:0]
	return sc
}}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// Bounds on what a pooled scratch keeps: a body that needed more gets
// fresh memory next time rather than pinning its peak in the pool.
const (
	maxPooledTexts = 1 << 10
	maxPooledPath  = 64
	maxPooledTail  = 4 << 10
)

func (sc *scratch) release() {
	sc.rs.release()
	clear(sc.texts)
	clear(sc.calls[:cap(sc.calls)])
	clear(sc.strs)
	clear(sc.path)
	sc.req = Request{}
	sc.texts, sc.calls, sc.strs, sc.path = sc.texts[:0], sc.calls[:0], sc.strs[:0], sc.path[:0]
	if cap(sc.texts) > maxPooledTexts || cap(sc.calls) > maxPooledTexts {
		sc.texts, sc.calls, sc.strs = nil, nil, nil
	}
	if cap(sc.tail) > maxPooledTail {
		sc.tail = nil
	}
	if cap(sc.path) > maxPooledPath {
		sc.path = sc.pathBuf[:0]
	}
	scratchPool.Put(sc)
}

// walker reads a request body for one kind of API: Parse walks it to
// validate and count it; Estimate and LightMode walk again with collect set
// to gather the prompt texts.
//
// The walk is one jsontext pass. Members that need not be read in place
// are kept raw and read after the pass, in the API's order (also the whole
// prompt when the kind is inferred or a member comes late). Values that can
// nest without bound are always read in place, so no byte is read more
// than a fixed number of times.
type walker struct {
	rs      *readers
	rd      *reader // the reader the walk is at
	r       *Request
	collect bool
	every   int // when collecting, keep every every-th text (0 or 1: all)
	keep    int // when not, keep the first keep texts
	texts   []textRef
	path    []seg // where the walk is, for error messages

	// deferring sends texts to calls: a message's tool calls are read
	// where they stand, and added after the message's name.
	deferring bool
	calls     []textRef

	// toolUse and toolResult report that the content walked holds
	// tool_use and tool_result blocks, not counting those within tool
	// results (LightMode keeps calls and results together).
	toolUse, toolResult bool

	// The prompt members walked in place in the top-level pass: next is
	// the next in promptOrder, promptErr the first error met, and late
	// reports that the prompt must be walked again from the raw values.
	next      int
	late      bool
	promptErr error

	// stream_options as the top-level pass read it, for settings.
	includeUsage bool
	optionsErr   error
}

// walker returns a walker over req using sc's memory, collecting every
// every-th text when collect is set.
func (sc *scratch) walker(req *Request, collect bool, every int) walker {
	return walker{rs: &sc.rs, r: req, collect: collect, every: every, texts: sc.texts[:0], path: sc.path[:0], calls: sc.calls[:0]}
}

func (w *walker) push(name string) { w.path = append(w.path, seg{name: name}) }
func (w *walker) pushElem(i int)   { w.path = append(w.path, seg{idx: i}) }
func (w *walker) pop()             { w.path = w.path[:len(w.path)-1] }

// errorf reports a problem with the value the walk is at.
func (w *walker) errorf(format string, args ...any) *BodyError {
	return fieldError(string(appendPath(nil, w.path)), format, args...)
}

// typeError steps over the value begun with a token of kind k, which is
// not of the type want, and reports it.
func (w *walker) typeError(k jsontext.Kind, want string) *BodyError {
	w.rd.finish(k)
	return w.errorf("must be %s, got %s", want, typeName(byte(k)))
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

// maxTexts is the most prompt texts an estimate gathers; beyond it every
// k-th is gathered and the count scaled by bytes, bounding memory.
const maxTexts = 1 << 16

// gatherTexts walks r's body again and returns its prompt texts, every
// every-th of them (0 or 1: all), in sc's memory.
func (r *Request) gatherTexts(sc *scratch, every int) []textRef {
	if r == nil || r.body == nil || r.Kind == KindUnknown {
		return nil
	}
	sc.req = Request{Kind: r.Kind, Choices: 1}
	w := sc.walker(&sc.req, true, every)
	err := w.walk(r.body)
	sc.texts, sc.path, sc.calls = w.texts, w.path[:0], w.calls[:0]
	if err != nil {
		return nil
	}
	return w.texts
}

// walk reads body: its top level, its settings and its prompt.
func (w *walker) walk(body []byte) error {
	var top topLevel
	if err := w.top(body, &top); err != nil {
		return err
	}
	if w.r.Kind == KindUnknown {
		w.late = true
		if w.r.Kind = inferKind(&top); w.r.Kind == KindUnknown {
			return nil
		}
	}
	if err := w.settings(&top); err != nil {
		return err
	}
	return w.prompt(&top)
}

// top reads the top level of body into top, checking the body as a whole
// (one JSON object, depth, duplicate members read) and walking the prompt
// in place where the kind is known (see walker).
func (w *walker) top(body []byte, top *topLevel) error {
	r := w.rs.open(body, MaxDepth)
	defer w.rs.close()
	w.rd = r
	var err error
	if k := r.next(); k != '{' {
		r.finish(k)
		err = &BodyError{Msg: "request body must be a JSON object, got " + typeName(byte(k)), Offset: -1}
	} else {
		err = w.fields(topNames, top[:], w.topValue)
	}
	r.end()
	if r.err != nil {
		return invalidBody(body, r.err, err)
	}
	return err
}

// promptOrder lists the top-level members that hold each kind's prompt,
// in the order the API reads them.
var promptOrder = [...][]int{
	KindChat:              {tMessages},
	KindAnthropicMessages: {tSystem, tMessages},
	KindCompletions:       {tPrompt},
	KindEmbeddings:        {tInput},
	KindResponses:         {tInstructions, tInput},
}

// topValue walks the top-level member j in place when it is a prompt
// member whose predecessors have been walked, and reports whether it did.
func (w *walker) topValue(j int, k jsontext.Kind) bool {
	if j == tStreamOptions {
		w.streamOptions(k)
		return true
	}
	i := slices.Index(promptOrder[w.r.Kind], j)
	if i >= 0 && i < w.next {
		w.late = true
	}
	if i < 0 || w.late || w.promptErr != nil {
		return false
	}
	w.next = i + 1
	w.promptErr = w.promptMember(j, k)
	return true
}

// promptMember adds the prompt member j, whose value the walk has begun
// with a token of kind k, by its type; null adds nothing.
func (w *walker) promptMember(j int, k jsontext.Kind) error {
	if k == 'n' {
		return nil
	}
	w.push(topNames[j])
	defer w.pop()
	items := j == tInput && w.r.Kind == KindResponses
	switch {
	case j == tMessages && k == '[':
		return w.elements(func(k jsontext.Kind) error {
			_, err := w.message(k, w.r.Kind == KindAnthropicMessages)
			return err
		})
	case j == tSystem && (k == '"' || k == '['):
		w.r.Messages++
		return w.content(k, true)
	case (j == tInstructions || items) && k == '"':
		// The API wraps a string input as a user message.
		w.r.Messages++
		w.addText(w.rd.raw)
		return nil
	case items && k == '[':
		return w.elements(w.addItem)
	case j == tMessages:
		return w.typeError(k, "an array")
	case j == tSystem:
		return w.typeError(k, "a string or an array of text blocks")
	case j == tInstructions:
		return w.typeError(k, "a string")
	case items:
		return w.typeError(k, "a string or an array of input items")
	}
	return w.addTokenInput(k)
}

// prompt adds what the top-level pass left of the prompt: all of it, in
// the API's order, when the pass could not walk it in place.
func (w *walker) prompt(top *topLevel) error {
	if !w.late {
		if w.promptErr != nil {
			return w.promptErr
		}
	} else {
		w.reset(mark{})
		for _, j := range promptOrder[w.r.Kind] {
			if err := w.from(top[j], func(k jsontext.Kind) error { return w.promptMember(j, k) }); err != nil {
				return err
			}
		}
	}
	switch w.r.Kind {
	case KindChat:
		w.addJSON(top[tTools])
		w.addJSON(top[tFunctions])
	case KindAnthropicMessages, KindResponses:
		w.addJSON(top[tTools])
	}
	return nil
}

// from runs f with the walk at raw, a value read before, begun with a
// token of kind k; an absent value adds nothing.
func (w *walker) from(raw []byte, f func(k jsontext.Kind) error) error {
	if raw == nil {
		return nil
	}
	saved := w.rd
	w.rd = w.rs.open(raw, 0)
	err := f(w.rd.next())
	w.rs.close()
	w.rd = saved
	return err
}

// settings reads the members that are not prompt: the model, streaming,
// the output cap and the number of choices.
func (w *walker) settings(top *topLevel) error {
	r := w.r
	var err error
	if r.Model, err = getString(top[tModel], "model"); err != nil {
		return err
	}
	if r.Kind != KindEmbeddings {
		if r.Stream, err = getBool(top[tStream], "stream"); err != nil {
			return err
		}
		if w.optionsErr != nil {
			return w.optionsErr
		}
		r.IncludeUsage = w.includeUsage
	}
	// The first cap present wins, in the API's order of preference.
	var caps []int
	switch r.Kind {
	case KindChat:
		caps = []int{tMaxCompletionTokens, tMaxTokens}
	case KindCompletions, KindAnthropicMessages:
		caps = []int{tMaxTokens}
	case KindResponses:
		caps = []int{tMaxOutputTokens}
	}
	for _, j := range caps {
		n, err := getInt(top[j], topNames[j], 0)
		if err != nil {
			return err
		}
		if r.MaxOutput == 0 {
			r.MaxOutput = n
		}
	}
	if r.Kind == KindChat || r.Kind == KindCompletions {
		if r.Choices, err = getChoices(top[tN], "n"); err != nil {
			return err
		}
	}
	if r.Kind == KindCompletions {
		// best_of's candidates are all generated, of which n return.
		best, err := getChoices(top[tBestOf], "best_of")
		if err != nil {
			return err
		}
		r.Choices = max(r.Choices, best)
	}
	return nil
}

// streamOptions reads stream_options, begun with a token of kind k.
func (w *walker) streamOptions(k jsontext.Kind) {
	w.push("stream_options")
	defer w.pop()
	switch k {
	case 'n':
	case '{':
		var v [1][]byte
		if w.optionsErr = w.fields([]string{"include_usage"}, v[:], nil); w.optionsErr == nil {
			w.includeUsage, w.optionsErr = getBool(v[0], "stream_options.include_usage")
		}
	default:
		w.optionsErr = w.typeError(k, "an object")
	}
}

// fields reads the rest of the object the walk has begun, collecting the
// raw values of the members named in names into vals. walk, when not nil,
// is offered each value and reports whether it read it in place. A name
// given twice is an error (unless the reader failed in its value).
func (w *walker) fields(names []string, vals [][]byte, walk func(j int, k jsontext.Kind) bool) error {
	r := w.rd
	var err error
	for r.member() {
		j := indexOf(names, r.name())
		switch {
		case err != nil || j < 0:
			r.skip()
		case vals[j] != nil:
			r.skip()
			if r.err == nil { // a reader's error comes first
				err = w.errorIn(names[j], "%s", duplicateMsg)
			}
		default:
			k := r.next()
			start := r.start
			if walk == nil || !walk(j, k) {
				r.finish(k)
			}
			vals[j] = r.since(start)
		}
	}
	return err
}

func indexOf(names []string, name []byte) int {
	for j, n := range names {
		if string(name) == n {
			return j
		}
	}
	return -1
}

// elements walks the rest of the array the walk has begun, calling f with
// the kind of each element's first token until f returns an error; the
// rest are stepped over. f reads the rest of its element.
func (w *walker) elements(f func(k jsontext.Kind) error) error {
	r := w.rd
	var err error
	for n := 0; ; n++ {
		k := r.element()
		switch {
		case k == 0:
			return err
		case err != nil:
			r.finish(k)
		default:
			w.pushElem(n)
			err = f(k)
			w.pop()
		}
	}
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

// message adds the prompt of the message begun with a token of kind k,
// walked in place, and returns the raw values of its members. Its name,
// tool calls and function call follow its content whatever the order.
func (w *walker) message(k jsontext.Kind, anthropic bool) (m [msgFields][]byte, err error) {
	if k != '{' {
		return m, w.typeError(k, "an object")
	}
	var contentErr, callsErr, fnErr error
	var fn [2][]byte
	w.calls = w.calls[:0]
	err = w.fields(messageFields, m[:], func(j int, k jsontext.Kind) bool {
		switch {
		case j == msgContent:
			contentErr = w.contentIn("content", k, anthropic)
		case j == msgToolCalls:
			callsErr = w.toolCalls(k)
		case j == msgFunctionCall && k == '{':
			fnErr = w.function("function_call", &fn)
		default:
			return false
		}
		return true
	})
	if err != nil {
		return m, err
	}
	if role := m[msgRole]; present(role) && rawType(role) != '"' {
		return m, w.errorIn("role", "must be a string, got %s", typeName(rawType(role)))
	}
	w.r.Messages++
	if contentErr != nil {
		return m, contentErr
	}
	if name := m[msgName]; present(name) {
		if rawType(name) != '"' {
			return m, w.errorIn("name", "must be a string, got %s", typeName(rawType(name)))
		}
		w.addText(name)
		w.r.Names++
	}
	if callsErr != nil {
		return m, callsErr
	}
	for _, t := range w.calls {
		w.add(t)
	}
	if rawType(m[msgFunctionCall]) != '{' {
		w.addJSON(m[msgFunctionCall])
	} else if fnErr == nil {
		w.addFunction(&fn)
	}
	return m, fnErr
}

// function reads a function call's members, in place, into fn; name is
// the member it stands in, for errors.
func (w *walker) function(name string, fn *[2][]byte) error {
	w.push(name)
	defer w.pop()
	return w.fields(functionFields, fn[:], nil)
}

// toolCalls reads the tool calls begun with a token of kind k, keeping
// their texts in w.calls.
func (w *walker) toolCalls(k jsontext.Kind) error {
	if k == 'n' {
		return nil
	}
	w.push("tool_calls")
	defer w.pop()
	if k != '[' {
		return w.typeError(k, "an array")
	}
	w.deferring = true
	err := w.elements(w.addCall)
	w.deferring = false
	return err
}

// addCall adds the OpenAI tool call begun with a token of kind k: its
// function's name and arguments, or the whole call without a function.
func (w *walker) addCall(k jsontext.Kind) error {
	r := w.rd
	if k != '{' {
		w.addJSON(r.finish(k))
		return nil
	}
	start := r.start
	var v [1][]byte
	var fn [2][]byte
	var fnErr error
	err := w.fields(callFields, v[:], func(_ int, k jsontext.Kind) bool {
		if k != '{' {
			return false
		}
		fnErr = w.function("function", &fn)
		return true
	})
	raw := r.since(start)
	switch {
	case err != nil:
		return err
	case rawType(v[0]) != '{':
		w.addJSON(raw)
	case fnErr == nil:
		w.addFunction(&fn)
	}
	return fnErr
}

var callFields = []string{"function"}

var functionFields = []string{"name", "arguments"}

// addFunction adds a function call's name and arguments.
func (w *walker) addFunction(v *[2][]byte) {
	w.addText(v[0])
	if rawType(v[1]) == '"' {
		w.addText(v[1])
	} else {
		w.addJSON(v[1])
	}
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

// content adds the message content begun with a token of kind k.
func (w *walker) content(k jsontext.Kind, anthropic bool) error {
	switch k {
	case 'n':
		return nil
	case '"':
		w.addText(w.rd.raw)
		return nil
	case '[':
		return w.elements(func(k jsontext.Kind) error { return w.part(k, anthropic) })
	}
	if anthropic {
		return w.typeError(k, "a string or an array of content blocks")
	}
	return w.typeError(k, "a string, an array of content parts, or null")
}

// part adds the content part or block begun with a token of kind k; a
// tool_result's content nests without bound (see typed).
func (w *walker) part(k jsontext.Kind, anthropic bool) error {
	if k != '{' {
		return w.typeError(k, "an object")
	}
	var v [partFields][]byte
	_, contentErr, err := w.typed(&v, false, anthropic)
	switch {
	case err != nil:
		return err
	case stringIs(v[partType], "tool_result"):
		w.toolResult = true
		return contentErr
	}
	return w.addPart(&v)
}

// typed reads the rest of the object the walk has begun, a part or (item)
// an input item, into v, walking the member that nests in place: as content
// before the type is seen; undone if the type names another or the object is
// in error. It returns the member walked (-1: none) and its content's error.
func (w *walker) typed(v *[partFields][]byte, item, anthropic bool) (walked int, walkErr, err error) {
	walked = -1
	var before mark
	err = w.fields(partNames, v[:], func(j int, k jsontext.Kind) bool {
		if j != partContent && j != partOutput || walked >= 0 ||
			j != nests(v[partType], item) && (v[partType] != nil || j != partContent) {
			return false
		}
		before, walked = w.mark(), j
		use, result := w.toolUse, w.toolResult
		walkErr = w.contentIn(partNames[j], k, anthropic)
		w.toolUse, w.toolResult = use, result // nested blocks are not the message's
		return true
	})
	typ := v[partType]
	if err == nil && present(typ) && rawType(typ) != '"' {
		err = w.errorIn("type", "must be a string, got %s", typeName(rawType(typ)))
	}
	if walked >= 0 && (err != nil || walked != nests(typ, item)) {
		w.reset(before)
		walked, walkErr = -1, nil
	}
	return walked, walkErr, err
}

// nests returns the member of a content part or block (or, when item, a
// responses input item) of type typ (raw) that holds content, or -1. An
// item without a type (absent or empty, not null) is a message.
func nests(typ []byte, item bool) int {
	switch t := string(stringBytes(typ)); {
	case !item && t == "tool_result", item && t == "message", item && t == "" && rawType(typ) != 'n':
		return partContent
	case item && (t == "function_call_output" || t == "custom_tool_call_output"):
		return partOutput
	}
	return -1
}

// addPart adds a part or block other than a tool result, by its type.
func (w *walker) addPart(v *[partFields][]byte) error {
	switch string(stringBytes(v[partType])) {
	case "text", "input_text", "output_text":
		if rawType(v[partText]) != '"' {
			return w.errorIn("text", "must be a string, got %s", typeName(rawType(v[partText])))
		}
		w.addText(v[partText])
	case "image_url", "input_image", "image":
		w.r.Images++
	case "refusal":
		w.addText(v[partRefusal])
	case "thinking":
		w.addText(v[partThinking])
	case "tool_use", "server_tool_use":
		w.toolUse = true
		w.addText(v[partName])
		w.addJSON(v[partInput])
	default:
		// Audio, files, documents, redacted thinking: their cost is not
		// knowable from the body; count any text they carry.
		w.addText(v[partText])
	}
	return nil
}

// addItem adds the responses input item begun with a token of kind k.
// Its content or output is walked in place (see typed), else read again.
func (w *walker) addItem(k jsontext.Kind) error {
	if k != '{' {
		return w.typeError(k, "an object")
	}
	var v [partFields][]byte
	walked, walkErr, err := w.typed(&v, true, false)
	if err != nil {
		return err
	}
	typ := v[partType]
	j := nests(typ, true)
	switch {
	case j == partContent:
		w.r.Messages++
	case j >= 0:
	case stringIs(typ, "function_call"):
		w.addText(v[partName])
		w.addText(v[partArguments])
	case stringIs(typ, "custom_tool_call"):
		w.addText(v[partName])
		w.addText(v[partInput])
	case stringIs(typ, "reasoning"):
		if rawType(v[partSummary]) == '[' {
			// A malformed summary is the upstream's to report; the
			// text of a well-formed one counts.
			before := w.mark()
			if w.from(v[partSummary], func(k jsontext.Kind) error { return w.contentIn("summary", k, false) }) != nil {
				w.reset(before)
			}
		}
	default:
		w.addText(v[partText])
	}
	if j < 0 || walked == j {
		return walkErr
	}
	return w.from(v[j], func(k jsontext.Kind) error { return w.contentIn(partNames[j], k, false) })
}

// contentIn adds the content of member name, begun with a token of kind k.
func (w *walker) contentIn(name string, k jsontext.Kind, anthropic bool) error {
	w.push(name)
	err := w.content(k, anthropic)
	w.pop()
	return err
}

// addTokenInput adds the completions prompt or embeddings input begun
// with a token of kind k: a string, token IDs, or arrays of either.
func (w *walker) addTokenInput(k jsontext.Kind) error {
	switch k {
	case '"':
		w.addText(w.rd.raw)
		return nil
	case '[':
		if w.tokenArray() {
			return nil
		}
		return w.errorf("must be a string, an array of strings, an array of token IDs or an array of token-ID arrays, with elements of one type")
	}
	return w.typeError(k, "a string or an array")
}

// tokenArray adds the rest of the array the walk has begun, and reports
// whether its elements are all of one allowed type.
func (w *walker) tokenArray() bool {
	r := w.rd
	first := jsontext.Kind(0)
	ok := true
	for {
		k := r.element()
		if first == 0 {
			first = k
		}
		switch {
		case k == 0:
			return ok
		case k != first || k == '{':
			r.finish(k)
			ok = false
		case k == '"':
			w.addText(r.raw)
		case k == '[':
			ok = w.tokenIDs() && ok
		default:
			ok = w.tokenID(k) && ok
		}
	}
}

// tokenIDs adds the rest of an array of token IDs, reporting validity.
func (w *walker) tokenIDs() bool {
	ok := true
	for k := w.rd.element(); k != 0; k = w.rd.element() {
		ok = w.tokenID(k) && ok
	}
	return ok
}

// tokenID adds the token ID begun with a token of kind k, reporting validity.
func (w *walker) tokenID(k jsontext.Kind) bool {
	if k == '{' || k == '[' {
		w.rd.finish(k)
		return false
	}
	if !isTokenID(w.rd.raw) {
		return false
	}
	w.r.TokenIDs++
	return true
}

// addText adds a JSON string value as one text; other types are ignored.
func (w *walker) addText(raw []byte) {
	if rawType(raw) == '"' && len(raw) > 2 {
		w.add(textRef{raw: raw})
	}
}

// addJSON adds a JSON value (tool definitions, inputs) as one text of its
// compact form, about the size servers render into the prompt.
func (w *walker) addJSON(raw []byte) {
	if present(raw) {
		w.add(textRef{raw: raw, compact: true})
	}
}

// add counts a text, and keeps it when collecting (every every-th) or among
// the first keep; the first inlineTexts are kept in the Request too. A tool
// call's text waits in w.calls until the message's name is added.
func (w *walker) add(t textRef) {
	if w.deferring {
		w.calls = append(w.calls, t)
		return
	}
	r := w.r
	if w.collect && (w.every <= 1 || r.nTexts%w.every == 0) || !w.collect && r.nTexts < w.keep {
		w.texts = append(w.texts, t)
	}
	if r.nTexts < len(r.texts) {
		r.texts[r.nTexts] = t
	}
	r.nTexts++
	r.textBytes += int64(len(t.raw))
}
