package quota_test

import (
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// TestStoreSuite runs the store scenarios against Memory and against a
// Local whose primary, a Memory on the same clock, answers every call.
func TestStoreSuite(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		quotatest.RunStoreSuite(t, func(*testing.T) *quotatest.Harness { return quotatest.NewMemory() })
	})
	t.Run("local", func(t *testing.T) {
		quotatest.RunStoreSuite(t, func(*testing.T) *quotatest.Harness {
			h := quotatest.NewMemory()
			h.Store = quota.NewLocal(h.Store, quota.NewMemory(h.Now), quota.LocalOptions{Clock: h.Now})
			return h
		})
	})
}
