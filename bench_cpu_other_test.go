//go:build !unix

package caddyfairqueue

// processCPU is not measured here; cpu-ns/op reads 0.
func processCPU() int64 { return 0 }
