package fairqueue

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind (a Wait
// that never returned, a ticker that was never stopped).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
