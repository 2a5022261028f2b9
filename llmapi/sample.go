package llmapi

import (
	"math"
	"math/bits"
	"sort"
	"unicode/utf8"
)

// DefaultWork is the tokenizer work an estimate may do per request, in
// vocabulary lookups (an English word is about one; a Chinese character,
// whose bytes merge pair by pair, about seven): with the rough count over
// the text, 0.15-0.35 ms of CPU for a 32 KB prompt on the shared 2-core
// machine it was measured on (docs/performance.md). Twice as much work
// takes the corpus's p95 error from 2.5% to 2%.
const DefaultWork = 4096

// sampledCounter estimates token counts within a fixed amount of
// tokenizer work however long the prompt, for the scheduler's order,
// where a few percent do not matter and milliseconds a request would.
//
// A prompt whose rough count is at most an eighth of the work (in tokens)
// is counted exactly, as far as the work goes. A longer one (and whatever
// the work did not reach) is estimated with a ratio estimator: a rough
// count that costs a table lookup a byte (roughTokens) runs over all of
// it, and the exact counter over evenly spread windows of it until the
// work is spent or the ratio has settled; the estimate is the rough count
// scaled by exact/rough in the windows. The rough count follows the mix of
// the text (prose, code, JSON, Chinese) everywhere, and the windows
// correct its bias for this text. On the test corpus (English, Chinese,
// code, tool schemas and results, 2-400 KB) the estimate is within 3% of
// the exact count at the 95th percentile (TestEstimateAccuracy).
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

// sampleWindowBytes is the size of one window. Many small windows follow
// changes of content across a prompt better than a few large ones: on the
// test corpus 64-byte windows halved the error of 256-byte ones at the
// same work.
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

// Sampling stops early, once at least minWindows windows were counted and
// the standard error of their exact/rough ratio is below
// sampleTolerance: text whose rough count is steady (English, code,
// JSON) is settled in a fraction of the work that Chinese needs.
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
// lo to the last that starts before hi, at least one, as far as limit
// lookups allow, and returns the tokens, the bytes the pieces counted span
// and the lookups done. A window that starts inside t first skips to the
// end of the piece the pre-tokenizer finds at lo: from that point on it
// cuts t as a count of all of t does (the patterns look at most a
// character behind a piece's end). So a piece is counted when a window
// falls in the piece before it, a chance that does not depend on its own
// length or content.
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

// roughTokens is a token count of s in sixteenths that costs a table
// lookup or two per byte, with no state beyond the previous byte's class:
// the approx counter's rules in expectation rather than by runs, and for
// a CJK ideograph what the encoding makes of it alone (one token for a
// common one, two or three for a rare one). Its ratio to the exact count
// varies within ±5% across English, Chinese, Go, Python, JSON and tool
// schemas (the weights were chosen for that on the test corpus), which is
// what the ratio estimator needs of it.
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

// roughWeights[prev<<4|cur] is what a byte of class cur after one of
// class prev adds, in sixteenths of a token: a word (or a 2-byte letter)
// one token and a sixteenth more per letter, a digit five eighths,
// punctuation five eighths and a quarter more per mark in a run, a line
// break one, a space after whitespace a sixteenth, a 3-byte character
// one (a CJK ideograph: its own count, see roughTokens), a 4-byte one 1.5.
// No class that costs tokens weighs nothing: the ratio estimator cannot
// scale a count of zero.
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
