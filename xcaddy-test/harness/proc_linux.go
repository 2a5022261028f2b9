package harness

import "syscall"

// sysProcAttr makes the kernel kill a child when the test process dies (a
// panic or a test timeout), so no Caddy or fake outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
