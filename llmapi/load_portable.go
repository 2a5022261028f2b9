//go:build !(amd64 || arm64 || 386)

package llmapi

import "encoding/binary"

// load64 is the little-endian word b[j:j+8], for 0 <= j and j+8 <=
// len(b).
func load64(b []byte, j int) uint64 { return binary.LittleEndian.Uint64(b[j : j+8]) }
