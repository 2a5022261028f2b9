package llmapi

import (
	"fmt"
	"sort"
	"sync"
	"unicode"
	"unicode/utf8"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
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

// CounterNames lists the names NewCounter accepts, for configuration errors
// and help texts.
func CounterNames() []string { return []string{CL100kBase, O200kBase, Approx} }

// DefaultExactBytes is the per-request budget of text that the tiktoken
// counters returned by NewCounter tokenize exactly. tiktoken-go runs at a few
// MB/s, so 64 KiB costs roughly 15 ms of one core; beyond it the count is
// extrapolated (see WithExactBudget).
const DefaultExactBytes = 64 << 10

// NewCounter returns the named counter: "cl100k_base" and "o200k_base" are
// exact BPE tokenizers bounded by DefaultExactBytes, "approx" a heuristic
// that needs no vocabulary and runs at memory speed. The BPE ranks are
// loaded once per process, from data compiled into the binary, on first
// use; calling NewCounter at provisioning time moves that cost (about 0.1 s
// and 0.2 s) out of the first request.
func NewCounter(name string) (Counter, error) {
	switch name {
	case Approx:
		return approxCounter{}, nil
	case CL100kBase, O200kBase:
		enc, err := loadEncoding(name)
		if err != nil {
			return nil, fmt.Errorf("loading tokenizer %s: %w", name, err)
		}
		return &boundedCounter{inner: &bpeCounter{name: name, enc: enc}, exactBytes: DefaultExactBytes}, nil
	default:
		return nil, fmt.Errorf("unknown tokenizer %q: valid tokenizers are %s, %s and %s", name, CL100kBase, O200kBase, Approx)
	}
}

// WithExactBudget returns c with a different exact-counting budget, in bytes
// of prompt text per request (or per text for a bare Count call). Text beyond
// the budget is not tokenized: the budget is spread over evenly spaced
// windows of the whole text, and the token count is extrapolated from the
// bytes-per-token ratio measured in them. Sampling across the text rather
// than counting a prefix keeps the estimate honest for prompts whose start
// differs from the rest, such as an English system prompt in front of a
// Chinese document. bytes <= 0 removes the bound.
func WithExactBudget(c Counter, bytes int) Counter {
	if b, ok := c.(*boundedCounter); ok {
		c = b.inner
	}
	if bytes <= 0 {
		return c
	}
	return &boundedCounter{inner: c, exactBytes: bytes}
}

// Encodings are large (tens of MB once expanded) and slow to build, so each
// is built at most once per process and shared.
var encodings = map[string]*encodingSlot{
	CL100kBase: {},
	O200kBase:  {},
}

type encodingSlot struct {
	once sync.Once
	enc  *tiktoken.Tiktoken
	err  error
}

func init() {
	// The default loader fetches vocabularies over the network at run
	// time; the gateway must work offline, so the ranks come from the
	// loader's embedded copies. Done in init so that no goroutine can race
	// with the write to tiktoken's package-level loader.
	tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
}

func loadEncoding(name string) (*tiktoken.Tiktoken, error) {
	slot := encodings[name]
	slot.once.Do(func() { slot.enc, slot.err = tiktoken.GetEncoding(name) })
	return slot.enc, slot.err
}

// bpeCounter is an exact, unbounded tiktoken counter.
type bpeCounter struct {
	name string
	enc  *tiktoken.Tiktoken
}

func (b *bpeCounter) Name() string { return b.name }

func (b *bpeCounter) Count(text string) int {
	n := 0
	for len(text) > 0 {
		cut := longRunCut(text)
		// EncodeOrdinary: special-token strings in user text are plain text
		// to a server that tokenizes them safely, and the special-token
		// path of tiktoken-go rescans the rest of the text per match.
		n += len(b.enc.EncodeOrdinary(text[:cut]))
		text = text[cut:]
	}
	return n
}

// maxRunBytes caps the length of a run of letters, whitespace or symbols that
// is handed to tiktoken-go in one piece. Its byte-pair merge is quadratic in
// the piece length (8 KiB of "aaaa..." takes about 40 ms), so a hostile or
// merely odd prompt (base64 without line breaks, a long ruler of '=', Chinese
// without punctuation) could otherwise stall the estimator. Cutting such runs
// changes the count by at most a token or two per cut, and real prose never
// has runs this long.
const maxRunBytes = 256

// longRunCut returns the length of the prefix of s that has no run longer
// than maxRunBytes, always at a rune boundary and > 0 for a non-empty s.
func longRunCut(s string) int {
	prev := classNone
	runStart := 0
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		c := classOf(r)
		switch {
		case c != prev:
			prev, runStart = c, i
		case c != classNumber && i-runStart >= maxRunBytes:
			// Digits are exempt: the tokenizers split them in groups
			// of three, so a long number is never one piece.
			return i
		}
		i += size
	}
	return len(s)
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
// budget when it has one. The budget bounds the calls to the tokenizer as
// well as the bytes: a prompt of many tiny strings (a million one-letter
// prompts) is sampled like a long one.
func countTexts(c Counter, texts []string) int {
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

// sampleWindow is the size of one sampling window. Many small windows
// follow changes of content (prose, code, another language) across a long
// prompt better than a few large ones: on the test corpora, 512-byte windows
// kept the error within 2%, 4 KiB windows let it reach 3%. Alignment at
// the window edges costs about a token per window either way.
const sampleWindow = 512

// minCallBytes is what one tokenizer call costs, counted in bytes of the
// exact budget: the call's own overhead is that of tokenizing some 64 bytes.
const minCallBytes = 64

// maxWindowTexts bounds the texts counted in one sampling window; a window
// over many tiny texts counts the first of them, which measures their
// bytes per token as well as all of them would.
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

// approxCounter estimates cl100k_base counts from character classes, at a
// few hundred MB/s and with no vocabulary in memory. Its rules, fitted on
// English prose and Markdown, Go code, JSON and modern Chinese:
//
//   - a run of letters is one token, plus one per further 8 letters
//     (common words are single tokens; long or rare ones split);
//     a non-ASCII letter in it (é, ß, я) adds a token;
//   - a CJK ideograph, kana or hangul syllable is 1.25 tokens: frequent
//     characters are one token, rarer ones two or three byte-level tokens;
//   - digits are one token per started group of three;
//   - a run of ASCII punctuation is one token per two characters;
//   - a single space is free (it joins the next word), any other run of
//     whitespace is one token;
//   - any other character (CJK punctuation, symbols, emoji) is one token.
//
// The tests hold it within 20% of cl100k_base on English and Chinese text.
type approxCounter struct{}

func (approxCounter) Name() string { return Approx }

func (approxCounter) Count(s string) int {
	// Quarter tokens, to stay in integers. The text is a sequence of runs
	// of one kind (letters, digits, punctuation, whitespace), each charged
	// when it ends (runCost); a CJK character or another non-ASCII symbol
	// ends the run before it and is charged on its own. The run's state is
	// three integers (see runSpace), passed between asciiRuns, which takes
	// ASCII a stretch of bytes of one kind at a time, and approxRune.
	var q, n int
	run := uint8(runNone)
	for i := 0; ; {
		var m int
		m, q, run, n = asciiRuns(s[i:], q, run, n)
		if i += m; i >= len(s) {
			break
		}
		m, q, run, n = approxRune(s[i:], q, run, n)
		i += m
	}
	return (q + runCost(run, n) + 3) / 4
}

// asciiRuns is approxCounter.Count's loop over the ASCII that s starts
// with: it returns how many bytes it took and the run state after them.
// Its loop over a word is a table lookup and a compare a byte, the run's
// bookkeeping once a word; it calls nothing, so that its state stays in
// registers.
func asciiRuns(s string, q int, run uint8, n int) (int, int, uint8, int) {
	i := 0
	for i < len(s) {
		k := byteRun[s[i]]
		if k == runNone {
			break
		}
		j := i + 1
		for j < len(s) && byteRun[s[j]] == k {
			j++
		}
		if k&^runBreaks != run&^runBreaks {
			q += runCost(run, n)
			run, n = k, 0
		}
		run |= k & runBreaks
		n += j - i
		i = j
	}
	return i, q, run, n
}

// approxRune is approxCounter.Count's step over the character s starts
// with, one that is not ASCII, from the run state (q, run, n) to the state
// after it.
func approxRune(s string, q int, run uint8, n int) (int, int, uint8, int) {
	r, size := utf8.DecodeRuneInString(s)
	k := uint8(runNone)
	switch c := classOf(r); {
	case c == classLetter && isCJK(r):
		q += 5
	case c == classLetter:
		k = runLetter
		q += 4
	case c == classNumber:
		k = runDigit
	case c == classSpace:
		k = runSpace | runBreaks // a space that is not ' '
	default:
		q += 4
	}
	if k&^runBreaks != run&^runBreaks || k == runNone {
		q += runCost(run, n)
		run, n = k, 0
	}
	if k != runNone {
		run |= k & runBreaks
		n++
	}
	return size, q, run, n
}

// Kinds of run the approx counter charges.
const (
	runNone   = 0
	runLetter = 2
	runDigit  = 4
	runPunct  = 6
	// runSpace is whitespace; with runBreaks set, it holds whitespace
	// other than a plain space, which costs a token however short the
	// run (see runCost).
	runSpace  = 8
	runBreaks = 1
)

// byteRun is the kind of run each ASCII byte belongs to, with runBreaks
// set for the whitespace that is not a plain space, and runNone, which no
// ASCII byte has, for the bytes of multi-byte characters.
var byteRun = func() (t [256]uint8) {
	for i, c := range asciiClass {
		switch c {
		case classLetter:
			t[i] = runLetter
		case classNumber:
			t[i] = runDigit
		case classSpace:
			t[i] = runSpace
			if i != ' ' {
				t[i] |= runBreaks
			}
		default:
			t[i] = runPunct
		}
	}
	return t
}()

// runCost is what a run of n characters of a kind costs, in quarter
// tokens: a word piece per 8 letters, one per 3 digits or 2 punctuation
// marks, and one for whitespace beyond a single plain space. Short runs,
// most of them, cost what shortRunCost says.
func runCost(kind uint8, n int) int {
	if n < len(shortRunCost[0]) {
		return int(shortRunCost[kind&15][n])
	}
	return longRunCost(kind, n)
}

func longRunCost(kind uint8, n int) int {
	switch kind {
	case runLetter:
		return 4 + 4*((n-1)/8)
	case runDigit:
		return 4 * ((n + 2) / 3)
	case runPunct:
		return 4 * ((n + 1) / 2)
	case runSpace, runSpace | runBreaks:
		if n > 1 || kind&runBreaks != 0 {
			return 4
		}
	}
	return 0
}

// shortRunCost is longRunCost for runs of fewer than 16 characters, by
// kind (the kinds fit in 4 bits, which spares runCost a bounds check).
var shortRunCost = func() (t [16][16]uint8) {
	for k := range t {
		for n := 1; n < len(t[k]); n++ {
			t[k][n] = uint8(longRunCost(uint8(k), n))
		}
	}
	return t
}()

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}
