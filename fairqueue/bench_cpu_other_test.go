//go:build !unix

package fairqueue

import "testing"

// startCPU reports nothing where process CPU time is not available.
func startCPU(*testing.B) func() { return func() {} }
