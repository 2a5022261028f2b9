package cluster

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// ProbeTenant and probeLimits are what the outage probe reads: a tenant
// name no caller can have (tenant keys come from placeholders, which never
// hold a NUL) and any limits.
var (
	ProbeTenant = "\x00probe"
	probeLimits = quota.MustCompile(quota.Config{QPS: 1})
)

// NewQuota returns the meters under prefix in Redis (shared) and the store
// a queue decides on (local): shared while Redis answers, on 1/instances of
// each quota while it does not. opts gives the instances and the
// callbacks; the probe and the outage test are Redis's. Each call is
// bounded by budget. It loads the script, so that the first decision is
// one round trip, and returns that load's error: Redis may not be up yet,
// which the first decision finds out.
func NewQuota(client redis.UniversalClient, prefix string, budget time.Duration, opts quota.LocalOptions) (shared *quota.Redis, local *quota.Local, loadErr error) {
	shared = quota.NewRedis(client, quota.RedisOptions{Prefix: prefix, Timeout: budget})
	// The probe is a read of the same script the decisions run (its
	// EVALSHA falls back to EVAL, which reloads the script a restarted
	// Redis lost): a Redis that answers PING or SCRIPT LOAD but refuses
	// the script (ACL, scripting off) is still down for quotas, and must
	// not flap between the two.
	opts.Probe = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		_, err := shared.Status(ctx, ProbeTenant, probeLimits)
		return err
	}
	// A key of another type at a tenant's name is that tenant's problem,
	// not an outage.
	opts.Outage = quota.RedisOutage
	local = quota.NewLocal(shared, quota.NewMemory(time.Now), opts)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	return shared, local, shared.Load(ctx)
}
