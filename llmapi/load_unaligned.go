//go:build amd64 || arm64 || 386

package llmapi

import "unsafe"

// load64 is the little-endian word b[j:j+8], for 0 <= j and j+8 <=
// len(b), which callers check: one unaligned load, where the architecture
// makes those cheap and is little-endian, without the slice expression's
// bounds checks and pointer arithmetic, which cost ten times as much.
func load64(b []byte, j int) uint64 {
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), j))
}
