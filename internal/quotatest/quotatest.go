// Package quotatest is test support for package quota and the stores that
// implement quota.Store: the fixtures their tests share and the Harness on
// which cluster's store suite runs every Store (cluster/store_suite_test.go).
// Only tests import it; nothing of it is built into the plugin.
package quotatest

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/internal/manualclock"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

var bg = context.Background()

// SeedCfg is the seed's defaults: 200 qps, 200000 tokens/min, weight
// 0.0008, joint cap 1.0, 1.2x for 10 s.
var SeedCfg = quota.Config{
	QPS:              200,
	TokensPerMin:     200000,
	TokenToQPSWeight: 0.0008,
	JointCap:         1.0,
	BurstWindow:      10 * time.Second,
	BurstAllow:       0.2,
}

// MeterCase isolates one meter: limits where it binds, the tokens of each
// request, the units one request costs on that meter and the meter's rate.
type MeterCase struct {
	Name   string
	Dim    quota.Dimension
	Lim    *quota.Limits
	Tokens int64
	Units  float64 // meter units per request
	Rate   float64 // meter units per second
}

// MeterCases returns one case per meter, each with the seed's window.
func MeterCases() []MeterCase {
	return []MeterCase{
		{
			Name: "qps", Dim: quota.DimQPS,
			Lim:    quota.MustCompile(quota.Config{QPS: 200, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			Tokens: 100, Units: 1, Rate: 200,
		},
		{
			Name: "tokens", Dim: quota.DimTokens,
			Lim:    quota.MustCompile(quota.Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			Tokens: 1000, Units: 1000, Rate: 200000.0 / 60,
		},
		{
			// 1250 tokens weigh 1 request: a request is 2 request-
			// equivalents, so joint binds at 100 requests/s and the qps
			// meter (200/s) never does.
			Name: "joint", Dim: quota.DimJoint,
			Lim:    quota.MustCompile(quota.Config{QPS: 200, TokenToQPSWeight: 0.0008, JointCap: 1, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			Tokens: 1250, Units: 2, Rate: 200,
		},
	}
}

// TenantName is the i-th of many tenants, all names of one length.
func TenantName(i int) string {
	const digits = "0123456789"
	b := []byte("tenant-00000")
	for j := len(b) - 1; i > 0; j-- {
		b[j] = digits[i%10]
		i /= 10
	}
	return string(b)
}

// Harness is one Store on a virtual clock, as cluster's store suite drives it.
type Harness struct {
	Store quota.Store
	// Res is the resolution of the store's clock: 1 ns for Memory, 1 us
	// for Redis, whose TIME gives microseconds.
	Res  time.Duration
	Now  func() time.Time
	Set  func(time.Time) // moves the store's clock; never backwards
	Held func() int      // tenants the store keeps
	// Remote is set for a store each call of which is a round trip: the
	// suite runs its scenarios of 10^5 calls only on the others.
	Remote bool
}

// NewMemory returns a Harness on a Memory, its clock at manualclock.Epoch.
func NewMemory() *Harness {
	clk := manualclock.New(manualclock.Epoch)
	m := quota.NewMemory(clk.Now)
	return &Harness{Store: m, Res: time.Nanosecond, Now: clk.Now, Set: clk.Set, Held: m.Len}
}

// Advance moves the store's clock forward by d.
func (h *Harness) Advance(d time.Duration) { h.Set(h.Now().Add(d)) }

// Ceil is the first instant the store's clock can show at or after t.
func (h *Harness) Ceil(t time.Time) time.Time {
	if c := t.Truncate(h.Res); c.Before(t) {
		return c.Add(h.Res)
	}
	return t
}

// Before is the last instant the store's clock can show before t.
func (h *Harness) Before(t time.Time) time.Time { return t.Add(-1).Truncate(h.Res) }

// Peek is Store.Peek, failing t on an error.
func (h *Harness) Peek(t testing.TB, tenant string, l *quota.Limits, ahead quota.Backlog) quota.Decision {
	t.Helper()
	d, err := h.Store.Peek(bg, tenant, l, ahead)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Charge is Store.Charge, failing t on an error.
func (h *Harness) Charge(t testing.TB, tenant string, l *quota.Limits, tokens int64) quota.Decision {
	t.Helper()
	d, err := h.Store.Charge(bg, tenant, l, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Reconcile is Store.Reconcile, failing t on an error.
func (h *Harness) Reconcile(t testing.TB, tenant string, l *quota.Limits, est, act int64) quota.Status {
	t.Helper()
	s, err := h.Store.Reconcile(bg, tenant, l, est, act)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Status is Store.Status, failing t on an error.
func (h *Harness) Status(t testing.TB, tenant string, l *quota.Limits) quota.Status {
	t.Helper()
	s, err := h.Store.Status(bg, tenant, l)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
