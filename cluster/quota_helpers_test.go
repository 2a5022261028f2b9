package cluster

import (
	"sync"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// vclock is a virtual clock safe for concurrent readers.
type vclock struct {
	mu sync.Mutex
	t  time.Time
}

var epoch0 = time.Date(2026, 10, 21, 0, 0, 0, 0, time.UTC)

func newVclock() *vclock { return &vclock{t: epoch0} }

func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *vclock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Before(c.t) {
		panic("vclock: time goes backwards")
	}
	c.t = t
}

func (c *vclock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// The seed's defaults: 200 qps, 200000 tokens/min, weight 0.0008, joint cap
// 1.0, 1.2x for 10 s.
var seedCfg = quota.Config{
	QPS:              200,
	TokensPerMin:     200000,
	TokenToQPSWeight: 0.0008,
	JointCap:         1.0,
	BurstWindow:      10 * time.Second,
	BurstAllow:       0.2,
}

// meterCase isolates one meter: limits where it binds, the tokens of each
// request, the units one request costs on that meter and the meter's rate.
type meterCase struct {
	name   string
	dim    quota.Dimension
	lim    *quota.Limits
	tokens int64
	units  float64 // meter units per request
	rate   float64 // meter units per second
}

func meterCases() []meterCase {
	return []meterCase{
		{
			name: "qps", dim: quota.DimQPS,
			lim:    quota.MustCompile(quota.Config{QPS: 200, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			tokens: 100, units: 1, rate: 200,
		},
		{
			name: "tokens", dim: quota.DimTokens,
			lim:    quota.MustCompile(quota.Config{TokensPerMin: 200000, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			tokens: 1000, units: 1000, rate: 200000.0 / 60,
		},
		{
			// 1250 tokens weigh 1 request: a request is 2 request-
			// equivalents, so joint binds at 100 requests/s and the qps
			// meter (200/s) never does.
			name: "joint", dim: quota.DimJoint,
			lim:    quota.MustCompile(quota.Config{QPS: 200, TokenToQPSWeight: 0.0008, JointCap: 1, BurstWindow: 10 * time.Second, BurstAllow: 0.2}),
			tokens: 1250, units: 2, rate: 200,
		},
	}
}

func tenantName(i int) string {
	const digits = "0123456789"
	b := []byte("tenant-00000")
	for j := len(b) - 1; i > 0; j-- {
		b[j] = digits[i%10]
		i /= 10
	}
	return string(b)
}
