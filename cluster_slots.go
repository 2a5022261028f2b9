package caddyfairqueue

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
)

// Defaults of the shared slots (ClusterConfig.ShareSlots).
const (
	defaultSlotSync = 100 * time.Millisecond
	defaultLeaseTTL = 30 * time.Second
)

// syncSlots renews this gateway's grant of the shared slots when a Sync
// interval has passed, off the tick (the Redis call never holds the queue
// or delays a tick). Between intervals, the gateways' announcements
// renew it (followMoves).
func (s *sharedQueue) syncSlots(h *Handler, now time.Time) {
	cs := h.cluster
	if cs == nil || cs.broker == nil {
		if s.slotsLimited.Swap(false) {
			s.q.SetSlotLimit(-1) // a reload turned sharing off
			s.slotGrant.Store(-1)
		}
		return
	}
	if !s.slotsGranted.Load() {
		// No slot until the first grant (one Redis call away): the
		// others may hold the whole pool, so any share taken before
		// asking could oversubscribe it. Requests wait that call; if it
		// fails, the outage share (pool/instances) applies.
		s.q.SetSlotLimit(0)
		s.slotGrant.Store(0)
		s.slotsLimited.Store(true)
	}
	cs.movesOnce.Do(func() {
		// Made here without a connection (this may run under the
		// queue's lock: commitLocked); the goroutine dials.
		cs.moves = cs.broker.Moves()
		go s.followMoves(cs.moves, h.logger)
	})
	if now.UnixNano()-s.slotSyncAt.Load() < int64(cs.sync) {
		return
	}
	s.startSlotSync()
}

// Between sync intervals a grant moves on events: the other gateways'
// announcements (followMoves), a tenant new to the backlog (slotsQueued),
// a completion above the grant (slotsReleased), and a lower grant leaving
// slots unfilled (syncSlotsOnce).

// followMoves renews the grant on the announcements of the other
// gateways, until the subscription is closed (closeCluster).
func (s *sharedQueue) followMoves(moves *cluster.Moves, logger *zap.Logger) {
	defer guardBackground(logger, "the announcements of the shared slots", s.name, nil)
	moves.Follow(func() { s.slotsListening.Store(true) }, func(mv cluster.Move) {
		if mv.Instance == s.instance {
			return
		}
		clusterSlotMoves.WithLabelValues(s.name, mv.Kind, "received").Inc()
		// A release may arrive before this gateway's renewal in flight
		// has learnt it is owed (its claim set the release off): that
		// renewal then runs once more.
		if mv.Kind == cluster.Claim || s.slotsOwed.Load() || s.slotSyncing.Load() {
			s.kickSlots()
		}
	})
}

// kickSlots renews the grant now, not at the next interval.
func (s *sharedQueue) kickSlots() {
	if s.slotOwner() != nil {
		s.startSlotSync()
	}
}

// slotOwner is the handler whose config renews the grant: the queue's
// owner while its config shares the slots and its client is open.
func (s *sharedQueue) slotOwner() *Handler {
	if h := s.owner(); h != nil && h.cluster != nil && h.cluster.broker != nil && !h.cluster.closed.Load() {
		return h
	}
	return nil
}

// slotsQueued is told that a request was queued: a tenant new to the
// gateway raises its weight, which the others must hear of now. It reads
// two atomics (BackloggedWeight takes no lock).
func (s *sharedQueue) slotsQueued() {
	if s.slotsLimited.Load() && s.q.BackloggedWeight() > math.Float64frombits(s.slotWeight.Load()) {
		s.kickSlots()
	}
}

// slotsReleased is told that a request ended: above its grant, the
// gateway gives the slot back now. During a renewal it may be above the
// grant that renewal is applying without knowing yet: that renewal then
// runs once more.
func (s *sharedQueue) slotsReleased() {
	if s.slotsOver.Load() || s.slotSyncing.Load() {
		s.kickSlots()
	}
}

// startSlotSync runs a renewal unless one is in flight; then that one
// runs once more when it is done, so no kick is lost. Each renewal is made
// by the config in force when it starts (a reload may replace it).
func (s *sharedQueue) startSlotSync() {
	// Asked before trying: a renewal ending meanwhile sees it and runs
	// again, or this call starts one.
	s.slotKicked.Store(true)
	if !s.slotSyncing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		// A renewal that panicked is over: the next kick or sync starts
		// another.
		defer guardBackground(s.logger(), "the renewal of the shared slots", s.name, func() { s.slotSyncing.Store(false) })
		for {
			s.slotKicked.Store(false)
			if h := s.slotOwner(); h != nil {
				s.syncSlotsOnce(h)
			}
			s.slotSyncing.Store(false)
			if !s.slotKicked.Load() || !s.slotSyncing.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// syncSlotsOnce renews the grant (one script call) and applies it.
func (s *sharedQueue) syncSlotsOnce(h *Handler) {
	cs := h.cluster
	s.slotSyncAt.Store(time.Now().UnixNano())
	pool := h.MaxInflight * countHealthy(h.proxy)
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
	ctx, cancel := context.WithTimeout(context.Background(), cs.budget)
	defer cancel()
	since := s.slotRestoreSince.Load()
	holds, loads := s.beginRenewal(h, holding)
	g, err := cs.broker.Sync(ctx, cluster.Renewal{Instance: s.instance, Slots: pool, Demand: demand,
		Holding: holding, Weight: weight, Loads: loads, Since: since})
	if cs.closed.Load() {
		return // the config was replaced: its client is closed, the next one syncs
	}
	if err != nil {
		// Redis down or slow: this gateway's share of the pool, as if
		// every gateway wanted it all.
		g = cluster.Grant{Slots: pool / cs.instances, Fair: pool / cs.instances}
		if s.slotsUp.CompareAndSwap(true, false) {
			h.logger.Warn("redis unreachable: taking 1/instances of the upstream slots until it answers",
				zap.String("queue", s.name), zap.Int("slots", g.Slots), zap.Error(err))
		}
	} else {
		s.boundGrant(h, &g, since)
	}
	s.slotWeight.Store(math.Float64bits(weight))
	if g.Others != nil {
		s.slotView.Store(&upstreamView{others: g.Others, targets: g.Targets, holds: holds})
	} else {
		s.slotView.Store(nil) // Redis down: each gateway balances its own
	}
	s.q.SetSlotLimit(g.Slots)
	s.slotGrant.Store(int64(g.Slots))
	s.slotsLimited.Store(true)
	s.slotsGranted.Store(true)
	// Read after applying the grant: requests dispatched during the call
	// count.
	after := s.q.Stats(false)
	s.slotsOwed.Store(err == nil && g.Fair > g.Slots && min(after.Inflight+after.Queued, pool) > g.Slots)
	s.slotsOver.Store(err == nil && after.Inflight > g.Slots)
	if err == nil && max(after.Inflight, after.Capacity) < holding {
		// The call counted what this gateway could dispatch until now; a
		// lower grant just applied frees slots it had not filled: say so
		// at once (the next call announces them), not at the next sync.
		s.slotKicked.Store(true)
	}
}

// boundGrant bounds a grant Redis returned: while the pool is being
// restored, by the last grant; always, by the slots its targets place.
// since is the restore's start the renewal was made with.
func (s *sharedQueue) boundGrant(h *Handler, g *cluster.Grant, since int64) {
	cs := h.cluster
	if s.restoring(cs, *g, since) {
		g.Slots = min(g.Slots, int(max(s.slotGrant.Load(), 0)))
	}
	if !s.slotsUp.Swap(true) {
		h.logger.Info("sharing the upstream slots through redis", zap.String("queue", s.name), zap.Int("grant", g.Slots))
	}
	if g.Announced != "" {
		clusterSlotMoves.WithLabelValues(s.name, g.Announced, "sent").Inc()
	}
	if g.Targets != nil {
		// No more in flight than the targets place: beyond them a request
		// would go where every slot is taken, one model server past its
		// slots while the pool's total holds.
		placed := 0
		for _, n := range g.Targets {
			placed += n
		}
		g.Slots = min(g.Slots, placed)
	}
}

// restoring reports whether the pool is being restored after a renewal
// that answered g (since: the restore's start when it was asked, 0 if
// none), starting or ending the restore as g says.
func (s *sharedQueue) restoring(cs *clusterStore, g cluster.Grant, since int64) bool {
	now := time.Now().UnixNano()
	switch {
	case (g.Fresh || !s.slotsUp.Load()) && s.slotsGranted.Load():
		// Back from an outage, or Redis lost the pool or this entry,
		// while this gateway held slots: the others hold slots Redis does
		// not count until they renew. Until every other gateway has
		// renewed since now, none takes more than it held before, so
		// together they stay within the pool.
		s.slotRestoreSince.Store(g.Now)
		s.slotRestoreUntil.Store(now + int64(cs.ttl))
		return g.Now != 0
	case since != 0 && (g.Renewed >= cs.instances-1 || now >= s.slotRestoreUntil.Load()):
		// Every other gateway counted again; or one has not renewed
		// within a lease of Redis answering, and is taken as gone, as
		// when its lease lapses.
		s.slotRestoreSince.Store(0)
		return false
	}
	return since != 0
}

// beginRenewal starts a renewal: until it is applied, the gateway places
// its requests within what the call will tell the others it may have on
// each upstream (holdsUntilNext), not within its targets, which the others
// may be given meanwhile. Loads are taken and the view set under the
// placements' lock, which Select places under, so every request placed
// before is in the loads and none after goes past them. It returns the
// holds, which stand until the next renewal starts (nil while Redis is
// down: the gateway then balances its own).
func (s *sharedQueue) beginRenewal(h *Handler, holding int) (holds map[string]int, loads []cluster.Load) {
	s.placed.mu.Lock()
	defer s.placed.mu.Unlock()
	loads = slotLoads(h, s.placed.n)
	if v := s.slotView.Load(); v != nil {
		holds = holdsUntilNext(loads, v.targets, holding)
		s.slotView.Store(&upstreamView{others: v.others, targets: holds})
	}
	return holds, loads
}

// holdsUntilNext is what a renewal tells the other gateways this one may
// have on each upstream until its next renewal, as sync.lua counts it:
// its requests there at the call (loads), plus, up to its targets then
// (prev), as many as it holds beyond its requests in flight (holding less
// the loads), which it may dispatch during the call.
func holdsUntilNext(loads []cluster.Load, prev map[string]int, holding int) map[string]int {
	spare := holding
	for _, l := range loads {
		spare -= l.Inflight
	}
	holds := make(map[string]int, len(loads))
	for _, l := range loads {
		holds[l.Upstream] = l.Inflight + min(max(prev[l.Upstream]-l.Inflight, 0), max(spare, 0))
	}
	return holds
}

// slotLoads is what this gateway has in flight on each upstream of the
// pool and what each holds (the others' ClusterLeastConn count the
// former; the targets are made of both).
// A request Select placed counts from then, not only once reverse_proxy
// counts it (a moment later: see placements); placed is the places by
// dial (nil: none).
func slotLoads(h *Handler, placed map[string]int) []cluster.Load {
	loads := make([]cluster.Load, 0, len(h.proxy.Upstreams))
	for _, u := range h.proxy.Upstreams {
		l := cluster.Load{Upstream: u.Dial, Inflight: max(u.NumRequests(), placed[u.Dial])}
		if u.Healthy() {
			l.Slots = h.MaxInflight
		}
		loads = append(loads, l)
	}
	return loads
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
	deadline := time.Now().Add(cs.ttl)
	for {
		inflight := s.q.Stats(false).Inflight
		ctx, cancel := context.WithTimeout(context.Background(), cs.budget)
		var err error
		if inflight == 0 {
			err = cs.broker.Release(ctx, s.instance)
		} else {
			_, err = cs.broker.Sync(ctx, cluster.Renewal{Instance: s.instance, Slots: h.MaxInflight * countHealthy(h.proxy),
				Holding: inflight, Loads: slotLoads(h, s.placed.counts())})
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
