package llmapi

import "math/bits"

// Skimming: ParseUsage's reading of a response, which runs once per
// non-streamed response. It reads as scan.member and decodeUsage read
// (they stay the StreamScanner's, whose work the fuzz target counts), with
// the same leniency on what is not JSON, but without their closures and
// their counting: a response's bytes are mostly the strings of its
// choices, stepped over a word at a time, and the brackets between them,
// found by a table lookup a byte. TestSkimMatchesScan and FuzzParseUsage
// hold the two to the same result on every input.

// Classes of the bytes a skimmed container holds (see skimValue); 0 for
// the bytes that do not matter there.
const (
	skimQuote = 1 + iota
	skimOpen
	skimClose
)

var skimClass = func() (t [256]uint8) {
	t['"'] = skimQuote
	t['{'], t['['] = skimOpen, skimOpen
	t['}'], t[']'] = skimClose, skimClose
	return t
}()

// skimDelim marks the bytes that end a value that is neither a string nor
// a container (see scan.valueEndDepth).
var skimDelim = func() (t [256]bool) {
	for _, c := range []byte(",}] \t\n\r") {
		t[c] = true
	}
	return t
}()

// skimString is scan.stringEnd: the index just past the string starting
// at b[i] == '"', where a backslash escapes whatever byte follows it, or
// -1. Its test of the first word is small enough to be inlined: most
// strings of a response are keys and short values that end in it.
func skimString(b []byte, i int) int {
	e, _ := skimStringEsc(b, i)
	return e
}

// skimStringEsc is skimString that also reports whether the string may
// hold an escape: it does not when it ends within its first word.
func skimStringEsc(b []byte, i int) (end int, esc bool) {
	j := i + 1
	if j >= 0 && j+8 <= len(b) {
		x := load64(b, j)
		q, e := x^(swarLSB*'"'), x^(swarLSB*'\\')
		if m := ((q-swarLSB)&^q | (e-swarLSB)&^e) & swarMSB; m == 0 {
			j += 8
		} else if j += bits.TrailingZeros64(m) >> 3; b[j] == '"' {
			return j + 1, false
		}
	}
	return skimStringFrom(b, j), true
}

// wordEnd returns the index just past the quote that closes a string
// whose characters start at b[j] (j > 0), when that quote comes in the 8
// bytes from b[j] with no backslash before it (a key or a short value); 0
// otherwise. It is small enough to be inlined, which a call per string
// would cost as much as.
func wordEnd(b []byte, j int) int {
	if j+8 > len(b) {
		return 0
	}
	x := load64(b, j)
	q := x ^ (swarLSB * '"')
	mq := (q - swarLSB) &^ q
	e := x ^ (swarLSB * '\\')
	// The lowest flag is exact: it is the first quote when mq has it.
	if low := (mq | (e-swarLSB)&^e) & swarMSB; low&-low&mq != 0 {
		return j + bits.TrailingZeros64(low)>>3 + 1
	}
	return 0
}

// skimStringFrom is skimString carried on from b[j], where a character
// starts.
func skimStringFrom(b []byte, j int) int {
	for {
		for j+8 <= len(b) { // j > 0: it follows a quote
			x := load64(b, j)
			q, e := x^(swarLSB*'"'), x^(swarLSB*'\\')
			if m := ((q-swarLSB)&^q | (e-swarLSB)&^e) & swarMSB; m != 0 {
				j += bits.TrailingZeros64(m) >> 3
				goto found
			}
			j += 8
		}
		for j < len(b) && b[j] != '"' && b[j] != '\\' {
			j++
		}
		if j >= len(b) {
			return -1
		}
	found:
		if b[j] == '"' {
			return j + 1
		}
		j += 2 // a backslash and the byte it escapes
		if j > len(b) {
			return -1
		}
	}
}

// skimValue is scan.valueEnd: the index just past the value starting at
// b[i], or -1. A container ends where its brackets, of either kind,
// balance; a short string's end is found in place (wordEnd), a long one's
// without the calls in between.
func skimValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		if e := wordEnd(b, i+1); e > 0 {
			return e
		}
		return skimStringFrom(b, i+1)
	case '{', '[':
		return skimContainer(b, i)
	}
	return skimScalar(b, i)
}

// skimScalar is skimValue for a number or literal at b[i]: it ends at the
// first delimiter; -1 when there is none to skim.
func skimScalar(b []byte, i int) int {
	j := i
	for j < len(b) && !skimDelim[b[j]] {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// skimContainer is skimValue for the array or object at b[i]. Between
// strings it looks at each byte's class; a string's end it looks for a
// word at a time, in place: a response's strings are short and many, and
// a call per string would cost as much as its bytes.
func skimContainer(b []byte, i int) int {
	depth := 0
	run := 0 // bytes that do not matter, in a row
	for j := i; j < len(b); j++ {
		switch skimClass[b[j]] {
		case 0:
			if run++; run < 4 || j+9 > len(b) {
				continue
			}
			// A run of bytes that do not matter (the numbers of an
			// embedding): a word at a time to the next quote or
			// bracket. OR-ing 0x26 into a byte maps the four brackets,
			// and only them, Y, _, y and DEL, to 0x7f; the loop steps
			// over those few as it steps over any other byte.
			for j+9 <= len(b) {
				x := load64(b, j+1)
				q, o := x^(swarLSB*'"'), x|swarLSB*0x26^swarLSB*0x7f
				if m := ((q-swarLSB)&^q | (o-swarLSB)&^o) & swarMSB; m != 0 {
					j += bits.TrailingZeros64(m) >> 3 // the byte before it
					break
				}
				j += 8
			}
			continue
		case skimOpen:
			depth, run = depth+1, 0
			continue
		case skimClose:
			if depth--; depth == 0 {
				return j + 1
			}
			run = 0
			continue
		}
		// A string: j moves to its closing quote.
		run = 0
		j++
	words:
		for j+8 <= len(b) { // j > i >= 0
			x := load64(b, j)
			q, e := x^(swarLSB*'"'), x^(swarLSB*'\\')
			if m := ((q-swarLSB)&^q | (e-swarLSB)&^e) & swarMSB; m != 0 {
				if j += bits.TrailingZeros64(m) >> 3; b[j] == '"' {
					break words
				}
				j += 2 // a backslash and the byte it escapes
				continue
			}
			j += 8
		}
		if j+8 > len(b) {
			if j = skimStringFrom(b, j); j < 0 {
				return -1
			}
			j-- // the closing quote
		}
	}
	return -1
}

// isKey reports whether the raw key k (between its quotes) is key, which
// has no escapes. A raw key of key's length is key only as it stands; an
// escape makes a raw key longer than what it decodes to.
func isKey(k []byte, key string) bool {
	return len(k) == len(key) && string(k) == key ||
		len(k) > len(key) && (k[0] == key[0] || k[0] == '\\') && escaped(k) && string(appendUnquoted(nil, k)) == key
}

// skimLastUsage is decodeUsage(scan.member(b, "usage")), which ParseUsage
// reads, in one pass: a usage member is decoded where it stands, and only
// one that skimUsageAt refuses is stepped over again, to find where it
// ends.
func skimLastUsage(b []byte) (prompt, completion int, ok bool) {
	prompt, completion = -1, -1 // decodeUsage(nil)
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return
	}
	i = skipJSONSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		// The members of a chat completion, recognized with their
		// closing quote by one compare each (see nameWord); any other
		// name is looked for, and compared with usage, as it stands.
		var ke int
		usage := false
		switch x := nameWord(b, i); {
		case x&(1<<24-1) == quotedID:
			ke = i + 4
		case x&(1<<56-1) == quotedObject:
			ke = i + 8
		case x == quotedCreated:
			ke = i + 9
		case x&(1<<48-1) == quotedModel:
			ke = i + 7
		case x == quotedChoices:
			ke = i + 9
		case x&(1<<48-1) == quotedUsage:
			ke, usage = i+7, true
		default:
			if ke = wordEnd(b, i+1); ke == 0 {
				if ke = skimString(b, i); ke < 0 {
					return
				}
			}
			usage = isKey(b[i+1:ke-1], "usage")
		}
		i = skipJSONSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return
		}
		i = skipJSONSpace(b, i+1)
		if usage {
			p, c, uok, e := skimUsageAt(b, i)
			if e < 0 {
				e = skimValue(b, i)
			}
			if e < 0 {
				return
			}
			prompt, completion, ok, i = p, c, uok, e
		} else if i = skimValue(b, i); i < 0 {
			return
		}
		if i = skipJSONSpace(b, i); i >= len(b) || b[i] != ',' {
			return
		}
		i = skipJSONSpace(b, i+1)
	}
	return
}

// skimUsageAt is decodeUsage for the value at b[i], without a scan, and
// also returns where that value ends when it is an object decodeUsage
// accepts as well formed,
// -1 otherwise. The end is skimValue's: its brackets balance there, unless
// a member's value that is neither a string nor a container holds a quote
// or a bracket, which skimValue would count (then end is -1 too).
func skimUsageAt(b []byte, i int) (prompt, completion int, ok bool, end int) {
	if i >= len(b) || b[i] != '{' {
		return -1, -1, false, -1
	}
	pt, ct, it, ot, cache := -1, -1, -1, -1, -1
	odd := false // a value holds what skimValue would count
	// scan.object, member by member, as eachMember calls decodeUsage's
	// function: an object that is not well formed counts for nothing.
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return -1, -1, false, i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return -1, -1, false, -1
		}
		f, ke := knownUsageField(b, i)
		esc := false
		if ke == 0 {
			if ke, esc = skimStringEsc(b, i); ke < 0 {
				return -1, -1, false, -1
			}
			f = usageField(b[i+1 : ke-1])
			if f < 0 && esc && escaped(b[i+1:ke-1]) {
				f = usageField(appendUnquoted(nil, b[i+1:ke-1]))
			}
		}
		i = skipJSONSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return -1, -1, false, -1
		}
		i = skipJSONSpace(b, i+1)
		if i >= len(b) {
			return -1, -1, false, -1
		}
		// The value's end, as skimValue finds it, and the count it holds,
		// as tokenCount reads it: strings and containers hold none.
		var e, n int
		isNum := false
		switch b[i] {
		case '"':
			e = skimString(b, i)
		case '{', '[':
			e = skimContainer(b, i)
		default:
			// skimValue's loop, which also notes what it would count,
			// and reads plain digits as smallInt does.
			digits, v := true, 0
			for e = i; e < len(b) && !skimDelim[b[e]]; e++ {
				c := b[e]
				odd = odd || skimClass[c] != 0
				if d := int(c) - '0'; d >= 0 && d <= 9 {
					v = v*10 + d
				} else {
					digits = false
				}
			}
			switch {
			case e == i:
				e = -1
			case digits && e-i <= 15:
				n, isNum = min(v, 1<<31-1), true
			default:
				n, isNum = tokenCount(b[i:e])
			}
		}
		if e < 0 {
			return -1, -1, false, -1
		}
		if isNum {
			switch f {
			case usagePrompt:
				pt = n
			case usageCompletion:
				ct = n
			case usageInput:
				it = n
			case usageOutput:
				ot = n
			case usageCache:
				cache = max(cache, 0) + n
			}
		}
		i = skipJSONSpace(b, e)
		if i >= len(b) {
			return -1, -1, false, -1
		}
		if b[i] == '}' {
			end = i + 1
			if odd {
				end = -1
			}
			break
		}
		if b[i] != ',' {
			return -1, -1, false, -1
		}
		i = skipJSONSpace(b, i+1)
	}
	prompt, completion, ok = combineUsage(pt, ct, it, ot, cache)
	return prompt, completion, ok, end
}

// escaped reports whether the raw key k holds an escape: short keys, with
// no call.
func escaped(k []byte) bool {
	for _, c := range k {
		if c == '\\' {
			return true
		}
	}
	return false
}

// The names of a chat completion's members, each with its closing quote,
// as little-endian words (see nameWord).
const (
	quotedID      = 'i' | 'd'<<8 | '"'<<16
	quotedObject  = 'o' | 'b'<<8 | 'j'<<16 | 'e'<<24 | 'c'<<32 | 't'<<40 | '"'<<48
	quotedCreated = 'c' | 'r'<<8 | 'e'<<16 | 'a'<<24 | 't'<<32 | 'e'<<40 | 'd'<<48 | '"'<<56
	quotedChoices = 'c' | 'h'<<8 | 'o'<<16 | 'i'<<24 | 'c'<<32 | 'e'<<40 | 's'<<48 | '"'<<56
	quotedUsage   = 'u' | 's'<<8 | 'a'<<16 | 'g'<<24 | 'e'<<32 | '"'<<40
)

// The members of a usage object that count.
const (
	usagePrompt = iota
	usageCompletion
	usageInput
	usageOutput
	usageCache // Anthropic's cache reads and writes
)

// knownUsageField recognizes the member name at b[i] == '"' when it is
// one of OpenAI's token counts as written, by compares of its words,
// instead of looking for its closing quote: it returns the name's
// usageField and the index past the quote, or 0 for any other name. All
// of them end in _tokens", their last word (quotedTokens).
func knownUsageField(b []byte, i int) (field, end int) {
	const (
		promptT  = 'p' | 'r'<<8 | 'o'<<16 | 'm'<<24 | 'p'<<32 | 't'<<40 | '_'<<48 | 't'<<56
		completi = 'c' | 'o'<<8 | 'm'<<16 | 'p'<<24 | 'l'<<32 | 'e'<<40 | 't'<<48 | 'i'<<56
		mpletion = 'm' | 'p'<<8 | 'l'<<16 | 'e'<<24 | 't'<<32 | 'i'<<40 | 'o'<<48 | 'n'<<56
		totalTo  = 't' | 'o'<<8 | 't'<<16 | 'a'<<24 | 'l'<<32 | '_'<<40 | 't'<<48 | 'o'<<56
		inputTok = 'i' | 'n'<<8 | 'p'<<16 | 'u'<<24 | 't'<<32 | '_'<<40 | 't'<<48 | 'o'<<56
		outputT  = 'o' | 'u'<<8 | 't'<<16 | 'p'<<24 | 'u'<<32 | 't'<<40 | '_'<<48 | 't'<<56
	)
	if i+19 > len(b) { // the longest name, and what follows it
		return -1, 0
	}
	switch load64(b, i+1) {
	case promptT:
		field, end = usagePrompt, i+len(`"prompt_tokens"`)
	case outputT:
		field, end = usageOutput, i+len(`"output_tokens"`)
	case inputTok:
		field, end = usageInput, i+len(`"input_tokens"`)
	case totalTo:
		field, end = -1, i+len(`"total_tokens"`)
	case completi:
		if load64(b, i+3) != mpletion {
			return -1, 0
		}
		field, end = usageCompletion, i+len(`"completion_tokens"`)
	default:
		return -1, 0
	}
	if load64(b, end-8) != quotedTokens {
		return -1, 0
	}
	return field, end
}

func usageField(k []byte) int {
	switch string(k) {
	case "prompt_tokens":
		return usagePrompt
	case "completion_tokens":
		return usageCompletion
	case "input_tokens":
		return usageInput
	case "output_tokens":
		return usageOutput
	case "cache_creation_input_tokens", "cache_read_input_tokens":
		return usageCache
	}
	return -1
}
