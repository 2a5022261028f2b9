package llmapi

import (
	"hash/maphash"
	"math/bits"
)

// rankTable is an encoding's vocabulary: token bytes to rank, as an
// open-addressed table of 64-bit hashes and ranks with no key bytes, so a
// lookup is a hash and usually one slot. Building it checks that no two
// tokens share a hash; a non-token piece with a token's hash (about one in
// 10^14) would count as that token.
type rankTable struct {
	seed  maphash.Seed
	key   uint64 // the seed of hash's short path
	slots []uint64
	// pairs holds the ranks of the two-byte tokens, by their bytes, and
	// -1 for the pairs that are none: the first lookups of every merge
	// are of two bytes, and this array (256 KB) stays in cache where the
	// slots do not.
	pairs []int32 // a power of two, at most half full; 0: empty
}

// A slot holds the high bits of a token's hash above its rank: ranks fit
// in rankBits (o200k_base has 200k tokens), and the top bit is set so
// that no slot in use is 0.
const (
	rankBits = 18
	rankMask = 1<<rankBits - 1
)

func newRankTable(ranks map[string]int) *rankTable {
	size := 1 << bits.Len(uint(2*len(ranks)))
	for {
		t := &rankTable{seed: maphash.MakeSeed(), slots: make([]uint64, size)}
		t.key = maphash.String(t.seed, "key")
		t.pairs = make([]int32, 1<<16)
		for i := range t.pairs {
			t.pairs[i] = -1
		}
		if t.fill(ranks) {
			return t
		}
	}
}

// fill inserts ranks, and reports false when two tokens share a hash (then
// another seed is tried).
func (t *rankTable) fill(ranks map[string]int) bool {
	mask := uint64(len(t.slots) - 1)
	for tok, rank := range ranks {
		if rank > rankMask {
			panic("llmapi: a rank beyond rankBits")
		}
		h := t.hash(tok)
		tag := t.tag(h)
		i := h & mask
		for ; t.slots[i] != 0; i = (i + 1) & mask {
			if t.slots[i]&^rankMask == tag {
				return false
			}
		}
		t.slots[i] = tag | uint64(rank)
		if len(tok) == 2 {
			t.pairs[int(tok[0])<<8|int(tok[1])] = int32(rank)
		}
	}
	return true
}

// hash is maphash's, but for the short strings most lookups are (a word,
// a pair of parts in a merge), the bytes in a word through a mixer: a
// third of the instructions.
func (t *rankTable) hash(s string) uint64 {
	if len(s) > 8 {
		return maphash.String(t.seed, s)
	}
	var x uint64
	for i := range len(s) {
		x |= uint64(s[i]) << (8 * i)
	}
	return mix64(mix64(x^t.key) + uint64(len(s)))
}

// mix64 is SplitMix64's finalizer.
func mix64(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func (t *rankTable) tag(h uint64) uint64 { return (h | 1<<63) &^ rankMask }

func (t *rankTable) get(s string) (int, bool) {
	if len(s) == 2 {
		r := t.pairs[int(s[0])<<8|int(s[1])]
		return int(r), r >= 0
	}
	h := t.hash(s)
	tag := t.tag(h)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch x := t.slots[i]; {
		case x&^rankMask == tag:
			return int(x & rankMask), true
		case x == 0:
			return 0, false
		}
	}
}
