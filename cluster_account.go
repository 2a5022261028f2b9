package caddyfairqueue

import (
	"context"
	"strconv"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
	"github.com/caddyserver/caddy/v2"

	"go.uber.org/zap"
)

// The provider account in a cluster (docs/cluster-accounts.md). The queue
// draws on the account (upstream_quota, its reservations, a fallback's
// account) under its lock at every dispatch, so those draws are made on a
// quota.Mirror: in memory, each gateway on 1/instances of the account. The
// mirror's Sync, which pushes the gateway's draws to Redis and reads the
// shared meters back, is the only network call, and it is made here, on a
// goroutine of its own every sync interval, never under the queue's lock
// nor on the tick.

// accounts holds each queue's account mirror across config loads, as
// queues holds the queue: a reload that started fresh local meters would
// hand the gateway a second burst of its share of the account, which the
// provider's minute does not forgive. Keyed by the queue's name and its
// instances (a new count is a new share, so new meters).
var accounts = caddy.NewUsagePool()

// accountMirror is a Mirror in accounts; nothing to release.
type accountMirror struct{ *quota.Mirror }

func (accountMirror) Destruct() error { return nil }

// accountKey names the account mirror of queue among instances gateways.
func accountKey(queue string, instances int) string {
	return queue + "\x00" + strconv.Itoa(max(instances, 1))
}

// syncAccount starts a sync of the account with Redis when a sync
// interval has passed and none is in flight. A panic in it is logged (as
// the tick's) and the next interval starts another.
func (s *sharedQueue) syncAccount(h *Handler, now time.Time) {
	cs := h.cluster
	if cs == nil || cs.account == nil {
		return
	}
	if now.UnixNano()-s.acctSyncAt.Load() < int64(cs.sync) || !s.acctSyncing.CompareAndSwap(false, true) {
		return
	}
	s.acctSyncAt.Store(now.UnixNano())
	go func() {
		defer s.acctSyncing.Store(false)
		defer guardBackground(h.logger, "the sync of the provider account", s.name, nil)
		ok := cs.syncAccount(s.name, true)
		switch {
		case cs.closed.Load():
		case !ok && s.acctUp.CompareAndSwap(true, false):
			h.logger.Named("cluster").Warn("redis unreachable: the provider account is decided on this gateway's share (1/instances) without the others' draws until it answers",
				zap.String("queue", s.name))
		case ok && !s.acctUp.Swap(true):
			h.logger.Named("cluster").Debug("syncing the provider account through redis", zap.String("queue", s.name))
		}
	}()
}

// syncAccount makes one Sync of the account and counts it (when
// counted: not the last one, made as the client closes). It reports
// whether every call reached Redis.
func (cs *clusterStore) syncAccount(queue string, counted bool) bool {
	// One call per meter (the account, each reservation, the fallback's
	// account), each bounded by the store's own timeout (the budget); the
	// whole by a few of them, or, for the last one, which a Cleanup waits
	// for, by one.
	bound := 4 * cs.budget
	if !counted {
		bound = cs.budget
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	err := cs.account.Sync(ctx)
	if counted && !cs.closed.Load() {
		clusterAccountSyncSeconds.WithLabelValues(queue).Observe(time.Since(start).Seconds())
		if err != nil {
			clusterAccountSyncErrors.WithLabelValues(queue).Inc()
		}
	}
	return err == nil
}
