package llmapi

import "math/bits"

// The request path's parser. Parse's reference path (parseSlow) reads a
// body three times: validJSON checks it, readTop steps over every member
// to collect the top level and measure nesting, and the walker steps over
// the messages again, member by member, to interpret them. Most of the
// cost of a small request is in that repetition and in the primitives'
// bookkeeping, not in the bytes.
//
// parseFast reads the body once: it validates as validJSON does while it
// collects the top level as readTop does, and it interprets a chat or
// Anthropic body's messages (and Anthropic's system) as it meets them. It
// only ever answers for bodies on which the reference path would get past
// readTop: on invalid JSON, nesting beyond MaxDepth, a duplicate or escaped
// top-level key, or a body that is not an object, it gives up and
// parseSlow answers, with its errors. Messages it cannot interpret exactly
// as the walker would (an error to report, an escaped key, a duplicate
// member) are left to the walker, which then walks them from the collected
// top level as the reference path does. What it interprets itself is the
// walker's logic restated without closures; FuzzFastParse holds the two
// to the same Request on every input.

// promptMark is the state of a Request's prompt before a speculative walk
// (see walker.part), restored when the walk's texts do not count.
type promptMark struct {
	images, nTexts int
	textBytes      int64
}

func (r *Request) mark() promptMark { return promptMark{r.Images, r.nTexts, r.textBytes} }
func (r *Request) reset(m promptMark) {
	r.Images, r.nTexts, r.textBytes = m.images, m.nTexts, m.textBytes
}

// addText is walker.addText outside a walk: raw is a value as it stands
// in the body, with no white space around it.
func (r *Request) addText(raw []byte) {
	if len(raw) > 2 && raw[0] == '"' {
		r.keep(textRef{raw: raw})
	}
}

// fastParser is the state of one parseFast pass. The pass adds the
// prompt it interprets to req as the walker would; when it could not
// interpret all of it, parseFast clears what it added and the walker
// walks the prompt from the top level.
type fastParser struct {
	b    []byte
	req  *Request
	kind Kind
	// back counts the bytes read a second time (a message's tool calls,
	// read after the message), for scan.n: the pass itself reads each
	// byte once, but for the first word of a string longer than a word,
	// which shortString reads before scanString does.
	back int
	top  topLevel
	// msgsDone and sysDone: the messages and Anthropic's system prompt
	// are in req. sysLate: the system prompt came after the messages,
	// whose texts the walker adds after it.
	msgsDone, sysDone, sysLate bool
}

// parseFast is parseWith's first attempt (see the top of this file). done
// reports that it answered: then err is what parseSlow would return, and
// *req what it would set. s (nil: a throwaway) counts the work, and sc
// (may be nil) is the walker's working memory; when the walker has some
// of the body to walk and sc is nil, a pooled one is used.
func parseFast(s *scan, sc *scratch, req *Request, path string, body []byte) (done bool, err error) {
	kind := KindFromPath(path)
	// Field by field: a composite literal would be built aside and
	// copied, which costs more than the parse of a small body's members.
	*req = Request{}
	req.Kind, req.Choices, req.body = kind, 1, body
	var f fastParser
	f.b, f.req, f.kind = body, req, kind
	if !f.run() {
		return false, nil
	}
	if s != nil {
		s.n += len(body) + f.back
	}
	if kind == KindUnknown {
		req.Kind = inferKind(&f.top)
		req.Inferred = req.Kind != KindUnknown
	}
	prompt := f.promptDone()
	if !prompt {
		// Left to the walker, from the top level, in its order.
		req.Messages, req.Names, req.Images, req.nTexts, req.textBytes = 0, 0, 0, 0, 0
	}
	if prompt && f.top.StreamOptions == nil || req.Kind == KindUnknown {
		// Nothing left to walk: walker.parse without a scanner or a
		// path, and without a walker that keeps anything of f's (which
		// would move f to the heap). walker.prompt's messages and system
		// prompt are in req already.
		if req.Kind != KindUnknown {
			w := walker{r: req}
			if err := w.settings(&f.top); err != nil {
				*req = Request{}
				return true, err
			}
			req.addJSON(f.top.Tools)
			if req.Kind == KindChat {
				req.addJSON(f.top.Functions)
			}
		}
		req.walked = true
		return true, nil
	}
	if sc == nil {
		sc = getScratch()
		defer sc.release()
	}
	if s == nil {
		s = &sc.s
	}
	w := walker{s: s, r: req, path: sc.path[:0], prewalked: prompt}
	err = w.parse(&f.top)
	sc.path = w.path[:0]
	if err != nil {
		*req = Request{}
		return true, err
	}
	req.walked = true
	return true, nil
}

// promptDone reports whether the pass added the prompt of a chat or
// Anthropic body to req, all of it and in the walker's order.
func (f *fastParser) promptDone() bool {
	switch f.req.Kind {
	case KindChat:
		return f.msgsDone || f.top.Messages == nil
	case KindAnthropicMessages:
		return (f.msgsDone || f.top.Messages == nil) && (f.sysDone || f.top.System == nil) && !f.sysLate
	}
	return false
}

// run reads the body: one object, its members collected into f.top and
// its prompt added to f.req. It reports false where parseSlow must
// answer.
func (f *fastParser) run() bool {
	b := f.b
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipJSONSpace(b, i+1) == len(b)
	}
	prompt := f.kind == KindChat || f.kind == KindAnthropicMessages
	anthropic := f.kind == KindAnthropicMessages
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		var ke int
		var slot *[]byte
		switch x := nameWord(b, i); {
		case x&(1<<48-1) == quotedModel:
			ke, slot = i+7, &f.top.Model
		case x == nameMessages && i+10 <= len(b) && b[i+9] == '"':
			ke, slot = i+10, &f.top.Messages
		case x == nameMaxToke && i+12 <= len(b) && load64(b, i+4) == quotedTokens:
			ke, slot = i+12, &f.top.MaxTokens
		default:
			var n int
			var w uint64
			var esc bool
			if ke, n, w, esc = name(b, i); ke < 0 || esc {
				return false
			}
			if n >= 0 {
				slot = f.top.slotWord(w)
			} else {
				slot = f.top.slot(b[i+1 : ke-1])
			}
		}
		i = skipJSONSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		v := skipJSONSpace(b, i+1)
		if v >= len(b) {
			return false
		}
		if slot != nil && *slot != nil {
			return false // readTop's duplicate error
		}
		var e int
		switch {
		case prompt && slot == &f.top.Messages:
			e = f.messages(v, anthropic)
		case anthropic && slot == &f.top.System && f.top.Messages == nil:
			e = f.system(v)
		case anthropic && slot == &f.top.System:
			f.sysLate = true
			e = skipValue(b, v, 1)
		default:
			e = skipValue(b, v, 1)
		}
		if e < 0 {
			return false
		}
		if slot != nil {
			*slot = b[v:e]
		}
		i = skipJSONSpace(b, e)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case '}':
			return skipJSONSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// messages reads the messages at b[i], a member of the body, into
// f.req, and returns their end or -1. Unless they are an array the
// walker's rules accept as they stand, f.msgsDone stays false and the
// walker walks them.
func (f *fastParser) messages(i int, anthropic bool) int {
	b := f.b
	if b[i] != '[' {
		if b[i] == 'n' {
			f.msgsDone = true // null: no messages
		}
		return skipValue(b, i, 1)
	}
	ok := true
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		f.msgsDone = true
		return i + 1
	}
	for {
		if i >= len(b) {
			return -1
		}
		e, mok := f.message(i, anthropic)
		if e < 0 {
			return -1
		}
		ok = ok && mok
		i = skipJSONSpace(b, e)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case ']':
			f.msgsDone = ok
			return i + 1
		default:
			return -1
		}
	}
}

// system reads Anthropic's system prompt at b[i] into f.req, as
// walker.addSystem does, and returns its end or -1.
func (f *fastParser) system(i int) int {
	b := f.b
	switch b[i] {
	case 'n':
		f.sysDone = true
		return skipValue(b, i, 1)
	case '"', '[':
		e, ok := f.content(i, 1, true)
		f.req.Messages++
		f.sysDone = ok
		return e
	}
	return skipValue(b, i, 1)
}

// message reads the message at b[i], an element of the messages, as
// walker.message does, and returns its end (-1: invalid JSON or too
// deep) and whether the walker would accept it: when not, what it added
// to f.req does not count.
func (f *fastParser) message(i int, anthropic bool) (end int, ok bool) {
	const depth = 2 // the body and the messages enclose a message
	b := f.b
	if b[i] != '{' {
		return skipValue(b, i, depth), false
	}
	r := f.req
	var m [msgFields][]byte // content aside, walked in place
	content := false
	ok = true
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		end = i + 1
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return -1, false
			}
			k := msgFields
			var ke int
			switch x := nameWord(b, i); {
			case x&(1<<40-1) == quotedRole:
				k, ke = msgRole, i+6
			case x == quotedContent:
				k, ke = msgContent, i+9
			default:
				ke2, n, w, esc := name(b, i)
				if ke = ke2; ke < 0 {
					return -1, false
				}
				switch {
				case esc:
					ok = false // keys are compared decoded: the walker's job
				case n >= 0:
					switch w {
					case nameRole:
						k = msgRole
					case nameContent:
						k = msgContent
					case nameName:
						k = msgName
					}
				default:
					switch string(b[i+1 : ke-1]) {
					case "tool_calls":
						k = msgToolCalls
					case "function_call":
						k = msgFunctionCall
					}
				}
			}
			i = skipJSONSpace(b, ke)
			if i >= len(b) || b[i] != ':' {
				return -1, false
			}
			v := skipJSONSpace(b, i+1)
			if v >= len(b) {
				return -1, false
			}
			if k == msgContent && !content {
				content = true
				e, cok := f.content(v, depth+1, anthropic)
				if e < 0 {
					return -1, false
				}
				ok = ok && cok
				i = e
			} else {
				if k == msgContent {
					ok, k = false, msgFields // a duplicate
				}
				i = skipValue(b, v, depth+1)
				if i < 0 {
					return -1, false
				}
				if k < msgFields {
					if m[k] != nil {
						ok = false // a duplicate
					}
					m[k] = b[v:i]
				}
			}
			var more bool
			if i, more = afterMember(b, i); more {
				i = skipJSONSpace(b, i)
				continue
			}
			if i < 0 {
				return -1, false
			}
			end = i
			break
		}
	}
	if !ok {
		return end, false
	}
	if role := m[msgRole]; role != nil && role[0] != '"' && role[0] != 'n' {
		return end, false // not a string
	}
	r.Messages++
	if name := m[msgName]; present(name) {
		if name[0] != '"' {
			return end, false
		}
		r.addText(name)
		r.Names++
	}
	if calls := m[msgToolCalls]; present(calls) {
		if calls[0] != '[' {
			return end, false
		}
		f.back += len(calls)
		if !f.toolCalls(calls) {
			return end, false
		}
	}
	if fcall := m[msgFunctionCall]; present(fcall) {
		f.back += len(fcall)
		if !f.function(fcall, depth+1) {
			return end, false
		}
	}
	return end, true
}

// content reads the message content at b[i], enclosed by depth arrays
// and objects, as walker.content does.
func (f *fastParser) content(i, depth int, anthropic bool) (end int, ok bool) {
	b := f.b
	switch b[i] {
	case 'n':
		return validLiteral(b, i, "null"), true
	case '"':
		e, esc := scanStringEsc(b, i)
		if e > 0 && e-i > 2 {
			f.req.keep(textRef{raw: b[i:e], plain: !esc})
		}
		return e, true
	case '[':
	default:
		return skipValue(b, i, depth), false
	}
	if depth >= MaxDepth {
		return -1, false
	}
	ok = true
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		if i >= len(b) {
			return -1, false
		}
		e, pok := f.part(i, depth+1, anthropic)
		if e < 0 {
			return -1, false
		}
		ok = ok && pok
		i = skipJSONSpace(b, e)
		if i >= len(b) {
			return -1, false
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case ']':
			return i + 1, ok
		default:
			return -1, false
		}
	}
}

// part reads the content part or block at b[i], enclosed by depth arrays
// and objects, as walker.part does: a tool result's content is walked in
// place, on speculation when the block's type comes after it.
func (f *fastParser) part(i, depth int, anthropic bool) (end int, ok bool) {
	b := f.b
	if b[i] != '{' {
		return skipValue(b, i, depth), false
	}
	if depth >= MaxDepth {
		return -1, false
	}
	var v [partFields][]byte
	var (
		walked bool
		before promptMark
	)
	ok, contentOK := true, true
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		end = i + 1
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return -1, false
			}
			ke, n, w, esc := name(b, i)
			if ke < 0 {
				return -1, false
			}
			j := -1
			switch {
			case esc:
				ok = false
			case n >= 0:
				j = partWord(w)
			case string(b[i+1:ke-1]) == "arguments":
				j = partArguments
			}
			i = skipJSONSpace(b, ke)
			if i >= len(b) || b[i] != ':' {
				return -1, false
			}
			vi := skipJSONSpace(b, i+1)
			if vi >= len(b) {
				return -1, false
			}
			if j >= 0 && v[j] != nil {
				ok = false // duplicate
				j = -1
			}
			if j == partContent && ok && (v[partType] == nil || stringIs(v[partType], "tool_result")) {
				before, walked = f.req.mark(), true
				e, cok := f.content(vi, depth+1, anthropic)
				if e < 0 {
					return -1, false
				}
				v[j], contentOK, i = b[vi:e], cok, e
			} else {
				i = skipValue(b, vi, depth+1)
				if i < 0 {
					return -1, false
				}
				if j >= 0 {
					v[j] = b[vi:i]
				}
			}
			var more bool
			if i, more = afterMember(b, i); more {
				i = skipJSONSpace(b, i)
				continue
			}
			if i < 0 {
				return -1, false
			}
			end = i
			break
		}
	}
	if !ok || present(v[partType]) && v[partType][0] != '"' {
		return end, false
	}
	if stringIs(v[partType], "tool_result") {
		return end, contentOK
	}
	r := f.req
	if walked {
		r.reset(before)
	}
	switch string(stringBytes(v[partType])) {
	case "text", "input_text", "output_text":
		if rawType(v[partText]) != '"' {
			return end, false
		}
		r.addText(v[partText])
	case "image_url", "input_image", "image":
		r.Images++
	case "refusal":
		r.addText(v[partRefusal])
	case "thinking":
		r.addText(v[partThinking])
	case "tool_use", "server_tool_use":
		r.addText(v[partName])
		r.addJSON(v[partInput])
	default:
		if rawType(v[partText]) == '"' {
			r.addText(v[partText])
		}
	}
	return end, true
}

// partWord is partField for a name read as a word; "arguments", the
// one longer name, is matched aside.
func partWord(w uint64) int {
	switch w {
	case nameType:
		return partType
	case nameText:
		return partText
	case nameRefusal:
		return partRefusal
	case nameThinking:
		return partThinking
	case nameName:
		return partName
	case nameInput:
		return partInput
	case nameContent:
		return partContent
	case nameOutput:
		return partOutput
	case nameSummary:
		return partSummary
	}
	return -1
}

// toolCalls reads a message's tool_calls, an array already validated, as
// walker.message does with walker.addCall.
func (f *fastParser) toolCalls(calls []byte) bool {
	const depth = 4 // the body, the messages, the message, the calls
	i := skipJSONSpace(calls, 1)
	if calls[i] == ']' {
		return true
	}
	for {
		e := skipValue(calls, i, depth)
		if e < 0 {
			return false
		}
		call := calls[i:e]
		if call[0] == '{' {
			var fn [1][]byte
			if !fields(call, depth, "function", "", fn[:]) {
				return false
			}
			if rawType(fn[0]) == '{' {
				if !f.function(fn[0], depth+1) {
					return false
				}
			} else {
				f.req.addJSON(call)
			}
		} else {
			f.req.addJSON(call)
		}
		i = skipJSONSpace(calls, e)
		if calls[i] == ']' {
			return true
		}
		i = skipJSONSpace(calls, i+1) // the comma
	}
}

// function reads a function call (a tool call's or function_call), a
// value already validated which depth arrays and objects enclose, as
// walker.addFunction does.
func (f *fastParser) function(raw []byte, depth int) bool {
	r := f.req
	if raw[0] != '{' {
		r.addJSON(raw)
		return true
	}
	var v [2][]byte
	if !fields(raw, depth, "name", "arguments", v[:]) {
		return false
	}
	r.addText(v[0])
	if rawType(v[1]) == '"' {
		r.addText(v[1])
	} else {
		r.addJSON(v[1])
	}
	return true
}

// fields collects the members named a and b (b may be "") of the object
// obj, a value already validated and enclosed by depth arrays and
// objects, into vals, as walker.fields does. It reports false on a
// duplicate or an escaped key, which the walker must judge.
func fields(obj []byte, depth int, a, b string, vals [][]byte) bool {
	i := skipJSONSpace(obj, 1)
	if obj[i] == '}' {
		return true
	}
	for {
		ke, _, _, esc := name(obj, i)
		if esc {
			return false
		}
		key := obj[i+1 : ke-1]
		v := skipJSONSpace(obj, skipJSONSpace(obj, ke)+1)
		e := skipValue(obj, v, depth+1)
		if e < 0 {
			return false
		}
		j := -1
		switch {
		case string(key) == a:
			j = 0
		case b != "" && string(key) == b:
			j = 1
		}
		if j >= 0 {
			if vals[j] != nil {
				return false
			}
			vals[j] = obj[v:e]
		}
		i = skipJSONSpace(obj, e)
		if obj[i] == '}' {
			return true
		}
		i = skipJSONSpace(obj, i+1)
	}
}

// name reads the member name at b[i] == '"' and returns the index past
// its closing quote, or -1 when it is not a valid string. A name of at
// most 8 bytes without escapes (all that the walker matches but a few)
// comes back as its length n and its bytes in a little-endian word w,
// zero above them: a JSON string holds no zero byte, so w alone tells
// the names apart (see the name* constants). For other names n is -1,
// and esc reports whether the name holds an escape.
func name(b []byte, i int) (end, n int, w uint64, esc bool) {
	if end = shortString(b, i); end > 0 {
		n = end - i - 2
		return end, n, load64(b, i+1) & (1<<(8*n) - 1), false
	}
	end, esc = scanStringEsc(b, i)
	return end, -1, 0, esc
}

// shortString returns the index past the string at b[i] == '"' when it
// is at most 8 bytes without an escape, 0 when it is not (it may still
// be a string; see scanString). It tests one word, as stringSpecial does,
// and is small enough to be inlined: most keys and many values are such
// strings, for which a call would cost as much as the test.
func shortString(b []byte, i int) int {
	if i+10 > len(b) {
		return 0
	}
	x := load64(b, i+1)
	c, e := x^(swarLSB*0x02), x^(swarLSB*'\\')
	// The first quote, backslash or control character, or b[i+9].
	k := i + 1 + bits.TrailingZeros64(((c-swarLSB*0x21)&^c|(e-swarLSB)&^e)&swarMSB)>>3
	if b[k] == '"' {
		return k + 1
	}
	return 0
}

// The member names the pass matches as words (see name): each is its
// bytes, the first the lowest.
const (
	nameN        = 'n'
	nameRole     = 'r' | 'o'<<8 | 'l'<<16 | 'e'<<24
	nameName     = 'n' | 'a'<<8 | 'm'<<16 | 'e'<<24
	nameType     = 't' | 'y'<<8 | 'p'<<16 | 'e'<<24
	nameText     = 't' | 'e'<<8 | 'x'<<16 | 't'<<24
	nameModel    = 'm' | 'o'<<8 | 'd'<<16 | 'e'<<24 | 'l'<<32
	nameInput    = 'i' | 'n'<<8 | 'p'<<16 | 'u'<<24 | 't'<<32
	nameTools    = 't' | 'o'<<8 | 'o'<<16 | 'l'<<24 | 's'<<32
	nameStream   = 's' | 't'<<8 | 'r'<<16 | 'e'<<24 | 'a'<<32 | 'm'<<40
	nameSystem   = 's' | 'y'<<8 | 's'<<16 | 't'<<24 | 'e'<<32 | 'm'<<40
	namePrompt   = 'p' | 'r'<<8 | 'o'<<16 | 'm'<<24 | 'p'<<32 | 't'<<40
	nameOutput   = 'o' | 'u'<<8 | 't'<<16 | 'p'<<24 | 'u'<<32 | 't'<<40
	nameContent  = 'c' | 'o'<<8 | 'n'<<16 | 't'<<24 | 'e'<<32 | 'n'<<40 | 't'<<48
	nameBestOf   = 'b' | 'e'<<8 | 's'<<16 | 't'<<24 | '_'<<32 | 'o'<<40 | 'f'<<48
	nameRefusal  = 'r' | 'e'<<8 | 'f'<<16 | 'u'<<24 | 's'<<32 | 'a'<<40 | 'l'<<48
	nameSummary  = 's' | 'u'<<8 | 'm'<<16 | 'm'<<24 | 'a'<<32 | 'r'<<40 | 'y'<<48
	nameMessages = 'm' | 'e'<<8 | 's'<<16 | 's'<<24 | 'a'<<32 | 'g'<<40 | 'e'<<48 | 's'<<56
	nameThinking = 't' | 'h'<<8 | 'i'<<16 | 'n'<<24 | 'k'<<32 | 'i'<<40 | 'n'<<48 | 'g'<<56
)

// The names, each with its closing quote, that the pass looks for first
// where it expects them, by one compare of the word after the opening
// quote (see nameWord): the members of the gateway's usual chat request.
// nameMaxToke and quotedTokens are the two overlapping words of
// max_tokens".
const (
	quotedRole    = nameRole | '"'<<32
	quotedModel   = nameModel | '"'<<40
	quotedContent = nameContent | '"'<<56
	nameMaxToke   = 'm' | 'a'<<8 | 'x'<<16 | '_'<<24 | 't'<<32 | 'o'<<40 | 'k'<<48 | 'e'<<56
	quotedTokens  = '_' | 't'<<8 | 'o'<<16 | 'k'<<24 | 'e'<<32 | 'n'<<40 | 's'<<48 | '"'<<56
)

// nameWord is the word after the quote at b[i] that opens a member name,
// or 0, which no name's bytes are, when the body ends before it.
func nameWord(b []byte, i int) uint64 {
	if i+9 > len(b) {
		return 0
	}
	return load64(b, i+1)
}

// slotWord is topLevel.slot for a name read as a word.
func (t *topLevel) slotWord(w uint64) *[]byte {
	switch w {
	case nameModel:
		return &t.Model
	case nameMessages:
		return &t.Messages
	case nameStream:
		return &t.Stream
	case nameN:
		return &t.N
	case nameBestOf:
		return &t.BestOf
	case nameSystem:
		return &t.System
	case namePrompt:
		return &t.Prompt
	case nameInput:
		return &t.Input
	case nameTools:
		return &t.Tools
	}
	return nil
}

// scanString is validString with its word test inline: it returns the
// index past the string at b[i] == '"', or -1.
func scanString(b []byte, i int) int {
	e, _ := scanStringEsc(b, i)
	return e
}

// scanStringEsc is scanString that also reports whether the string holds
// an escape.
func scanStringEsc(b []byte, i int) (end int, esc bool) {
	j := i + 1 // > 0: a load64 needs no more than j+8 <= len(b)
	for {
		for j+8 <= len(b) {
			x := load64(b, j)
			q := x ^ (swarLSB * 0x02)
			e := x ^ (swarLSB * '\\')
			if m := ((q-swarLSB*0x21)&^q | (e-swarLSB)&^e) & swarMSB; m != 0 {
				j += bits.TrailingZeros64(m) >> 3
				goto special
			}
			j += 8
		}
		for ; j < len(b) && !stringByte[b[j]]; j++ {
		}
		if j >= len(b) {
			return -1, esc
		}
	special:
		switch b[j] {
		case '"':
			return j + 1, esc
		case '\\':
			esc = true
			if j+1 >= len(b) {
				return -1, esc
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) {
					return -1, esc
				}
				for _, h := range b[j+2 : j+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1, esc
					}
				}
				j += 6
			default:
				return -1, esc
			}
		default:
			return -1, esc // a control character
		}
	}
}

// skipValue returns the index just past the JSON value at b[i] (i <
// len(b)), which depth arrays and objects enclose, validated as validJSON
// validates it, or -1 when it is invalid or nests deeper than MaxDepth.
// It keeps the open containers as bits of a word: MaxDepth levels fit.
func skipValue(b []byte, i, depth int) int {
	switch c := b[i]; {
	case c == '"':
		if e := shortString(b, i); e > 0 {
			return e
		}
		return scanString(b, i)
	case c == '{' || c == '[':
	case c == '-' || c >= '0' && c <= '9':
		return validNumber(b, i)
	case c == 't':
		return validLiteral(b, i, "true")
	case c == 'f':
		return validLiteral(b, i, "false")
	case c == 'n':
		return validLiteral(b, i, "null")
	default:
		return -1
	}
	var objects uint64 // bit k: the container k levels in is an object
	open := 0
	for {
		// b[i] starts a value.
		switch c := b[i]; {
		case c == '{' || c == '[':
			if depth+open >= MaxDepth {
				return -1
			}
			if c == '{' {
				objects |= 1 << open
			} else {
				objects &^= 1 << open
			}
			open++
			i = skipJSONSpace(b, i+1)
			if i >= len(b) {
				return -1
			}
			if b[i] == c+2 { // '}' or ']'
				open--
				i++
				break
			}
			if c == '{' {
				if i = validKey(b, i); i < 0 {
					return -1
				}
			}
			if i >= len(b) {
				return -1
			}
			continue
		case c == '"':
			i = scanString(b, i)
		case c == '-' || c >= '0' && c <= '9':
			i = validNumber(b, i)
		case c == 't':
			i = validLiteral(b, i, "true")
		case c == 'f':
			i = validLiteral(b, i, "false")
		case c == 'n':
			i = validLiteral(b, i, "null")
		default:
			return -1
		}
		// After a value.
		for {
			if i < 0 {
				return -1
			}
			if open == 0 {
				return i
			}
			i = skipJSONSpace(b, i)
			if i >= len(b) {
				return -1
			}
			object := objects>>(open-1)&1 != 0
			switch b[i] {
			case ',':
				i = skipJSONSpace(b, i+1)
				if object {
					i = validKey(b, i)
				}
				if i < 0 || i >= len(b) {
					return -1
				}
			case '}', ']':
				if (b[i] == '}') != object {
					return -1
				}
				open--
				i++
				continue
			default:
				return -1
			}
			break
		}
	}
}

// afterMember steps over what follows an object member's value at b[i]:
// past a comma, and true; past the object's closing brace, and false;
// else -1.
func afterMember(b []byte, i int) (int, bool) {
	// Small enough to inline, which the loops it ends need: the white
	// space after a comma is the caller's to skip.
	if i = skipJSONSpace(b, i); i < len(b) && (b[i] == ',' || b[i] == '}') {
		return i + 1, b[i] == ','
	}
	return -1, false
}
