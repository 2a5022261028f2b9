//go:build unix

package caddyfairqueue

import "syscall"

// processCPU is the CPU time (user + system) the process has used, in ns:
// on a shared machine CPU per op is steadier than wall time per op, and it
// counts the work of every goroutine an op wakes (transport, upstream).
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
