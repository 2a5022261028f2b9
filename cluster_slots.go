package caddyfairqueue

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
)

// Defaults of the shared slots (ClusterConfig.ShareSlots).
const (
	defaultSlotSync = 100 * time.Millisecond
	defaultLeaseTTL = 30 * time.Second
)

// syncSlots renews this gateway's grant of the shared slots when a Sync
// interval has passed, off the tick (the Redis call never holds the queue
// or delays a tick): at most one renewal in flight per queue.
func (s *sharedQueue) syncSlots(h *Handler, now time.Time) {
	cs := h.cluster
	if cs == nil || cs.broker == nil {
		if s.slotsLimited.Swap(false) {
			s.q.SetSlotLimit(-1) // a reload turned sharing off
			s.slotGrant.Store(-1)
		}
		return
	}
	pool := h.MaxInflight * h.healthyUpstreams()
	if !s.slotsGranted.Load() {
		// No slot until the first grant (one Redis call away): the
		// others may hold the whole pool, so any share taken before
		// asking could oversubscribe it. Requests wait that call; if it
		// fails, the outage share (pool/instances) applies.
		s.q.SetSlotLimit(0)
		s.slotGrant.Store(0)
		s.slotsLimited.Store(true)
	}
	if now.UnixNano()-s.slotSyncAt.Load() < int64(cs.sync) || !s.slotSyncing.CompareAndSwap(false, true) {
		return
	}
	s.slotSyncAt.Store(now.UnixNano())
	st := s.q.Stats(false)
	demand := min(st.Inflight+st.Queued, pool)
	// What this gateway may have in flight until it applies the grant the
	// call returns: up to its current capacity (it dispatches meanwhile),
	// or more if a lower grant left requests in flight above it. Others
	// count that, so the pool is never oversubscribed while grants move.
	holding := max(st.Inflight, st.Capacity)
	// Its claim weighs what its tenants with work weigh, so that tenants
	// flooding through different gateways share the pool by weight.
	weight := s.q.BackloggedWeight()
	go func() {
		defer s.slotSyncing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), cs.timeout)
		defer cancel()
		grant, err := cs.broker.Sync(ctx, s.instance, pool, demand, holding, weight)
		if cs.closed.Load() {
			return // the config was replaced: its client is closed, the next one syncs
		}
		if err != nil {
			// Redis down or slow: this gateway's share of the pool, as
			// if every gateway wanted it all.
			grant = pool / cs.instances
			if s.slotsUp.CompareAndSwap(true, false) {
				h.logger.Warn("redis unreachable: taking 1/instances of the upstream slots until it answers",
					zap.String("queue", s.name), zap.Int("slots", grant), zap.Error(err))
			}
		} else if !s.slotsUp.Swap(true) {
			h.logger.Info("sharing the upstream slots through redis", zap.String("queue", s.name), zap.Int("grant", grant))
		}
		s.q.SetSlotLimit(grant)
		s.slotGrant.Store(int64(grant))
		s.slotsLimited.Store(true)
		s.slotsGranted.Store(true)
	}()
}

// newInstanceID names a queue of this process in a shared pool: host, pid
// and a random part, so a restarted gateway is a new instance (the old
// one's grant expires).
func newInstanceID(queue string) string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s/%x", host, os.Getpid(), queue, b)
}

// releaseSlots gives a removed queue's grant back: while its last
// requests run, it renews its entry holding just them (demand 0), then
// deletes it. Bounded by the lease's TTL, after which the entry would
// lapse anyway.
func (s *sharedQueue) releaseSlots(h *Handler) {
	cs := h.cluster
	deadline := time.Now().Add(cs.broker.TTL())
	for {
		inflight := s.q.Stats(false).Inflight
		ctx, cancel := context.WithTimeout(context.Background(), cs.timeout)
		var err error
		if inflight == 0 {
			err = cs.broker.Release(ctx, s.instance)
		} else {
			_, err = cs.broker.Sync(ctx, s.instance, h.MaxInflight*h.healthyUpstreams(), 0, inflight, 0)
		}
		cancel()
		if inflight == 0 || err != nil || time.Now().After(deadline) {
			if err != nil {
				h.logger.Debug("releasing the shared slots", zap.String("queue", s.name), zap.Error(err))
			}
			return
		}
		time.Sleep(cs.sync)
	}
}
