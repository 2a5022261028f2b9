package llmapi

import (
	"fmt"
	"sort"
	"unicode"
	"unicode/utf8"
)

// Counter counts the tokens of a piece of text. Implementations must be safe
// for concurrent use: one Counter serves every request of a gateway.
type Counter interface {
	Count(text string) int
	// Name is the tokenizer's configuration name, e.g. "cl100k_base".
	Name() string
}

// Names of the counters NewCounter knows.
const (
	CL100kBase = "cl100k_base"
	O200kBase  = "o200k_base"
	Approx     = "approx"
)

// DefaultExactBytes is the per-request budget of text that the BPE
// counters returned by NewCounter tokenize exactly; beyond it the count is
// extrapolated (see WithExactBudget).
const DefaultExactBytes = 64 << 10

// NewCounter returns the named counter: "cl100k_base" and "o200k_base" are
// exact BPE tokenizers bounded by DefaultExactBytes, "approx" a heuristic
// with no vocabulary. The BPE ranks load once per process, on first use;
// calling NewCounter at provisioning moves that cost off the first request.
func NewCounter(name string) (Counter, error) {
	switch name {
	case Approx:
		return approxCounter{}, nil
	case CL100kBase, O200kBase:
		bpe, err := loadBPE(name)
		if err != nil {
			return nil, fmt.Errorf("loading tokenizer %s: %w", name, err)
		}
		return &boundedCounter{inner: bpe, exactBytes: DefaultExactBytes}, nil
	default:
		return nil, fmt.Errorf("unknown tokenizer %q: valid tokenizers are %s, %s and %s", name, CL100kBase, O200kBase, Approx)
	}
}

// WithExactBudget returns c with a different exact-counting budget, in bytes
// of prompt text per request (or per text for a bare Count call). Beyond
// it, the count is extrapolated from evenly spaced windows over the whole
// text, so a prompt whose start differs from the rest is still estimated
// fairly. bytes <= 0 removes the bound.
func WithExactBudget(c Counter, bytes int) Counter {
	if b, ok := c.(*boundedCounter); ok {
		c = b.inner
	}
	if bytes <= 0 {
		return c
	}
	return &boundedCounter{inner: c, exactBytes: bytes}
}

// Character classes matching the coarse structure of the cl100k and o200k
// pre-tokenizer patterns: a piece never spans a letter/number boundary, and
// a letter or number is always followed by a new piece when whitespace or a
// symbol comes next.
type charClass uint8

const (
	classLetter charClass = iota
	classNumber
	classSpace
	classOther
	classNone
)

var asciiClass = func() (t [utf8.RuneSelf]charClass) {
	for i := range t {
		r := rune(i)
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
			t[i] = classLetter
		case '0' <= r && r <= '9':
			t[i] = classNumber
		case r == ' ', r == '\t', r == '\n', r == '\r', r == '\v', r == '\f':
			t[i] = classSpace
		default:
			t[i] = classOther
		}
	}
	return t
}()

func classOf(r rune) charClass {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r), unicode.Is(unicode.M, r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// alignForward moves i forward (by at most limit bytes) to a position where
// both tokenizers start a new piece, so that counting s[i:] alone matches
// the tokens s had there. Failing that, it only moves to a rune boundary.
func alignForward(s string, i, limit int) int {
	if i <= 0 {
		return 0
	}
	if i >= len(s) {
		return len(s)
	}
	end := min(len(s), i+limit)
	for j := i; j < end; j++ {
		if !utf8.RuneStart(s[j]) {
			continue
		}
		r, _ := utf8.DecodeRuneInString(s[j:])
		p, _ := utf8.DecodeLastRuneInString(s[:j])
		pc, c := classOf(p), classOf(r)
		// An apostrophe after a letter may continue a contraction ("'s").
		if (pc == classLetter || pc == classNumber) && (c == classSpace || c == classOther && r != '\'' && r != '\u2019') {
			return j
		}
	}
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return i
}

// boundedCounter bounds the tokenizer work per request; see WithExactBudget.
type boundedCounter struct {
	inner      Counter
	exactBytes int
}

func (b *boundedCounter) Name() string { return b.inner.Name() }

func (b *boundedCounter) Count(text string) int {
	if len(text) <= b.exactBytes {
		return b.inner.Count(text)
	}
	return sampleCount(b.inner, b.exactBytes, []string{text})
}

// countTexts counts texts as separately tokenized strings, within c's exact
// budget when it has one; the budget bounds the tokenizer calls as well as
// the bytes, so many tiny strings are sampled like one long one.
func countTexts(c Counter, texts []string) int {
	if s, ok := c.(*sampledCounter); ok {
		return s.countTexts(texts)
	}
	if b, ok := c.(*boundedCounter); ok {
		total := 0
		for _, t := range texts {
			total += len(t)
		}
		if total > b.exactBytes || len(texts) > b.exactBytes/minCallBytes {
			return sampleCount(b.inner, b.exactBytes, texts)
		}
		c = b.inner
	}
	n := 0
	for _, t := range texts {
		n += c.Count(t)
	}
	return n
}

// sampleWindow is the size of one sampling window: many small windows
// follow changes of content across a long prompt better than a few large.
const sampleWindow = 512

// minCallBytes is what one tokenizer call costs, counted in bytes of the
// exact budget: the call's own overhead is that of tokenizing some 64 bytes.
const minCallBytes = 64

// maxWindowTexts bounds the texts counted in one sampling window; the
// first of many tiny texts measure their bytes per token well enough.
const maxWindowTexts = 8

// sampleCount estimates the tokens of texts (each tokenized on its own)
// whose total size exceeds budget, by counting budget bytes in evenly spaced
// windows over their concatenation and scaling up by bytes.
func sampleCount(c Counter, budget int, texts []string) int {
	starts := make([]int, len(texts)+1) // starts[i] is the offset of texts[i]
	for i, t := range texts {
		starts[i+1] = starts[i] + len(t)
	}
	total := starts[len(texts)]
	window := min(sampleWindow, max(budget/8, 64))
	k := max(budget/window, 1)
	var tokens, counted int64
	for j := range k {
		center := int((int64(2*j+1) * int64(total)) / int64(2*k))
		lo := max(center-window/2, 0)
		hi := min(lo+window, total)
		// Visit every text overlapping [lo, hi).
		i := sort.SearchInts(starts, lo+1) - 1
		for n := 0; i < len(texts) && starts[i] < hi && n < maxWindowTexts; i, n = i+1, n+1 {
			t := texts[i]
			a, b := max(lo-starts[i], 0), min(hi-starts[i], len(t))
			if a > 0 {
				a = alignForward(t, a, 256)
			}
			if b < len(t) {
				b = alignForward(t, b, 256)
			}
			if a >= b {
				continue
			}
			tokens += int64(c.Count(t[a:b]))
			counted += int64(b - a)
		}
	}
	if counted == 0 {
		return total / 4
	}
	return int((tokens*int64(total) + counted/2) / counted)
}

// approxCounter estimates cl100k_base counts from character classes, with
// no vocabulary in memory:
//
//   - a run of letters is one token, plus one per further 8 letters;
//     a non-ASCII letter in it adds a token;
//   - a CJK ideograph, kana or hangul syllable is 1.25 tokens;
//   - digits are one token per started group of three;
//   - a run of ASCII punctuation is one token per two characters;
//   - a single space is free, any other run of whitespace is one token;
//   - any other character is one token.
type approxCounter struct{}

func (approxCounter) Name() string { return Approx }

func (approxCounter) Count(s string) int {
	// Quarter tokens, to stay in integers. The text is a sequence of runs
	// of one kind (letters, digits, punctuation, whitespace); a CJK
	// character or another non-ASCII symbol ends the run before it and is
	// charged on its own. A run's tokens are charged as it grows, at the
	// characters that start a new one (see approxStates), so that the
	// state is one small number and each ASCII byte one lookup in
	// approxStep, with no branch on what the byte is.
	q, row := 0, uint32(stNone)<<7 // row: the state's row in approxStep
	for i := 0; i < len(s); {
		if i+8 <= len(s) {
			if x := stringWord(s, i); x&0x8080808080808080 == 0 {
				// Eight ASCII bytes: their steps unrolled, with no
				// test of what each is.
				var q8 int
				row, q8 = approxSteps(row, x)
				q += q8
				i += 8
				continue
			}
		}
		c := s[i]
		if c < utf8.RuneSelf {
			row, q = approxByte(row, uint32(c), q)
			i++
			continue
		}
		st := uint8(row >> 7)
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if isCaselessCJK(r) { // without the searches of classOf and isCJK
			q += 5
			row = stNone << 7
			continue
		}
		switch c := classOf(r); {
		case c == classLetter && isCJK(r):
			q += 5
			st = stNone
		case c == classLetter:
			// A letter run, plus a token for the letter.
			q += 4
			t := approxNext[st&15][runLetter]
			q += int(t >> 4)
			st = t & 15
		case c == classNumber:
			t := approxNext[st&15][runDigit]
			q += int(t >> 4)
			st = t & 15
		case c == classSpace:
			t := approxNext[st&15][runBreak] // a space that is not ' '
			q += int(t >> 4)
			st = t & 15
		default:
			q += 4
			st = stNone
		}
		row = uint32(st) << 7
	}
	return (q + 3) / 4
}

// approxByte is the approx counter's step over the ASCII byte c, from the
// state whose row is row, charging q.
func approxByte(row, c uint32, q int) (uint32, int) {
	t := approxStep[(row|c)&(uint32(len(approxStep))-1)]
	return t & stRows, q + int(t&7)
}

// approxSteps is approxByte over the eight ASCII bytes of x, the first the
// lowest, and returns their charge.
func approxSteps(row uint32, x uint64) (uint32, int) {
	q := 0
	row, q = approxByte(row, uint32(x)&0x7f, q)
	row, q = approxByte(row, uint32(x>>8)&0x7f, q)
	row, q = approxByte(row, uint32(x>>16)&0x7f, q)
	row, q = approxByte(row, uint32(x>>24)&0x7f, q)
	row, q = approxByte(row, uint32(x>>32)&0x7f, q)
	row, q = approxByte(row, uint32(x>>40)&0x7f, q)
	row, q = approxByte(row, uint32(x>>48)&0x7f, q)
	row, q = approxByte(row, uint32(x>>56), q)
	return row, q
}

// stringWord is s[i:i+8] as a little-endian word, in one load.
func stringWord(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// Kinds of character the approx counter's runs are made of, as classOf
// sees ASCII, with the whitespace that is not a plain space apart.
const (
	runLetter = iota
	runDigit
	runPunct
	runSpace // ' '
	runBreak // any other whitespace
	runKinds
)

// The approx counter's states: no run, or a run of one kind with how far
// it has come. stLetter+k is a letter run whose next letter is its k-th
// modulo 8, and so on; a run is charged at the characters that start a
// new token (see approxCounter).
const (
	stNone   = 0
	stLetter = 1  // to 8
	stDigit  = 9  // to 11
	stPunct  = 12 // and 13
	stSpace  = 14 // a single plain space, not charged
	stSpaces = 15 // charged
)

// approxNext is the approx counter's step: for a state and a kind of
// character, the next state in the low 4 bits, and above them what the
// character is charged, in quarter tokens (0 or 4).
var approxNext = func() (t [16][runKinds]uint8) {
	const charge = 4 << 4
	for st := range 16 {
		for k := range runKinds {
			var next, cost int
			switch {
			case k == runLetter && st >= stLetter && st < stLetter+8:
				next = stLetter + (st-stLetter+1)%8
				if st == stLetter {
					cost = charge
				}
			case k == runLetter:
				next, cost = stLetter+1, charge
			case k == runDigit && st >= stDigit && st < stDigit+3:
				next = stDigit + (st-stDigit+1)%3
				if st == stDigit {
					cost = charge
				}
			case k == runDigit:
				next, cost = stDigit+1, charge
			case k == runPunct && (st == stPunct || st == stPunct+1):
				next = stPunct + (st-stPunct+1)%2
				if st == stPunct {
					cost = charge
				}
			case k == runPunct:
				next, cost = stPunct+1, charge
			case st == stSpaces:
				next = stSpaces
			case st == stSpace || k == runBreak:
				next, cost = stSpaces, charge
			default: // a plain space after anything but whitespace
				next = stSpace
			}
			t[st][k] = uint8(next | cost)
		}
	}
	return t
}()

// approxStep is approxNext for each ASCII byte, in one array that the
// state's row and the byte index without a bounds check: at state<<7 | c,
// the next state's row (stRows) and, in the low 3 bits, the charge.
var approxStep = func() (t [16 << 7]uint32) {
	for c, class := range asciiClass {
		k := runPunct
		switch {
		case class == classLetter:
			k = runLetter
		case class == classNumber:
			k = runDigit
		case c == ' ':
			k = runSpace
		case class == classSpace:
			k = runBreak
		}
		for st := range 16 {
			n := approxNext[st][k]
			t[st<<7|c] = uint32(n&15)<<7 | uint32(n>>4)
		}
	}
	return t
}()

const stRows = 15 << 7

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}
