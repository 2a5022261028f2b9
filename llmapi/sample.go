package llmapi

import (
	"math"
	"math/bits"
	"sort"
	"unicode/utf8"
)

// DefaultWork is the tokenizer work an estimate may do per request, in
// vocabulary lookups (about one an English word, seven a Chinese
// character).
const DefaultWork = 4096

// sampledCounter estimates token counts within a fixed amount of
// tokenizer work however long the prompt. A short prompt is counted
// exactly; a longer one is estimated by a ratio estimator: a cheap rough
// count (roughTokens) over all of it, scaled by exact/rough measured in
// evenly spread windows until the work is spent or the ratio settles.
type sampledCounter struct {
	exact *bpeCounter
	work  int
}

// NewEstimator returns the named counter as the scheduler's estimator:
// for cl100k_base and o200k_base, exact on short prompts and sampled
// within DefaultWork on long ones; approx, sampled beyond
// DefaultExactBytes.
func NewEstimator(name string) (Counter, error) {
	c, err := NewCounter(name)
	if err != nil {
		return nil, err
	}
	if b, ok := c.(*boundedCounter); ok {
		if bpe, ok := b.inner.(*bpeCounter); ok {
			return &sampledCounter{exact: bpe, work: DefaultWork}, nil
		}
	}
	// approx runs at memory speed, but a 400 KB prompt of Chinese is
	// still milliseconds of it: beyond 64 KiB it counts windows too.
	return WithExactBudget(c, DefaultExactBytes), nil
}

func (s *sampledCounter) Name() string { return s.exact.Name() }

func (s *sampledCounter) Count(text string) int { return s.countTexts([]string{text}) }

// sampleWindowBytes is the size of one window: many small windows follow
// changes of content across a prompt better than a few large ones.
const sampleWindowBytes = 32

func (s *sampledCounter) countTexts(texts []string) int {
	n, _ := s.count(texts)
	return n
}

// count is countTexts, with the vocabulary lookups it did: at most twice
// s.work, and the rest of the piece it was in when the work ran out.
func (s *sampledCounter) count(texts []string) (tokens, work int) {
	rough := 0
	for _, t := range texts {
		rough += s.exact.roughTokens(t)
	}
	if rough/16 > s.work/8 {
		return s.sample(texts, rough)
	}
	// Likely short enough to count exactly (a Chinese character can take
	// seven lookups): try, and sample what the work did not reach.
	for i, t := range texts {
		n, end, w := s.exact.countWork(t, s.work-work)
		tokens += n
		work += w
		if end < len(t) {
			rest := append([]string{t[end:]}, texts[i+1:]...)
			rough = 0
			for _, t := range rest {
				rough += s.exact.roughTokens(t)
			}
			n, w := s.sample(rest, rough)
			return tokens + n, work + w
		}
	}
	return tokens, work
}

// Sampling stops once at least minWindows windows were counted and the
// standard error of their exact/rough ratio is below sampleTolerance.
const (
	minWindows      = 16
	sampleTolerance = 0.01
)

// sample estimates the tokens of texts, whose rough count is rough, from
// windows counted exactly within s.work (see sampledCounter), and returns
// them with the lookups it did.
func (s *sampledCounter) sample(texts []string, rough int) (tokens, work int) {
	starts := make([]int, len(texts)+1) // starts[i]: where texts[i] begins
	for i, t := range texts {
		starts[i+1] = starts[i] + len(t)
	}
	total := starts[len(texts)]
	// Windows at positions of the van der Corput sequence (1/2, 1/4, 3/4,
	// 1/8, ...): however many are counted, they are spread evenly.
	var st ratioStats
	windows := max(total/sampleWindowBytes, 1)
	for j := uint32(1); int(j) <= windows && work < s.work; j++ {
		lo := int(uint64(bits.Reverse32(j)) * uint64(total) >> 32)
		hi := min(lo+sampleWindowBytes, total)
		var e, r int
		for i := sort.SearchInts(starts, lo+1) - 1; i < len(texts) && starts[i] < hi && work < s.work; i++ {
			t := texts[i]
			n, start, end, w := s.exact.window(t, max(lo-starts[i], 0), min(hi-starts[i], len(t)), s.work-work)
			e += n
			r += s.exact.roughTokens(t[start:end])
			work += w
		}
		if st.add(float64(e), float64(r)) >= minWindows && st.relErr() < sampleTolerance {
			break
		}
	}
	if st.r == 0 {
		return (rough + 15) / 16, work
	}
	return int(float64(rough)*st.e/st.r + 0.5), work
}

// ratioStats sums windows' exact and rough counts, for the ratio estimate
// and its standard error.
type ratioStats struct {
	n                int
	e, r, ee, rr, er float64
}

func (s *ratioStats) add(e, r float64) int {
	if e == 0 && r == 0 {
		return s.n // an empty window
	}
	s.n++
	s.e, s.r, s.ee, s.rr, s.er = s.e+e, s.r+r, s.ee+e*e, s.rr+r*r, s.er+e*r
	return s.n
}

// relErr is the standard error of the ratio e/r, relative to it: the
// spread of the windows' residuals e - R·r over the exact count.
func (s *ratioStats) relErr() float64 {
	if s.n < 2 || s.e == 0 {
		return math.Inf(1)
	}
	R := s.e / s.r
	ss := max(s.ee-2*R*s.er+R*R*s.rr, 0)
	return math.Sqrt(ss*float64(s.n)/float64(s.n-1)) / s.e
}

// countWork counts the tokens of text from its start, piece by piece,
// until the lookups done reach limit, and returns the tokens, where it
// stopped (at a piece's end) and the lookups done.
func (b *bpeCounter) countWork(text string, limit int) (tokens, end, work int) {
	for end < len(text) && work < limit {
		j := b.next(text, end)
		tokens += b.pieceTokens(text[end:j], &work)
		end = j
	}
	return tokens, end, work
}

// window counts the pieces of t from the first that starts at or after
// lo to the last that starts before hi (at least one), within limit
// lookups, and returns the tokens, the bytes they span and the lookups
// done. A window starting inside t first skips to the end of the piece at
// lo, from where it cuts t as a whole count would.
func (b *bpeCounter) window(t string, lo, hi, limit int) (tokens, start, end, work int) {
	i := lo
	if i > 0 {
		for i < len(t) && !utf8.RuneStart(t[i]) {
			i++
		}
		if i < len(t) {
			i = b.next(t, i)
		}
	}
	start = i
	for i < len(t) && (i == start || i < hi) && work < limit {
		j := b.next(t, i)
		tokens += b.pieceTokens(t[i:j], &work)
		i = j
	}
	return tokens, start, i, work
}

// roughWeights[prev<<4|cur] is what a byte of class cur after one of
// class prev adds, in sixteenths of a token. No class that costs tokens
// weighs nothing: the ratio estimator cannot scale a count of zero.
func (b *bpeCounter) roughTokens(s string) int {
	prev, n := uint8(byteSpace), 0
	for i := 0; i < len(s); i++ {
		c := byteClasses[s[i]]
		n += int(roughWeights[prev<<4|c])
		if c == byteLead3 && i+2 < len(s) && byteClasses[s[i+1]] == byteCont && byteClasses[s[i+2]] == byteCont {
			r := rune(s[i]&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
			if r >= cjkFirst && r <= cjkLast {
				n += int(b.cjk[r-cjkFirst]) - int(roughWeights[byteLead3])
			}
		}
		prev = c
	}
	return n
}

// The CJK Unified Ideographs block, whose characters roughTokens looks up
// one by one.
const (
	cjkFirst = 0x4E00
	cjkLast  = 0x9FFF
)

// cjkTokens is the tokens of each ideograph alone, in sixteenths.
func (b *bpeCounter) cjkTokens() []uint8 {
	t := make([]uint8, cjkLast-cjkFirst+1)
	for r := rune(cjkFirst); r <= cjkLast; r++ {
		t[r-cjkFirst] = uint8(min(16*b.Count(string(r)), 255))
	}
	return t
}

// Byte classes of roughTokens.
const (
	byteLetter = iota // ASCII
	byteDigit         // ASCII
	bytePunct         // ASCII
	byteSpace         // ' '
	byteBreak         // other ASCII whitespace
	byteCont          // a UTF-8 continuation byte
	byteLead2         // starts a 2-byte character: Latin, Greek, Cyrillic letters
	byteLead3         // starts a 3-byte character: CJK, kana, hangul, CJK punctuation
	byteLead4         // starts a 4-byte character: emoji, rare ideographs
	byteClassesN
)

var byteClasses = func() (t [256]uint8) {
	for i := range t {
		c := byte(i)
		switch {
		case c >= 0xF0:
			t[i] = byteLead4
		case c >= 0xE0:
			t[i] = byteLead3
		case c >= 0xC0:
			t[i] = byteLead2
		case c >= 0x80:
			t[i] = byteCont
		case c == ' ':
			t[i] = byteSpace
		default:
			t[i] = [...]uint8{classLetter: byteLetter, classNumber: byteDigit, classSpace: byteBreak, classOther: bytePunct}[asciiClass[c]]
		}
	}
	return t
}()

// roughTokens is a token count of s in sixteenths at a table lookup or two
// per byte: the approx counter's rules in expectation. Its ratio to the
// exact count varies little across kinds of text, which is what the ratio
// estimator needs.
var roughWeights = func() (w [16 * 16]uint8) {
	for p := range byteClassesN {
		for c := range byteClassesN {
			var v int
			switch c {
			case byteLetter:
				v = 16
				if p == byteLetter || p == byteCont || p == byteLead2 {
					v = 1 // in a word: long ones split
				}
			case byteDigit:
				v = 10
			case bytePunct:
				v = 10
				if p == bytePunct {
					v = 4
				}
			case byteSpace:
				if p == byteSpace || p == byteBreak {
					v = 1 // a run of spaces: little, but never nothing
				}
			case byteBreak:
				v = 16
				if p == byteSpace || p == byteBreak {
					v = 2
				}
			case byteLead2:
				v = 16
			case byteLead3:
				v = 16
			case byteLead4:
				v = 24
			}
			w[p<<4|c] = uint8(v)
		}
	}
	return w
}()
