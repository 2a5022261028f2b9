package llmapi

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestSWAR holds the word-at-a-time searches to their byte-by-byte
// definitions, on every start and end of random strings dense with the
// bytes they look for and with bytes that differ from them by one bit (the
// borrow of the word test may flag a byte above a real match, never
// below).
func TestSWAR(t *testing.T) {
	alphabet := []byte{'"', '\\', 0x1f, 0x20, 0x00, 0x7f, 0x80, 0xff, '"' ^ 1, '\\' ^ 1, 'a', '"' | 0x80, 0x21, 0x01}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			if rng.IntN(3) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = byte('a' + rng.IntN(26))
			}
		}
		for j := 0; j <= len(b); j++ {
			for lim := j; lim <= len(b); lim++ {
				want := lim
				for k := j; k < lim; k++ {
					if b[k] == '"' || b[k] == '\\' {
						want = k
						break
					}
				}
				if got := quoteOrEscape(b, j, lim); got != want {
					t.Fatalf("quoteOrEscape(%q, %d, %d) = %d, want %d", b, j, lim, got, want)
				}
			}
			want := len(b)
			for k := j; k < len(b); k++ {
				if stringByte[b[k]] {
					want = k
					break
				}
			}
			if got := stringSpecial(b, j); got != want {
				t.Fatalf("stringSpecial(%q, %d) = %d, want %d", b, j, got, want)
			}
		}
	}
}

// TestStringSpecialPairs: every pair of byte values, side by side at every
// place in a word and across two words, among bytes stringSpecial must
// not stop at: the merged word tests flag exactly the first byte
// stringByte marks.
func TestStringSpecialPairs(t *testing.T) {
	for _, fill := range []byte{'a', 0x21, 0x23, 0x7f, 0xff} {
		b := make([]byte, 24)
		for p := 0; p+1 < 16; p++ {
			for c0 := range 256 {
				for c1 := range 256 {
					for i := range b {
						b[i] = fill
					}
					b[p], b[p+1] = byte(c0), byte(c1)
					want := len(b)
					switch {
					case stringByte[c0]:
						want = p
					case stringByte[c1]:
						want = p + 1
					}
					if got := stringSpecial(b, 0); got != want {
						t.Fatalf("stringSpecial(%q) = %d, want %d", b, got, want)
					}
				}
			}
		}
	}
}

// TestLoad64: the word load is binary.LittleEndian's at every offset.
func TestLoad64(t *testing.T) {
	b := make([]byte, 40)
	for i := range b {
		b[i] = byte(i*37 + 11)
	}
	for j := 0; j+8 <= len(b); j++ {
		if got, want := load64(b, j), binary.LittleEndian.Uint64(b[j:]); got != want {
			t.Fatalf("load64(b, %d) = %#x, want %#x", j, got, want)
		}
		if got, want := stringWord(string(b), j), binary.LittleEndian.Uint64(b[j:]); got != want {
			t.Fatalf("stringWord(b, %d) = %#x, want %#x", j, got, want)
		}
	}
}
