package llmapi

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// MinKeepTokens is the least LightMode leaves of the newest message when the
// system prompts and tools alone use up the input limit: a request cut to
// nothing would waste the slot it waited for.
const MinKeepTokens = 64

// truncationMarker replaces the text LightMode cuts from an oversized
// message, so the model knows something is missing.
const truncationMarker = "\n[...]\n"

// LightMode rewrites a chat or Anthropic messages body so that its prompt
// fits maxInputTokens and its output cap is at most maxTokens (a limit <= 0
// is no limit). Other kinds are returned unchanged.
//
// System prompts are always kept, then as many of the newest other messages
// as fit, in order. A tool call stays with its results, and an Anthropic
// conversation still opens with a user message. When not even the newest
// message fits, its middle is replaced with a short marker: instructions
// sit at a message's edges. The output cap is lowered where the body sets
// it, or added as max_tokens. Everything else is kept byte for byte; when
// nothing changes, out is body and changed is false. Malformed bodies
// yield a *BodyError.
//
// Like Parse, LightMode is linear in the body (counting aside), refuses
// nesting beyond MaxDepth and duplicates of the members it reads, and
// matches keys after decoding escapes.
func LightMode(kind Kind, body []byte, maxInputTokens, maxTokens int, c Counter) (out []byte, changed bool, err error) {
	var rs readers
	return lightMode(&rs, kind, body, maxInputTokens, maxTokens, c)
}

func lightMode(rs *readers, kind Kind, body []byte, maxInputTokens, maxTokens int, c Counter) (out []byte, changed bool, err error) {
	if kind != KindChat && kind != KindAnthropicMessages || maxInputTokens <= 0 && maxTokens <= 0 {
		return body, false, nil
	}
	if c == nil {
		c = approxCounter{}
	}
	if b, ok := c.(*boundedCounter); ok {
		c = &spendingCounter{inner: b, exact: b.exactBytes, left: lightModeBudget * b.exactBytes}
	}
	var top topLevel
	w := walker{rs: rs, r: &Request{}}
	if err := w.top(body, &top); err != nil {
		return nil, false, err
	}
	anthropic := kind == KindAnthropicMessages
	set := map[string][]byte{}

	if maxInputTokens > 0 {
		msgs, err := trimMessages(rs, &top, anthropic, maxInputTokens, c)
		if err != nil {
			return nil, false, err
		}
		if msgs != nil {
			set["messages"] = msgs
		}
	}

	if maxTokens > 0 {
		if err := capOutput(&top, anthropic, maxTokens, set); err != nil {
			return nil, false, err
		}
	}

	if len(set) == 0 {
		return body, false, nil
	}
	return rewriteTop(rs, body, set), true, nil
}

// capOutput sets in set the output caps of top above maxTokens to it, in
// whichever of max_completion_tokens and max_tokens the body sets, or
// adds max_tokens.
func capOutput(top *topLevel, anthropic bool, maxTokens int, set map[string][]byte) error {
	capped := false
	for _, j := range []int{tMaxTokens, tMaxCompletionTokens} {
		if anthropic && j != tMaxTokens || !present(top[j]) {
			continue
		}
		n, err := getInt(top[j], topNames[j], 0)
		if err != nil {
			return err
		}
		capped = true
		if n > maxTokens {
			set[topNames[j]] = strconv.AppendInt(nil, int64(maxTokens), 10)
		}
	}
	if !capped {
		set["max_tokens"] = strconv.AppendInt(nil, int64(maxTokens), 10)
	}
	return nil
}

// lightModeBudget is how many times its exact budget a bounded counter may
// spend on one LightMode call, which counts the kept messages, the
// truncated one and its attempts at truncation.
const lightModeBudget = 4

// spendingCounter bounds the tokenizer work of one LightMode call, which
// counts many texts each within the counter's own budget but together
// without bound. It counts exactly until it has spent left bytes, then at
// the ratio so far; each exact call spends at least minCallBytes.
type spendingCounter struct {
	inner         Counter
	exact         int // the inner counter's own budget per call
	left          int
	tokens, bytes int64
}

func (s *spendingCounter) Name() string { return s.inner.Name() }

func (s *spendingCounter) Count(text string) int {
	if s.left <= 0 {
		if s.bytes == 0 {
			return len(text) / 4
		}
		return int((int64(len(text))*s.tokens + s.bytes/2) / s.bytes)
	}
	n := s.inner.Count(text)
	s.left -= max(min(len(text), s.exact), minCallBytes)
	s.tokens += int64(n)
	s.bytes += int64(len(text))
	return n
}

// rewriteTop re-emits the object in body with the values of the members
// in set replaced, or appended when absent, and every other member copied
// verbatim. Keys are matched after decoding escapes, as the parser matches
// them, and written as the client wrote them.
func rewriteTop(rs *readers, body []byte, set map[string][]byte) []byte {
	out := append(make([]byte, 0, len(body)+64), '{')
	emit := func(key, v []byte) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(append(append(out, key...), ':'), v...)
	}
	replaced := map[string]bool{}
	r := rs.open(body, 0)
	r.next()
	for r.member() {
		key, name := r.raw, string(r.name())
		v := r.value()
		if nv, ok := set[name]; ok {
			v, replaced[name] = nv, true
		}
		emit(key, v)
	}
	rs.close()
	// Missing members are appended in sorted order, so that equal inputs
	// give equal bodies.
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if !replaced[k] {
			emit([]byte(`"`+k+`"`), set[k])
		}
	}
	return append(out, '}')
}

type lmMessage struct {
	raw      []byte
	role     string
	parsed   Request   // the message's counts
	texts    []textRef // and its texts
	cost     int       // -1 until counted
	system   bool
	calls    bool // calls tools: the results that follow belong to it
	results  bool // carries tool results
	modified bool
}

// trimmer is one LightMode call's trimming of the messages.
type trimmer struct {
	rs        *readers
	anthropic bool
	c         Counter
	fixed     walker // what is kept whatever happens
	msgs      []lmMessage
}

// trimMessages returns the new messages array, or nil when all messages fit.
func trimMessages(rs *readers, top *topLevel, anthropic bool, limit int, c Counter) ([]byte, error) {
	switch rawType(top[tMessages]) {
	case 0, 'n':
		return nil, nil
	case '[':
	default:
		return nil, fieldError("messages", "must be an array, got %s", typeName(rawType(top[tMessages])))
	}
	t := &trimmer{rs: rs, anthropic: anthropic, c: c, fixed: walker{rs: rs, r: &Request{}, collect: true}}
	upper, err := t.read(top[tMessages])
	if len(t.msgs) == 0 {
		return nil, nil
	}
	if err := t.addFixed(top); err != nil {
		return nil, err
	}
	if err != nil || upper+len(top[tSystem])+len(top[tTools])+len(top[tFunctions]) <= limit {
		return nil, err
	}
	units := groupUnits(t.msgs)
	keep, budget := t.keepNewest(units, t.budget(limit))
	keep = t.keepWhole(units, keep, budget)
	return t.join(units[:keep]), nil
}

// addFixed gathers what is kept whatever happens: tools, the Anthropic
// system prompt; system messages are counted in budget.
func (t *trimmer) addFixed(top *topLevel) error {
	if t.anthropic {
		if err := t.fixed.from(top[tSystem], func(k jsontext.Kind) error { return t.fixed.promptMember(tSystem, k) }); err != nil {
			return err
		}
	} else {
		t.fixed.addJSON(top[tFunctions])
	}
	t.fixed.addJSON(top[tTools])
	return nil
}

// read walks the messages array raw, and returns a bound on their cost: a
// token covers at least one byte of JSON text, so it needs no tokenizing.
func (t *trimmer) read(raw []byte) (upper int, err error) {
	upper = MessageOverhead + ReplyPriming
	w := walker{rs: t.rs, collect: true}
	w.push("messages")
	err = w.from(raw, func(jsontext.Kind) error {
		return w.elements(func(k jsontext.Kind) error {
			t.msgs = append(t.msgs, lmMessage{cost: -1})
			m := &t.msgs[len(t.msgs)-1]
			r, start := &m.parsed, w.rd.start
			w.r, w.texts, w.toolUse, w.toolResult = r, nil, false, false
			v, err := w.message(k, t.anthropic)
			m.raw, m.role, m.texts = w.rd.since(start), string(stringBytes(v[msgRole])), w.texts
			switch {
			case t.anthropic:
				m.calls, m.results = w.toolUse, w.toolResult
			case m.role == "assistant":
				calls := v[msgToolCalls]
				m.calls = rawType(calls) == '[' && len(bytes.TrimSpace(calls[1:])) > 1 || present(v[msgFunctionCall])
			case m.role == "tool", m.role == "function":
				m.results = true
			case m.role == "system", m.role == "developer":
				m.system = true
			}
			upper += len(m.raw) + r.Messages*MessageOverhead + r.Names + r.Images*ImageTokens + r.TokenIDs
			return err
		})
	})
	return upper, err
}

// budget is what limit leaves for the messages other than system ones.
func (t *trimmer) budget(limit int) int {
	fixedCost, _ := promptTokens(t.fixed.r, t.fixed.texts, t.c, nil)
	budget := limit - saturate(fixedCost)
	if t.fixed.r.Messages == 0 {
		budget -= ReplyPriming // Estimate adds it only when there are messages
	}
	for i := range t.msgs {
		if t.msgs[i].system {
			budget -= t.msgs[i].tokens(t.c)
		}
	}
	return budget
}

// keepNewest returns the first of the units kept, the newest that fit
// budget, and what is left of it; work is bounded by the limit, not the
// conversation. When not even the newest fits, it is truncated.
func (t *trimmer) keepNewest(units [][]int, budget int) (keep, left int) {
	keep = len(units) // units[keep:] are kept
	for keep > 0 {
		cost := unitCost(t.msgs, units[keep-1], t.c)
		if cost > budget {
			break
		}
		budget -= cost
		keep--
	}
	if keep < len(units) || len(units) == 0 {
		return keep, budget
	}
	keep--
	truncateUnit(t.rs, t.msgs, units[keep], max(budget, MinKeepTokens), t.anthropic, t.c)
	return keep, 0
}

// keepWhole moves the start of what is kept so that no tool result loses
// its call and an Anthropic conversation opens with a user turn.
func (t *trimmer) keepWhole(units [][]int, keep, budget int) int {
	if len(units) == 0 {
		return 0
	}
	first := func() *lmMessage { return &t.msgs[units[keep][0]] }
	// An orphan result (already so in the original) at the start goes.
	for keep < len(units)-1 && first().results && !first().calls {
		keep++
	}
	if !t.anthropic {
		return keep
	}
	for keep < len(units)-1 && first().role == "assistant" {
		keep++
	}
	if first().role == "assistant" && keep > 0 {
		// Only an assistant turn is left (a prefill): bring back the
		// turn before it, truncated if need be.
		keep--
		truncateUnit(t.rs, t.msgs, units[keep], max(budget, MinKeepTokens), t.anthropic, t.c)
	}
	return keep
}

// join returns the messages array without the units dropped, nil when
// that changes nothing.
func (t *trimmer) join(dropped [][]int) []byte {
	drop := make([]bool, len(t.msgs))
	changed := false
	for _, u := range dropped {
		for _, i := range u {
			drop[i], changed = true, true
		}
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, m := range t.msgs {
		if drop[i] {
			continue
		}
		changed = changed || m.modified
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.Write(m.raw)
	}
	b.WriteByte(']')
	if !changed {
		return nil
	}
	return b.Bytes()
}

// tokens is the message's cost as Estimate counts it.
func (m *lmMessage) tokens(c Counter) int {
	if m.cost < 0 {
		r := &m.parsed
		m.cost = r.Messages*MessageOverhead + r.Names + r.Images*ImageTokens + r.TokenIDs + countTexts(c, textStrings(nil, m.texts))
	}
	return m.cost
}

// groupUnits splits the non-system messages into the units kept or
// dropped whole: a tool call with its results, or a single message.
func groupUnits(msgs []lmMessage) [][]int {
	var units [][]int
	for i := 0; i < len(msgs); i++ {
		if msgs[i].system {
			continue
		}
		u := []int{i}
		if msgs[i].calls {
			for i+1 < len(msgs) && msgs[i+1].results && !msgs[i+1].system {
				i++
				u = append(u, i)
				if msgs[i].role == "user" {
					break // Anthropic: one user turn holds all results
				}
			}
		}
		units = append(units, u)
	}
	return units
}

func unitCost(msgs []lmMessage, u []int, c Counter) int {
	n := 0
	for _, i := range u {
		n += msgs[i].tokens(c)
	}
	return n
}

// truncateUnit shrinks a unit to about budget tokens. The tool calls of a
// unit are kept whole (cut JSON arguments would be worse than none); its
// results, or its only message, share what is left.
func truncateUnit(rs *readers, msgs []lmMessage, u []int, budget int, anthropic bool, c Counter) {
	cut := u
	if len(u) > 1 {
		budget -= msgs[u[0]].tokens(c)
		cut = u[1:]
	}
	total := unitCost(msgs, cut, c)
	for _, i := range cut {
		share := budget
		if total > 0 {
			share = int(int64(budget) * int64(msgs[i].cost) / int64(total))
		}
		share = max(share, MinKeepTokens/len(cut))
		if msgs[i].cost <= share {
			continue
		}
		m := &msgs[i]
		content := rs.member(m.raw, "content")
		// Tokens of the message that are not its content stay.
		w := walker{rs: rs, r: &Request{}, collect: true}
		_ = w.from(content, func(k jsontext.Kind) error { return w.content(k, anthropic) })
		contentCost := w.r.Images*ImageTokens + countTexts(c, textStrings(nil, w.texts))
		newContent := shrinkContent(rs, content, share-(m.cost-contentCost), anthropic, false, c)
		if newContent != nil {
			m.raw = rewriteTop(rs, m.raw, map[string][]byte{"content": newContent})
			m.modified = true
		}
	}
}

// shrinkContent returns content cut to about budget tokens, or nil when it
// cannot be or need not be cut. Tool results within it are cut too, unless
// nested: those inside tool results are kept or dropped whole, so a
// hostile body is not walked once per level.
func shrinkContent(rs *readers, content []byte, budget int, anthropic, nested bool, c Counter) []byte {
	budget = max(budget, 1)
	switch rawType(content) {
	case '"':
		t, ok := truncateText(string(stringBytes(content)), budget, c)
		if !ok {
			return nil
		}
		return encodeString(t)
	case '[':
	default:
		return nil
	}
	// Parts: images and other non-text parts stay; text parts share the
	// budget in proportion to their size.
	var parts [][]byte
	var costs []int
	var results []bool
	textTotal, fixedCost := 0, 0
	w := walker{rs: rs, collect: true}
	_ = w.from(content, func(jsontext.Kind) error {
		return w.elements(func(k jsontext.Kind) error {
			start := w.rd.start
			w.r, w.texts, w.toolResult = &Request{}, w.texts[:0], false
			_ = w.part(k, anthropic)
			parts, results = append(parts, w.rd.since(start)), append(results, w.toolResult)
			n := countTexts(c, textStrings(nil, w.texts))
			fixedCost += w.r.Images * ImageTokens
			if nested && w.toolResult {
				fixedCost += n
				n = 0
			}
			costs = append(costs, n)
			textTotal += n
			return nil
		})
	})
	avail := max(budget-fixedCost, 1)
	if textTotal <= avail {
		return nil
	}
	changed := false
	for i, p := range parts {
		if costs[i] == 0 {
			continue
		}
		share := max(int(int64(avail)*int64(costs[i])/int64(textTotal)), 1)
		key := "text"
		if results[i] {
			key = "content"
		}
		nv := shrinkContent(rs, rs.member(p, key), share, anthropic, true, c)
		if nv != nil {
			parts[i] = rewriteTop(rs, p, map[string][]byte{key: nv})
			changed = true
		}
	}
	if !changed {
		return nil
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(p)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// truncateText keeps the start and the end of s, about budget tokens in
// all, with truncationMarker between them.
func truncateText(s string, budget int, c Counter) (string, bool) {
	n := c.Count(s)
	if n <= budget {
		return s, false
	}
	target := max(budget-c.Count(truncationMarker), 2)
	bytesPerToken := float64(len(s)) / float64(n)
	var t string
	for range 8 {
		keep := int(float64(target) * bytesPerToken)
		head := cutBack(s, keep/2)
		tail := max(cutForward(s, len(s)-(keep-keep/2)), head)
		t = s[:head] + truncationMarker + s[tail:]
		got := c.Count(t)
		if got <= budget || keep <= 2 {
			break
		}
		// Shrink by what this attempt overshot, and a little more, so
		// that the loop ends quickly.
		bytesPerToken *= float64(budget) / float64(got) * 0.97
	}
	if len(t) >= len(s) {
		// A text shorter than the marker cannot be cut.
		return s, false
	}
	return t, true
}

// cutBack returns an index <= i at a rune boundary, preferring the end of a
// word within a short distance.
func cutBack(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	i = max(i, 0)
	for j := i; j > 0 && j > i-32; j-- {
		if s[j] == ' ' || s[j] == '\n' {
			return j
		}
	}
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

// cutForward returns an index >= i at a rune boundary, preferring the start
// of a word within a short distance.
func cutForward(s string, i int) int {
	if i <= 0 {
		return 0
	}
	for j := i; j < len(s) && j < i+32; j++ {
		if s[j] == ' ' || s[j] == '\n' {
			return j + 1
		}
	}
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return i
}

func encodeString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// Keep <, > and & readable: the body goes to a model, not a browser.
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}
