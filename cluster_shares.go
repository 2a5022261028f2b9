package caddyfairqueue

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
)

// syncShares exchanges the tenants' service with the other gateways
// (share_fairness) when a Sync interval has passed: what this queue
// charged each tenant since its last sync goes to the stream, and what
// the others charged is applied to the tenants queued here. Like the
// slots' renewal it runs off the tick, at most one call in flight per
// queue; a failed call drops its interval (nothing is charged twice).
func (s *sharedQueue) syncShares(h *Handler, now time.Time) {
	cs := h.cluster
	if cs == nil || cs.sharesKey == "" {
		if s.sharing.Swap(false) {
			s.q.StopServed() // a reload turned sharing off
		}
		return
	}
	s.sharing.Store(true)
	if now.UnixNano()-s.shareSyncAt.Load() < int64(cs.sync) || !s.shareSyncing.CompareAndSwap(false, true) {
		return
	}
	s.shareSyncAt.Store(now.UnixNano())
	// The buffers belong to the call in flight until it clears
	// shareSyncing.
	mine := s.q.TakeServed(s.shareMine[:0])
	go func() {
		defer s.shareSyncing.Store(false)
		defer guardBackground(h.logger, "the exchange of the tenants' service", s.name, nil)
		if cs.shares == nil {
			cs.shares = cluster.NewExchange(cs.client, cs.sharesKey, s.instance, cs.ttl)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cs.budget)
		defer cancel()
		theirs, err := cs.shares.Swap(ctx, mine, s.shareTheirs[:0])
		s.shareMine, s.shareTheirs = mine, theirs
		if cs.closed.Load() {
			return // the config was replaced: its client is closed
		}
		if err != nil {
			clusterShareFailures.WithLabelValues(s.name).Inc()
			if s.sharesUp.CompareAndSwap(true, false) {
				h.logger.Warn("redis unreachable: the tenants' service is not shared with the other gateways until it answers",
					zap.String("queue", s.name), zap.Error(err))
			}
			return
		}
		if !s.sharesUp.Swap(true) {
			h.logger.Info("sharing the tenants' virtual time through redis", zap.String("queue", s.name))
		}
		applied := s.q.ChargeRemote(theirs)
		clusterShared.WithLabelValues(s.name, "sent").Add(float64(len(mine)))
		clusterShared.WithLabelValues(s.name, "received").Add(float64(len(theirs)))
		clusterShared.WithLabelValues(s.name, "applied").Add(float64(applied))
	}()
}
