//go:build linux

package llmapi

import (
	"runtime"
	"syscall"
	"testing"
)

// threadCPU is the CPU time the calling OS thread has used, in ns.
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// loopCPU runs f in b.Loop on one locked thread and reports the CPU time
// per op (cpu-ns/op) beside the wall time: on a shared machine, what the
// work costs rather than how long it waited for a core.
func loopCPU(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, n := threadCPU(), 0
	for b.Loop() {
		f()
		n++
	}
	b.ReportMetric(float64(threadCPU()-start)/float64(max(n, 1)), "cpu-ns/op")
}
