package llmapi

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// referenceApproxCount is the approx counter as first written, one
// closure call per run: the run-state rewrite must count exactly as it.
func referenceApproxCount(s string) int {
	// Quarter tokens, to stay in integers.
	var q int
	var letters, digits, punct, spaces int
	var breaks bool // the whitespace run has more than plain spaces
	flush := func() {
		if letters > 0 {
			q += 4 + 4*((letters-1)/8)
		}
		if digits > 0 {
			q += 4 * ((digits + 2) / 3)
		}
		if punct > 0 {
			q += 4 * ((punct + 1) / 2)
		}
		if spaces > 1 || breaks {
			q += 4
		}
		letters, digits, punct, spaces, breaks = 0, 0, 0, 0, false
	}
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		i += size
		switch c := classOf(r); {
		case c == classLetter && size > 1 && isCJK(r):
			flush()
			q += 5
		case c == classLetter:
			if letters == 0 {
				flush()
			}
			letters++
			if size > 1 {
				q += 4
			}
		case c == classNumber:
			if digits == 0 {
				flush()
			}
			digits++
		case c == classSpace:
			if spaces == 0 {
				flush()
			}
			spaces++
			if r != ' ' {
				breaks = true
			}
		case r < utf8.RuneSelf:
			if punct == 0 {
				flush()
			}
			punct++
		default:
			flush()
			q += 4
		}
	}
	flush()
	return (q + 3) / 4
}

// TestApproxCountMatchesReference: on random text mixing every class the
// counter tells apart (ASCII letters, digits, punctuation, spaces and
// breaks; accented and CJK letters, other scripts' digits and spaces,
// symbols, invalid UTF-8) and on the test corpora, Count equals the
// reference.
func TestApproxCountMatchesReference(t *testing.T) {
	pieces := []string{"a", "Z", "q", "7", "0", ".", ",", "'", "-", "{", " ", "  ", "\t", "\n", "\r\n",
		"é", "ß", "ж", "中", "日本", "한", "ア", "\u0663", "\u00a0", "\u3000", "€", "😀", "\u0301", "\xff", "\xe4\xb8"}
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 20000; n++ {
		var b strings.Builder
		for k := rng.IntN(40); k > 0; k-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := b.String()
		if got, want := (approxCounter{}).Count(s), referenceApproxCount(s); got != want {
			t.Fatalf("%q: %d tokens, reference %d", s, got, want)
		}
	}
	en, zh := testdataText()
	for _, s := range []string{en, zh, en + zh, ""} {
		if got, want := (approxCounter{}).Count(s), referenceApproxCount(s); got != want {
			t.Errorf("corpus of %d bytes: %d tokens, reference %d", len(s), got, want)
		}
	}
}

// BenchmarkApproxCount is the approx counter on a short prompt (the idle
// gateway counts every prompt with it) and on the English corpus.
func BenchmarkApproxCount(b *testing.B) {
	en, _ := testdataText()
	for _, tc := range []struct{ name, text string }{
		{"short", "You are a helpful assistant. Say hello in five words."},
		{"en", en},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				(approxCounter{}).Count(tc.text)
			}
		})
		b.Run(tc.name+"_reference", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				referenceApproxCount(tc.text)
			}
		})
	}
}

// FuzzApproxCount: the counter's automaton counts any text as the
// reference does.
func FuzzApproxCount(f *testing.F) {
	en, zh := testdataText()
	for _, s := range []string{"", "You are a helpful assistant. Say hello in five words.", "a  b\tc\n\nd", "x123456789y", "...!!??", "é中日本\u3000\u00a0ß😀\xff\xe4\xb8",
		"abcdefghijklmnopqrstuvwxyz abc", en[:300], zh[:300]} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := (approxCounter{}).Count(s), referenceApproxCount(s); got != want {
			t.Fatalf("%q: %d tokens, reference %d", s, got, want)
		}
	})
}
