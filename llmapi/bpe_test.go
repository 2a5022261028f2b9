package llmapi

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// tiktoken-go is the reference the gateway's own BPE counter is held to.
var reference struct {
	once sync.Once
	encs map[string]*tiktoken.Tiktoken
}

func referenceCount(tb testing.TB, name, text string) int {
	tb.Helper()
	reference.once.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
		reference.encs = map[string]*tiktoken.Tiktoken{}
		for _, n := range []string{CL100kBase, O200kBase} {
			enc, err := tiktoken.GetEncoding(n)
			if err != nil {
				panic(err)
			}
			reference.encs[n] = enc
		}
	})
	return len(reference.encs[name].EncodeOrdinary(text))
}

// tiktokenCounter is tiktoken-go as a Counter, for benchmarks against
// the gateway's own.
type tiktokenCounter struct {
	tb   testing.TB
	name string
}

func (c tiktokenCounter) Name() string          { return c.name }
func (c tiktokenCounter) Count(text string) int { return referenceCount(c.tb, c.name, text) }

func mustBPE(tb testing.TB, name string) *bpeCounter {
	tb.Helper()
	b, err := loadBPE(name)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// bpeTrickyPieces are the characters the two pre-tokenizer patterns tell
// apart: cased, caseless and modifier letters, marks, other scripts'
// digits, every kind of whitespace and line break, contractions in any
// case, and the slash o200k keeps after punctuation.
var bpeTrickyPieces = []string{"a", "Z", "q", "hello", " world", "HELLO", "World", "7", "123456", ".", ",", "'", "'s", "'S",
	"'re", "'LL", "'ve", "'d", "'m", "'t", "-", "{", "/", "//", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ",
	"é", "ß", "ж", "Ж", "中", "日本", "한", "ア", "ǅ", "ʰ", "ᾈ", "\u0663", "\u0301", "\u0903", "\u00a0", "\u3000",
	"\u2028", "\u0085", "\u200b", "€", "😀", "。", "，", "ﬁ", "Ⅻ", "½", "İ", "\u212a"}

func trickyText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for k := rng.IntN(n); k > 0; k-- {
		b.WriteString(bpeTrickyPieces[rng.IntN(len(bpeTrickyPieces))])
	}
	return b.String()
}

// TestBPEMatchesTiktoken: the gateway's BPE counter gives tiktoken-go's
// count, for both encodings, on the test corpora and on random mixes of
// every kind of character the patterns tell apart.
func TestBPEMatchesTiktoken(t *testing.T) {
	if raceEnabled {
		t.Skip("counts megabytes exactly; runs without the race detector (scripts/test.sh)")
	}
	en, zh := testdataText()
	texts := []string{"", "hello world", "don't STOP'S", strings.Repeat("a", 3000), strings.Repeat("中", 500), en, zh}
	for _, c := range promptCorpus(t) {
		if c.size <= 32<<10 { // tiktoken-go counts about 1 MB/s
			texts = append(texts, c.texts...)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		texts = append(texts, trickyText(rng, 30))
	}
	for _, name := range []string{CL100kBase, O200kBase} {
		b := mustBPE(t, name)
		bad := 0
		for _, s := range texts {
			if got, want := b.Count(s), referenceCount(t, name, s); got != want {
				t.Errorf("%s: %d tokens in %.60q, tiktoken-go counts %d", name, got, s, want)
				if bad++; bad > 5 {
					break
				}
			}
		}
	}
}

// FuzzBPEMatchesTiktoken: on any valid UTF-8 text the counter agrees
// with tiktoken-go.
func FuzzBPEMatchesTiktoken(f *testing.F) {
	en, zh := testdataText()
	for _, s := range []string{"", "hello world", "don't STOP'S", " \n\n x", "a  b\tc\r\n\r\nd", en[:400], zh[:400], "ǅxʰ\u0301 'LL"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || len(s) >= maxPieceBytes {
			return // tiktoken-go counts a U+FFFD per bad byte, and long runs whole; see bpeCounter
		}
		for _, name := range []string{CL100kBase, O200kBase} {
			if got, want := mustBPE(t, name).Count(s), referenceCount(t, name, s); got != want {
				t.Fatalf("%s: %d tokens in %q, tiktoken-go counts %d", name, got, s, want)
			}
		}
	})
}

// TestRuneKinds: the blocks kindAt takes without a search of the Unicode
// tables hold caseless letters only, and the ASCII table agrees with the
// categories.
func TestRuneKinds(t *testing.T) {
	for r := rune(0); r <= 0xFFFF; r++ {
		if isCaselessCJK(r) && runeKind(r) != kCaseless {
			t.Fatalf("%U is in a CJK block but of kind %d", r, runeKind(r))
		}
	}
	for c := rune(0); c < utf8.RuneSelf; c++ {
		var want pkind
		switch {
		case unicode.IsLower(c):
			want = kLower
		case unicode.IsUpper(c):
			want = kUpper
		case unicode.IsDigit(c):
			want = kNumber
		case c == '\r' || c == '\n':
			want = kNewline
		case unicode.IsSpace(c):
			want = kSpace
		}
		if asciiKind[c] != want {
			t.Errorf("%q: kind %d, want %d", c, asciiKind[c], want)
		}
	}
}
