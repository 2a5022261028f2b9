//go:build unix

package fairqueue

import (
	"syscall"
	"testing"
)

// startCPU starts measuring the process's CPU time (user + system, all
// threads, so the garbage collector's work is included) and returns a
// function that reports it per op as cpu-ns/op. On a shared or loaded
// machine wall-clock ns/op includes time spent waiting for a CPU; cpu-ns/op
// does not.
func startCPU(b *testing.B) func() {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	t0 := ru.Utime.Nano() + ru.Stime.Nano()
	return func() {
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		b.ReportMetric(float64(ru.Utime.Nano()+ru.Stime.Nano()-t0)/float64(b.N), "cpu-ns/op")
	}
}
