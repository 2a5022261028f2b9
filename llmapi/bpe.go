package llmapi

import (
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// bpeCounter counts tokens exactly as tiktoken's cl100k_base and
// o200k_base encodings do (special-token strings are plain text), cutting
// pieces with hand-written code instead of the encodings' regular
// expressions. Runs longer than maxPieceBytes are cut, and invalid UTF-8
// is counted as its bytes (tiktoken-go counts a U+FFFD per bad byte).
type bpeCounter struct {
	name  string
	ranks *rankTable
	// piece returns the end of the pre-tokenizer piece that starts at i.
	piece func(s string, i int) int
	cjk   []uint8 // see roughTokens
}

func (b *bpeCounter) Name() string { return b.name }

func (b *bpeCounter) Count(text string) int {
	n, _, _ := b.countWork(text, noRank)
	return n
}

// maxPieceBytes caps the length of a piece. A run of letters, spaces or
// marks is one piece however long, so one long run (base64, a ruler of
// '=') would stall the counter; cutting it changes the count by a token or
// two per cut, and ordinary text never has runs this long.
const maxPieceBytes = 256

// next returns the end of the piece that starts at i, at most
// maxPieceBytes on: the pre-tokenizer sees no further, and the patterns
// look at most a few characters past a piece's end.
func (b *bpeCounter) next(s string, i int) int {
	return b.piece(s[:min(len(s), i+maxPieceBytes)], i)
}

// pieceTokens is the number of tokens byte-pair merging makes of p. It
// adds the vocabulary lookups it does to *work.
func (b *bpeCounter) pieceTokens(p string, work *int) int {
	if len(p) == 1 {
		return 1 // every byte is a token
	}
	*work++
	if _, ok := b.ranks.get(p); ok {
		return 1 // most pieces: a word with its leading space
	}
	if len(p) <= shortPiece {
		return b.mergeShort(p, work)
	}
	return b.mergeLong(p, work)
}

// shortPiece is the longest piece merged by rescanning its pairs after each
// merge (quadratic, with nothing allocated); longer ones, such as a line of
// Chinese, go through a heap.
const shortPiece = 32

// mergeShort is tiktoken's byte-pair merge: repeatedly merge the adjacent
// pair of parts whose concatenation has the lowest rank, the leftmost of
// equal ones, until no pair is in the vocabulary.
func (b *bpeCounter) mergeShort(p string, work *int) int {
	var startsBuf [shortPiece + 1]int
	var ranksBuf [shortPiece]int
	starts := startsBuf[:len(p)+1] // starts[k]: where part k begins; the last is len(p)
	ranks := ranksBuf[:len(p)]     // ranks[k]: rank of parts k and k+1 merged
	for k := range starts {
		starts[k] = k
	}
	rank := func(k int) int { // parts k and k+1, or none
		if k+2 >= len(starts) {
			return noRank
		}
		*work++
		if r, ok := b.ranks.get(p[starts[k]:starts[k+2]]); ok {
			return r
		}
		return noRank
	}
	for k := range len(ranks) - 1 {
		ranks[k] = rank(k)
	}
	ranks[len(ranks)-1] = noRank
	for len(starts) > 2 {
		best := 0
		for k := 1; k < len(starts)-2; k++ {
			if ranks[k] < ranks[best] {
				best = k
			}
		}
		if ranks[best] == noRank {
			break
		}
		starts = append(starts[:best+1], starts[best+2:]...)
		ranks = append(ranks[:best+1], ranks[best+2:]...)
		ranks[best] = rank(best)
		if best > 0 {
			ranks[best-1] = rank(best - 1)
		}
	}
	return len(starts) - 1
}

const noRank = int(^uint(0) >> 1)

// mergeLong is mergeShort with the candidate pairs in a heap ordered by
// rank and position, as mergeShort's scan finds them: O(n log n).
func (b *bpeCounter) mergeLong(p string, work *int) int {
	m := mergerPool.Get().(*merger)
	defer mergerPool.Put(m)
	m.reset(len(p))
	push := func(i int) { // the pair of the part at i and the next
		j := m.next[i]
		if j >= len(p) {
			return
		}
		end := m.next[j]
		*work++
		if r, ok := b.ranks.get(p[i:end]); ok {
			m.push(pair{rank: r, start: i, end: end})
		}
	}
	for i := range len(p) - 1 {
		push(i)
	}
	parts := len(p)
	for len(m.pairs) > 0 {
		c := m.pop()
		j := m.next[c.start]
		// Stale: a part of this pair has merged with another since.
		if !m.alive[c.start] || j >= len(p) || m.next[j] != c.end {
			continue
		}
		m.alive[j] = false
		m.next[c.start] = c.end
		if c.end < len(p) {
			m.prev[c.end] = c.start
		}
		parts--
		push(c.start)
		if c.start > 0 {
			push(m.prev[c.start])
		}
	}
	return parts
}

// merger holds mergeLong's parts as a linked list over the piece's bytes
// (a part starts at i when alive[i], and ends at next[i]) and the heap of
// candidate pairs.
type merger struct {
	next, prev []int
	alive      []bool
	pairs      []pair
}

type pair struct{ rank, start, end int }

func (a pair) before(b pair) bool {
	return a.rank < b.rank || a.rank == b.rank && a.start < b.start
}

var mergerPool = sync.Pool{New: func() any { return new(merger) }}

func (m *merger) reset(n int) {
	m.next, m.prev, m.alive = m.next[:0], m.prev[:0], m.alive[:0]
	for i := range n {
		m.next = append(m.next, i+1)
		m.prev = append(m.prev, i-1)
		m.alive = append(m.alive, true)
	}
	m.pairs = m.pairs[:0]
}

func (m *merger) push(x pair) {
	h := append(m.pairs, x)
	for i := len(h) - 1; i > 0; {
		up := (i - 1) / 2
		if !h[i].before(h[up]) {
			break
		}
		h[i], h[up] = h[up], h[i]
		i = up
	}
	m.pairs = h
}

func (m *merger) pop() pair {
	h := m.pairs
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(h) && h[l].before(h[small]) {
			small = l
		}
		if r := l + 1; r < len(h) && h[r].before(h[small]) {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
	m.pairs = h
	return top
}

// Encodings are large (tens of MB once expanded) and slow to build, so each
// is built at most once per process and shared.
var encodings = map[string]*encodingSlot{
	CL100kBase: {file: "cl100k_base.tiktoken", piece: cl100kPiece},
	O200kBase:  {file: "o200k_base.tiktoken", piece: o200kPiece},
}

type encodingSlot struct {
	file  string
	piece func(string, int) int
	once  sync.Once
	bpe   *bpeCounter
	err   error
}

// loadBPE returns the named encoding's counter. The ranks come from the
// copies compiled into tiktoken-go-loader, never from the network: the
// gateway must work offline.
func loadBPE(name string) (*bpeCounter, error) {
	slot := encodings[name]
	slot.once.Do(func() {
		ranks, err := tiktoken_loader.NewOfflineLoader().LoadTiktokenBpe(slot.file)
		if err != nil {
			slot.err = fmt.Errorf("loading the ranks of %s: %w", name, err)
			return
		}
		slot.bpe = &bpeCounter{name: name, ranks: newRankTable(ranks), piece: slot.piece}
		slot.bpe.cjk = slot.bpe.cjkTokens()
	})
	return slot.bpe, slot.err
}

// Pre-tokenizing. The encodings split text with these regular expressions
// (alternatives tried in order, the first that matches wins):
//
// cl100k_base:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// o200k_base:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// cl100kPiece and o200kPiece return the end of the match at i, as a
// backtracking engine finds it, with \s as unicode.IsSpace (as tiktoken-go's
// regexp2 reads it).

// Kinds of character the patterns tell apart. upper, lower and caseless
// are all \p{L}; mark is \p{M}, which o200k's letter runs take in and
// cl100k's do not.
type pkind uint8

const (
	kOther    pkind = iota // none of the below: punctuation, symbols
	kUpper                 // Lu, Lt
	kLower                 // Ll
	kCaseless              // Lm, Lo: most of CJK
	kMark                  // M
	kNumber                // N
	kSpace                 // whitespace but \r and \n
	kNewline               // \r, \n
)

var asciiKind = func() (t [utf8.RuneSelf]pkind) {
	for c := range t {
		switch r := rune(c); {
		case 'a' <= r && r <= 'z':
			t[c] = kLower
		case 'A' <= r && r <= 'Z':
			t[c] = kUpper
		case '0' <= r && r <= '9':
			t[c] = kNumber
		case r == '\r' || r == '\n':
			t[c] = kNewline
		case unicode.IsSpace(r):
			t[c] = kSpace
		}
	}
	return t
}()

// kindAt returns the kind of the character at i and its length.
func kindAt(s string, i int) (pkind, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiKind[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if isCaselessCJK(r) {
		return kCaseless, n // without three searches of Unicode tables
	}
	return runeKind(r), n
}

// isCaselessCJK reports whether r is in a block whose characters are all
// letters of category Lo: CJK ideographs, kana, hangul syllables.
func isCaselessCJK(r rune) bool {
	return 0x4E00 <= r && r <= 0x9FFF || 0x3041 <= r && r <= 0x3096 || 0x30A1 <= r && r <= 0x30FA || 0xAC00 <= r && r <= 0xD7A3
}

// runeKind is the kind of r, by Unicode category.
func runeKind(r rune) pkind {
	if r < utf8.RuneSelf {
		return asciiKind[r]
	}
	switch {
	case unicode.IsLetter(r):
		switch {
		case unicode.Is(unicode.Ll, r):
			return kLower
		case unicode.Is(unicode.Lu, r), unicode.Is(unicode.Lt, r):
			return kUpper
		}
		return kCaseless
	case unicode.Is(unicode.M, r):
		return kMark
	case unicode.IsNumber(r):
		return kNumber
	case unicode.IsSpace(r):
		return kSpace
	}
	return kOther
}

func (k pkind) letter() bool { return k == kUpper || k == kLower || k == kCaseless }

// other is [^\s\p{L}\p{N}].
func (k pkind) other() bool { return k == kOther || k == kMark }

// prefix is [^\r\n\p{L}\p{N}].
func (k pkind) prefix() bool { return k == kOther || k == kMark || k == kSpace }

func (k pkind) space() bool { return k == kSpace || k == kNewline }

// contraction returns the length of the contraction ('s, 't, 're, 've, 'm,
// 'll, 'd, any case) at i, or 0.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	switch s[i+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if i+2 < len(s) {
			want := byte('e')
			if s[i+1]|0x20 == 'l' {
				want = 'l'
			}
			if s[i+2]|0x20 == want {
				return 3
			}
		}
	}
	return 0
}

// run returns the end of the run of characters from i whose kind is in.
func run(s string, i int, in func(pkind) bool) int {
	for i < len(s) {
		k, n := kindAt(s, i)
		if !in(k) {
			break
		}
		i += n
	}
	return i
}

func cl100kPiece(s string, i int) int {
	if n := contraction(s, i); n > 0 {
		return i + n
	}
	k, n := kindAt(s, i)
	if k.letter() {
		return run(s, i+n, pkind.letter)
	}
	if k.prefix() && i+n < len(s) {
		if k2, n2 := kindAt(s, i+n); k2.letter() {
			return run(s, i+n+n2, pkind.letter)
		}
	}
	if k == kNumber {
		return numberRun(s, i)
	}
	if j := punctuation(s, i, k, n); j > i {
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	return whitespace(s, i)
}

func o200kPiece(s string, i int) int {
	k, n := kindAt(s, i)
	if j := o200kWord(s, i, k, n); j > i {
		return j
	}
	if k == kNumber {
		return numberRun(s, i)
	}
	if j := punctuation(s, i, k, n); j > i {
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
			j++
		}
		return j
	}
	return whitespace(s, i)
}

// numberRun matches \p{N}{1,3} at i, which is a number.
func numberRun(s string, i int) int {
	for range 3 {
		if i >= len(s) {
			break
		}
		k, n := kindAt(s, i)
		if k != kNumber {
			break
		}
		i += n
	}
	return i
}

// punctuation matches " ?[^\s\p{L}\p{N}]+" at i, whose kind is k and
// length n, and returns i when it does not match.
func punctuation(s string, i int, k pkind, n int) int {
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		if k2, _ := kindAt(s, i+1); k2.other() {
			k, j = k2, i+1
		}
	}
	if !k.other() {
		return i
	}
	return run(s, j, pkind.other)
}

// whitespace matches \s*[\r\n]+|\s+(?!\S)|\s+ at i, which is whitespace.
func whitespace(s string, i int) int {
	end, lastNL, last := i, -1, i
	for end < len(s) {
		k, n := kindAt(s, end)
		if !k.space() {
			break
		}
		if k == kNewline {
			lastNL = end
		}
		last = end
		end += n
	}
	switch {
	case lastNL >= 0:
		return lastNL + 1 // through the last line break of the run
	case end == len(s) || last == i:
		return end
	}
	return last // leave the last space to the word after it
}

// o200kWord matches o200k's two letter alternatives at i (kind k, length
// n), with or without the optional prefix character, in the order a
// backtracking engine tries them, and returns i when neither matches.
func o200kWord(s string, i int, k pkind, n int) int {
	withPrefix := k.prefix() && i+n < len(s)
	if withPrefix {
		if j := casedA(s, i+n); j >= 0 {
			return j
		}
	}
	if j := casedA(s, i); j >= 0 {
		return j
	}
	if withPrefix {
		if j := casedB(s, i+n); j >= 0 {
			return j
		}
	}
	if j := casedB(s, i); j >= 0 {
		return j
	}
	return i
}

// In o200k's letter runs, "upper" is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// "lower" is [\p{Ll}\p{Lm}\p{Lo}\p{M}]: caseless letters and marks are both.
func upperish(k pkind) bool { return k == kUpper || k == kCaseless || k == kMark }
func lowerish(k pkind) bool { return k == kLower || k == kCaseless || k == kMark }

// casedA matches upper* lower+ contraction? at i, or returns -1. Greedy
// upper* takes the whole run of upper characters; if a lower-only letter
// follows, lower+ takes the run from there; otherwise the engine backs off
// to the last character of the run that is also lower.
func casedA(s string, i int) int {
	end, lastBoth := i, -1
	for end < len(s) {
		k, n := kindAt(s, end)
		if !upperish(k) {
			break
		}
		if k != kUpper {
			lastBoth = end + n
		}
		end += n
	}
	if end < len(s) {
		if k, _ := kindAt(s, end); k == kLower {
			j := run(s, end, lowerish)
			return j + contraction(s, j)
		}
	}
	if lastBoth < 0 {
		return -1
	}
	return lastBoth + contraction(s, lastBoth)
}

// casedB matches upper+ lower* contraction? at i, or returns -1.
func casedB(s string, i int) int {
	j := run(s, i, upperish)
	if j == i {
		return -1
	}
	j = run(s, j, lowerish)
	return j + contraction(s, j)
}
