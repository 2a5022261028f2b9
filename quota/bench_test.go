package quota_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/internal/quotatest"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

var bg = context.Background()

// BenchmarkDecision measures one admission decision as the gateway makes it
// (Peek when the request is queued, Charge at dispatch) in memory, at 1 and
// 10k tenants, with the seed's three meters. The clock advances 1 us per
// decision; the tenants' rates are high enough that most are allowed.
func BenchmarkDecision(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run("tenants="+strconv.Itoa(n), func(b *testing.B) {
			cfg := quotatest.SeedCfg
			cfg.QPS = 1e6
			cfg.TokensPerMin = 1e12
			l := quota.MustCompile(cfg)
			var now time.Duration
			clock := func() time.Time { return manualclock.Epoch.Add(now) }
			m := quota.NewMemory(clock)
			names := make([]string, n)
			for i := range names {
				names[i] = "tenant-" + strconv.Itoa(i)
				m.Charge(bg, names[i], l, 100)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				now += time.Microsecond
				tn := names[i%n]
				if d, _ := m.Peek(bg, tn, l, quota.Backlog{}); d.Allowed {
					m.Charge(bg, tn, l, 100)
				}
			}
		})
	}
}

// BenchmarkReconcile measures the completion-time correction.
func BenchmarkReconcile(b *testing.B) {
	l := quota.MustCompile(quotatest.SeedCfg)
	var now time.Duration
	m := quota.NewMemory(func() time.Time { return manualclock.Epoch.Add(now) })
	b.ReportAllocs()
	for b.Loop() {
		now += time.Microsecond
		m.Reconcile(bg, "a", l, 1000, 1001)
	}
}
