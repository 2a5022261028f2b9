//go:build !linux

package llmapi

import "testing"

// loopCPU runs f in b.Loop (CPU time is measured on Linux only).
func loopCPU(b *testing.B, f func()) {
	for b.Loop() {
		f()
	}
}
