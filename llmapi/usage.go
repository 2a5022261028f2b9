package llmapi

import (
	"bytes"
	"strconv"
)

// Usage is a response's actual token usage, used to back-fill the estimate.
type Usage struct {
	Prompt     int
	Completion int
	// Reported is true when Completion came from the upstream's own usage
	// report, false when it was counted from streamed text.
	Reported bool
}

// Total is Prompt + Completion.
func (u Usage) Total() int { return u.Prompt + u.Completion }

// ParseUsage reads the top-level usage object of a non-streamed JSON
// response: prompt_tokens/completion_tokens or input_tokens/output_tokens
// (Anthropic's cache reads and writes added to the prompt). It reports
// false when there is none. Of members named usage the last counts.
//
// Servers write usage last, after what can be large, so ParseUsage first
// reads from the last "usage" on: in valid JSON it is a whole string, and
// when its object runs to the end of the text it is the top-level one, and
// the text before is not read. Otherwise the whole body is read, and a
// response that stops being JSON counts the usage read before.
func ParseUsage(body []byte) (Usage, bool) {
	sc := getScratch()
	defer sc.release()
	p, c, ok, whole := -1, -1, false, false
	if i := bytes.LastIndex(body, keyUsage); i > 0 && body[i-1] != '\\' {
		sc.tail = append(append(sc.tail[:0], '{'), body[i:]...)
		p, c, ok, whole = lastUsage(&sc.rs, sc.tail)
	}
	if !whole {
		p, c, ok, _ = lastUsage(&sc.rs, body)
	}
	if !ok {
		return Usage{}, false
	}
	return Usage{Prompt: max(p, 0), Completion: max(c, 0), Reported: c >= 0}, true
}

// lastUsage reads the usage of the response body with rs, counting a
// usage object read whole, and reports whether body was one JSON object.
func lastUsage(rs *readers, body []byte) (prompt, completion int, ok, whole bool) {
	prompt, completion = -1, -1
	r := rs.open(body, 0)
	defer rs.close()
	if r.next() != '{' {
		return prompt, completion, false, false
	}
	for r.member() {
		if string(r.name()) != "usage" {
			r.skip()
		} else if p, c, isUsage := readUsage(r); r.err == nil {
			prompt, completion, ok = p, c, isUsage
		}
	}
	r.end()
	return prompt, completion, ok, r.err == nil
}

// usage reads the usage object raw (see readUsage).
func (rs *readers) usage(raw []byte) (prompt, completion int, ok bool) {
	if rawType(raw) != '{' {
		return -1, -1, false
	}
	defer rs.close()
	return readUsage(rs.open(raw, 0))
}

// readUsage reads the next value of r as a usage object:
// prompt_tokens/completion_tokens or input_tokens/output_tokens, plus
// Anthropic's cache reads and writes. prompt and completion are -1 when
// unreported; non-numbers, and values other than an object, are ignored.
func readUsage(r *reader) (prompt, completion int, ok bool) {
	pt, ct, it, ot, cache := -1, -1, -1, -1, -1
	k := r.next()
	if k != '{' {
		r.finish(k)
	}
	for k == '{' && r.member() {
		name := r.name()
		n, isNum := tokenCount(r.value())
		if !isNum {
			continue
		}
		switch string(name) {
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

// tokenCount reads a JSON number as a token count, clamped to [0, 2^31-1]
// with any fraction truncated; false for a non-number or an infinity.
func tokenCount(v []byte) (int, bool) {
	if n, ok := smallInt(v); ok {
		return min(n, 1<<31-1), true
	}
	if t := rawType(v); t != '-' && (t < '0' || t > '9') {
		return 0, false
	}
	if bytes.ContainsAny(v, "eE") {
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return 0, false
		}
		return int(max(min(f, 1<<31-1), 0)), true
	}
	if v[0] == '-' {
		return 0, true
	}
	n := 0
	for _, c := range v {
		if c == '.' {
			break
		}
		n = min(n*10+int(c-'0'), 1<<31-1)
	}
	return n, true
}

// DefaultMaxLine is the longest SSE line a StreamScanner buffers; a longer
// line is skipped rather than buffered without end.
const DefaultMaxLine = 1 << 20

// streamFlush is how much streamed text is held before it is counted; it
// bounds the scanner's memory for text to about this much.
const streamFlush = 16 << 10

// StreamScanner extracts usage from a server-sent-events response as it
// passes through (OpenAI chat, completions, responses, Anthropic). Usage
// reported by the stream wins; otherwise the streamed text is counted as
// it arrives, in bounded memory. It is used by one goroutine: Write, then
// Result once the stream has ended.
type StreamScanner struct {
	// MaxLine is the longest line (and event) buffered; longer ones are
	// skipped. NewStreamScanner sets DefaultMaxLine.
	MaxLine int

	counter    Counter // exact counter used for fallback counting
	exactBytes int     // 0: count all streamed text exactly

	line     []byte // incomplete line carried between writes
	data     []byte // data of the event being assembled
	skipLine bool   // the current line overflowed MaxLine
	skipLF   bool   // previous write ended in CR; a leading LF belongs to it
	finished bool

	events int // JSON events recognized

	rs readers // read the events

	prompt, completion int // reported, -1 until seen
	completionReported bool

	text          []byte // streamed text not yet counted
	textTokens    int    // tokens counted from streamed text
	textCounted   int    // bytes of streamed text counted
	textUncounted int    // bytes beyond the exact budget, extrapolated
}

// NewStreamScanner returns a scanner that counts unreported output with c
// (a nil c counts approximately).
func NewStreamScanner(c Counter) *StreamScanner {
	s := &StreamScanner{MaxLine: DefaultMaxLine, prompt: -1, completion: -1}
	if c == nil {
		c = approxCounter{}
	}
	if b, ok := c.(*boundedCounter); ok {
		s.counter, s.exactBytes = b.inner, b.exactBytes
	} else {
		s.counter = c
	}
	return s
}

// Write consumes the next piece of the stream, split anywhere. It never
// fails, so it can sit in a tee without disturbing the response.
func (s *StreamScanner) Write(p []byte) (int, error) {
	n := len(p)
	if s.finished {
		return n, nil
	}
	for len(p) > 0 {
		if s.skipLF {
			s.skipLF = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexByte(p, '\n')
		// SSE also ends lines with a lone CR; look for one only before
		// the LF (or in the rest), which costs nothing for LF streams.
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if j := bytes.IndexByte(seg, '\r'); j >= 0 {
			i = j
			s.skipLF = true
		}
		if i < 0 {
			s.appendLine(p)
			return n, nil
		}
		if len(s.line) == 0 && !s.skipLine {
			// The whole line is in p: no copy.
			if i <= s.MaxLine {
				s.handleLine(p[:i])
			}
		} else {
			s.appendLine(p[:i])
			if !s.skipLine {
				s.handleLine(s.line)
			}
			s.line, s.skipLine = s.line[:0], false
		}
		p = p[i+1:]
	}
	return n, nil
}

func (s *StreamScanner) appendLine(p []byte) {
	if s.skipLine {
		return
	}
	if len(s.line)+len(p) > s.MaxLine {
		s.skipLine = true
		s.line = nil
		return
	}
	s.line = append(s.line, p...)
}

func (s *StreamScanner) handleLine(line []byte) {
	if len(line) == 0 {
		s.dispatch()
		return
	}
	if !bytes.HasPrefix(line, []byte("data:")) {
		return // event:, id:, retry:, comments
	}
	v := line[5:]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	// A server that omits the blank line between events would otherwise
	// have its chunks joined into one invalid payload; a new JSON value
	// cannot continue the previous one, so dispatch it first.
	if len(s.data) > 0 && len(v) > 0 && (v[0] == '{' || v[0] == '[') {
		s.dispatch()
	}
	if len(s.data)+len(v)+1 > s.MaxLine {
		s.data = s.data[:0]
		return
	}
	if len(s.data) > 0 {
		s.data = append(s.data, '\n')
	}
	s.data = append(s.data, v...)
}

func (s *StreamScanner) dispatch() {
	if len(s.data) > 0 {
		s.handleEvent(s.data)
		s.data = s.data[:0]
	}
}

// Events whose keys say they can carry neither usage nor text.
var (
	keyUsage   = []byte(`"usage"`)
	keyChoices = []byte(`"choices"`)
	keyDelta   = []byte(`"delta"`)
)

func (s *StreamScanner) handleEvent(d []byte) {
	d = bytes.TrimSpace(d)
	if len(d) == 0 || d[0] != '{' {
		return // [DONE], or not JSON
	}
	// Anthropic pings, block starts and stops, responses lifecycle events:
	// skip them without reading them.
	hasUsage := bytes.Contains(d, keyUsage)
	if !hasUsage && !bytes.Contains(d, keyDelta) && !bytes.Contains(d, keyChoices) {
		return
	}
	var typ, choices, usage, delta, message, response []byte
	isObject := s.rs.members(d, func(k, v []byte) {
		switch string(k) {
		case "type":
			typ = v
		case "choices":
			choices = v
		case "usage":
			usage = v
		case "delta":
			delta = v
		case "message":
			message = v
		case "response":
			response = v
		}
	})
	if !isObject {
		return
	}
	s.events++
	if hasUsage {
		s.takeUsage(usage)
	}
	s.eventText(typ, choices, delta, message, response, hasUsage)
}

// eventText reads what an event of type typ (raw, "" for OpenAI's chat
// and completions chunks) streams: text, and Anthropic's and the
// responses API's usage, which sit deeper.
func (s *StreamScanner) eventText(typ, choices, delta, message, response []byte, hasUsage bool) {
	switch string(typ) {
	case "":
	case `"message_start"`:
		if hasUsage {
			p, _, _ := s.rs.usage(s.rs.member(message, "usage"))
			if p >= 0 {
				s.prompt = p
			}
		}
		return
	case `"content_block_delta"`:
		for _, k := range [...]string{"text", "partial_json", "thinking"} {
			s.addText(s.rs.member(delta, k))
		}
		return
	case `"response.completed"`, `"response.incomplete"`, `"response.failed"`:
		if hasUsage {
			s.takeUsage(s.rs.member(response, "usage"))
		}
		return
	case `"response.output_text.delta"`, `"response.refusal.delta"`,
		`"response.function_call_arguments.delta"`, `"response.reasoning_text.delta"`,
		`"response.reasoning_summary_text.delta"`, `"response.custom_tool_call_input.delta"`:
		s.addText(delta)
		return
	}
	s.rs.each(choices, func(c []byte) {
		s.rs.members(c, func(k, v []byte) {
			switch string(k) {
			case "text":
				s.addText(v)
			case "delta":
				s.addDelta(v)
			}
		})
	})
}

// addDelta adds an OpenAI chat delta's generated text: content, reasoning
// (as vLLM and others stream it) and tool-call arguments.
func (s *StreamScanner) addDelta(d []byte) {
	s.rs.members(d, func(k, v []byte) {
		switch string(k) {
		case "content", "reasoning_content", "reasoning", "refusal":
			s.addText(v)
		case "tool_calls":
			s.rs.each(v, func(call []byte) {
				f := s.rs.member(call, "function")
				s.addText(s.rs.member(f, "name"))
				s.addText(s.rs.member(f, "arguments"))
			})
		}
	})
}

func (s *StreamScanner) takeUsage(raw []byte) {
	p, c, ok := s.rs.usage(raw)
	if !ok {
		return
	}
	if p > 0 || s.prompt < 0 && p == 0 {
		s.prompt = p
	}
	if c >= 0 {
		s.completion, s.completionReported = c, true
	}
}

func (s *StreamScanner) addText(raw []byte) {
	if len(raw) < 3 || raw[0] != '"' {
		return // not a string, or empty
	}
	if s.exactBytes > 0 && s.textCounted+len(s.text) >= s.exactBytes {
		// Past the budget only the size matters; escapes make it a
		// slight overestimate.
		s.textUncounted += len(raw) - 2
		return
	}
	s.text = unquote(s.text, raw)
	if len(s.text) >= streamFlush {
		s.countText(false)
	}
}

// countText counts the buffered text, all of it or up to a piece boundary
// near its end, keeping the rest to be counted with what follows.
func (s *StreamScanner) countText(all bool) {
	cut := len(s.text)
	if !all {
		cut = alignForward(string(s.text), len(s.text)-256, 256)
	}
	if cut == 0 {
		return
	}
	s.textTokens += s.counter.Count(string(s.text[:cut]))
	s.textCounted += cut
	s.text = append(s.text[:0], s.text[cut:]...)
}

// Result finishes the stream (a final unterminated line still counts) and
// returns what it learnt. Prompt is 0 when the stream did not report it.
// ok is false when nothing usable was seen. Later writes are ignored.
func (s *StreamScanner) Result() (Usage, bool) {
	if !s.finished {
		s.finished = true
		if len(s.line) > 0 && !s.skipLine {
			s.handleLine(s.line)
		}
		s.dispatch()
		s.line, s.data = nil, nil
		// Reported usage makes the streamed text moot: most streams end
		// before the first flush, so they are never tokenized at all.
		if len(s.text) > 0 && !s.completionReported {
			s.countText(true)
		}
		s.text = nil
	}
	u := Usage{Prompt: max(s.prompt, 0)}
	if s.completionReported {
		u.Completion, u.Reported = s.completion, true
		return u, true
	}
	u.Completion = s.textTokens
	if s.textUncounted > 0 && s.textCounted > 0 {
		u.Completion += int((int64(s.textUncounted)*int64(s.textTokens) + int64(s.textCounted)/2) / int64(s.textCounted))
	}
	return u, s.events > 0 || s.prompt >= 0
}
