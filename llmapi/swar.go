package llmapi

import (
	"math/bits"
)

// Eight bytes at a time ("SIMD within a register"): most strings in a
// request or a response are keys, roles and short texts, for which a byte
// loop costs about ten instructions a byte and bytes.IndexByte's vector
// code costs more to set up than it saves. A word test costs about a dozen
// instructions per eight bytes.
//
// hasZero(v) flags (in bit 7 of the byte) every zero byte of v, and may
// flag bytes above the lowest zero byte through its borrow; the lowest
// flag is always exact, so callers take only the lowest
// (bits.TrailingZeros64, on a little-endian load).
const (
	swarLSB = 0x0101010101010101
	swarMSB = 0x8080808080808080
)

func hasZero(v uint64) uint64 { return (v - swarLSB) & ^v & swarMSB }

// hasByte flags the bytes of x equal to c.
func hasByte(x uint64, c byte) uint64 { return hasZero(x ^ (swarLSB * uint64(c))) }

// hasLess flags the bytes of x below n (n <= 128).
func hasLess(x uint64, n byte) uint64 { return (x - swarLSB*uint64(n)) & ^x & swarMSB }

// quoteOrEscape returns the index of the first '"' or '\\' in b[j:lim]
// (lim <= len(b)), or lim if there is none.
func quoteOrEscape(b []byte, j, lim int) int {
	for ; j+8 <= lim; j += 8 {
		x := load64(b, j)
		if m := hasByte(x, '"') | hasByte(x, '\\'); m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
	}
	for ; j < lim; j++ {
		if c := b[j]; c == '"' || c == '\\' {
			return j
		}
	}
	return lim
}

// stringSpecial returns the index of the first byte in b[j:] that a JSON
// string cannot hold as it is (see stringByte), or len(b).
//
// It makes two tests of a word, not three: flipping bit 1 maps the quote
// (0x22) to 0x20 and the control characters onto themselves, so that
// "below 0x21" catches both. Both tests' masks are merged before the one
// AND with swarMSB that each would make.
func stringSpecial(b []byte, j int) int {
	for j >= 0 && j+8 <= len(b) {
		x := load64(b, j)
		q := x ^ (swarLSB * 0x02)
		e := x ^ (swarLSB * '\\')
		if m := ((q-swarLSB*0x21)&^q | (e-swarLSB)&^e) & swarMSB; m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
		j += 8
	}
	for ; j < len(b); j++ {
		if stringByte[b[j]] {
			return j
		}
	}
	return len(b)
}
