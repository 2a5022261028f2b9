package caddyfairqueue

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/costmodel"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/history"
)

// tickPeriod is how often a queue expires deadlines, re-reads upstream
// health and feeds the degrade ladder. Health changes therefore reach
// capacity within one tick, well inside any health_interval.
const tickPeriod = 50 * time.Millisecond

// queues holds one scheduler per queue name. A reload provisions new
// handlers before cleaning up the old ones, so the queue carries over.
var queues = caddy.NewUsagePool()

// sharedQueue is the state that outlives a config: the scheduler and the
// goroutine that ticks it. Handlers come and go as owners; the newest live
// one supplies the config, the proxy and the health view.
type sharedQueue struct {
	name string
	q    *fairqueue.Queue
	// cost is the cost model learned from the served requests; it lives
	// as long as the queue, across reloads.
	cost *costmodel.Model
	// hist is what the dashboard shows; like the queue, it outlives
	// reloads. sampler is the tick's buffers for it.
	hist    *history.History
	sampler sampler
	// instance names this gateway's queue in the shared slots' pool;
	// slotSyncAt (Unix ns) and slotSyncing pace the renewals, slotsUp
	// says whether the last one reached Redis.
	instance     string
	slotSyncAt   atomic.Int64
	slotSyncing  atomic.Bool
	slotsUp      atomic.Bool
	slotsGranted atomic.Bool
	// slotKicked asks the renewal in flight for one more; slotsOwed is
	// set while the others hold slots of this gateway's fair share and it
	// has requests for them, slotsOver while it has more requests in
	// flight than its grant; slotWeight is the weight (float64 bits) of
	// the last renewal (see followMoves).
	slotKicked atomic.Bool
	// slotsListening is set once the subscription to the moves is
	// confirmed (until then a move waits for the next renewal).
	slotsListening atomic.Bool
	slotsOwed      atomic.Bool
	slotsOver      atomic.Bool
	slotWeight     atomic.Uint64
	// slotRestoreSince (Redis's clock, Unix ms; 0: none) starts the
	// renewals capped at the last grant after an outage or Redis lost
	// the pool, until every other gateway has renewed since, or
	// slotRestoreUntil (Unix ns) at the latest (syncSlotsOnce).
	slotRestoreSince atomic.Int64
	slotRestoreUntil atomic.Int64
	// slotView is what the last renewal said of each upstream
	// (ClusterLeastConn); nil when unknown.
	slotView atomic.Pointer[upstreamView]
	// placed is where ClusterLeastConn placed the requests in flight,
	// across reloads (a request outlives the config that placed it).
	placed placements
	// slotGrant is the grant last applied (the cap on the queue's
	// capacity), for the cluster_slot_grant gauge; -1 before the first.
	slotGrant atomic.Int64
	// slotsLimited is set while a shared pool caps the queue's capacity,
	// so a tick without sharing lifts the cap once, not every time.
	slotsLimited atomic.Bool
	// shareSyncAt and shareSyncing pace the exchanges of the tenants'
	// service (share_fairness), sharing is set while a config shares it,
	// sharesUp says whether the last exchange reached Redis; the buffers
	// belong to the exchange in flight.
	shareSyncAt  atomic.Int64
	shareSyncing atomic.Bool
	sharing      atomic.Bool
	sharesUp     atomic.Bool
	shareMine    []fairqueue.Served
	shareTheirs  []fairqueue.Served
	// acctSyncAt and acctSyncing pace the syncs of the provider account
	// with Redis (cluster_account.go); acctUp says whether the last one
	// reached it.
	acctSyncAt  atomic.Int64
	acctSyncing atomic.Bool
	acctUp      atomic.Bool

	mu sync.Mutex
	// owners are the handlers whose config loads have started, oldest
	// first; the last one's config is in force. pending are provisioned
	// handlers whose loads have not started yet (adopt).
	owners  []*Handler
	pending []*Handler

	// reading is the bytes reserved by bodies being received
	// (reserveReading).
	reading atomic.Int64

	stop chan struct{}
	done chan struct{}
}

// reserveReading reserves n bytes for a body about to be read, unless the
// bodies being received already hold limit (0: no limit); the caller gives
// them back with reading.Add(-n) once the body is read or refused.
func (s *sharedQueue) reserveReading(n, limit int64) bool {
	if now := s.reading.Add(n); limit > 0 && now > limit && now != n {
		s.reading.Add(-n)
		return false
	}
	return true
}

func newSharedQueue(name string, cfg fairqueue.Config) (*sharedQueue, error) {
	q, err := fairqueue.New(cfg, fairqueue.RealClock{})
	if err != nil {
		return nil, err
	}
	s := &sharedQueue{name: name, q: q, cost: costmodel.New(costmodel.Config{}),
		stop: make(chan struct{}), done: make(chan struct{}),
		hist: history.New(time.Now, declaredTenants(cfg)), instance: newInstanceID(name)}
	s.slotGrant.Store(-1)
	q.SetDegradeObserver(func(tr degrade.Transition) {
		if h := s.owner(); h != nil {
			h.onTransition(tr)
		}
	})
	q.SetCircuitObserver(func(ev fairqueue.CircuitEvent) {
		if h := s.owner(); h != nil {
			h.onCircuit(ev)
		}
	})
	go s.loop()
	return s, nil
}

// Destruct runs once no config uses the queue any more (a reload removed
// or renamed it): requests still queued are answered at once (503, retry)
// rather than left waiting on a queue nobody ticks or dispatches, and the
// ticker stops. Requests in flight finish on their own.
func (s *sharedQueue) Destruct() error {
	st := s.q.Stats(false)
	caddy.Log().Named("http.handlers.fair_queue").Info("queue removed by a configuration change; answering its waiters",
		zap.String("queue", s.name), zap.Int("queued", st.Queued), zap.Int("inflight", st.Inflight))
	s.q.Close("the queue was removed by a configuration reload")
	close(s.stop)
	<-s.done
	return nil
}

// owner returns the handler whose config is in force.
func (s *sharedQueue) owner() *Handler {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.owners) == 0 {
		return nil
	}
	return s.owners[len(s.owners)-1]
}

// adopt joins h to the queue. Two handlers of one config load that name
// the same queue are refused: the queue has one proxy and one health view,
// so one of them would silently lose its upstreams. (A reload's old and new
// handlers share it by design.)
//
// A new queue takes h's config at once. An existing one keeps the config in
// force until h's config load has started (Caddy's "started" event, or the
// first request h serves, whichever comes first): a config that fails to
// load after h was provisioned — a later module's error — must never have
// run the queue, not even for the moment before its Cleanup, or it could
// dispatch waiters under a capacity that never went live.
func (s *sharedQueue) adopt(h *Handler) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reg := h.ctx.GetMetricsRegistry(); reg != nil {
		for _, o := range append(s.owners[:len(s.owners):len(s.owners)], s.pending...) {
			// A config load's modules share its metrics registry (Caddy
			// makes one per load); each server has its own context.
			if o.ctx.GetMetricsRegistry() == reg {
				return fmt.Errorf("two fair_queue handlers are named %q in one config; "+
					"give each its own name (the name identifies the queue they share)", s.name)
			}
		}
	}
	if len(s.owners) == 0 {
		return s.commitLocked(h)
	}
	s.pending = append(s.pending, h)
	if h.events != nil {
		// Subscriptions close when the events app starts, which is after
		// every module of the load is provisioned: this one is in time.
		if err := h.events.On("started", startedHandler(func() { s.commit(h) })); err != nil {
			s.pending = s.pending[:len(s.pending)-1]
			return err
		}
	}
	return nil
}

// commit puts h's config in force, if h is still waiting for it.
func (s *sharedQueue) commit(h *Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropPendingLocked(h) {
		s.promoteLocked(h)
	}
}

// dropPendingLocked takes h off the pending list; false if it was not on it.
func (s *sharedQueue) dropPendingLocked(h *Handler) bool {
	i := slices.Index(s.pending, h)
	if i >= 0 {
		s.pending = slices.Delete(s.pending, i, i+1)
	}
	return i >= 0
}

// promoteLocked commits a pending handler whose load has started.
func (s *sharedQueue) promoteLocked(h *Handler) {
	if err := s.commitLocked(h); err != nil {
		// Validated at Provision: only a bug gets here.
		h.logger.Error("applying the new config to the queue", zap.String("queue", s.name), zap.Error(err))
	}
}

func (s *sharedQueue) commitLocked(h *Handler) error {
	if err := s.q.Reconfigure(h.qcfg); err != nil {
		return err
	}
	s.owners = append(s.owners, h)
	h.committed.Store(true)
	s.hist.Declare(declaredTenants(h.qcfg))
	h.applyHealth(s.q)
	s.syncSlots(h, time.Now()) // a shared pool's initial share, before any request
	return nil
}

// abandon removes h; if it was the owner (the old config after a reload),
// the previous live handler's config is put back in force. A handler whose
// config never started is only forgotten.
func (s *sharedQueue) abandon(h *Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.owners, h)
	if s.dropPendingLocked(h) || i < 0 {
		return
	}
	wasOwner := i == len(s.owners)-1
	s.owners = slices.Delete(s.owners, i, i+1)
	switch {
	case len(s.owners) == 0 && len(s.pending) > 0:
		// Caddy stops the old config only after the new one
		// started: if its "started" never reached us, the newest
		// pending handler's config is the live one now.
		next := s.pending[len(s.pending)-1]
		s.pending = s.pending[:len(s.pending)-1]
		s.promoteLocked(next)
	case wasOwner && len(s.owners) > 0:
		prev := s.owners[len(s.owners)-1]
		_ = s.q.Reconfigure(prev.qcfg)
		s.hist.Declare(declaredTenants(prev.qcfg))
		prev.applyHealth(s.q)
	}
}

// startedHandler runs a func on Caddy's "started" event.
type startedHandler func()

// Handle implements caddyevents.Handler.
func (f startedHandler) Handle(context.Context, caddy.Event) error {
	f()
	return nil
}

// loop ticks the queue: health into capacity, deadlines, re-checks, the
// degrade ladder. A panic in one tick is logged and the loop goes on: a
// queue nobody ticks would let its waiters miss every deadline.
func (s *sharedQueue) loop() {
	defer close(s.done)
	t := time.NewTicker(tickPeriod)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.tick()
		}
	}
}

// logger is the logger of the config in force, Caddy's before any.
func (s *sharedQueue) logger() *zap.Logger {
	if h := s.owner(); h != nil {
		return h.logger
	}
	return caddy.Log()
}

func (s *sharedQueue) tick() {
	defer func() {
		if err := recover(); err != nil {
			s.logger().Named("ticker").Error("panic in the queue's tick",
				zap.String("queue", s.name), zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	h := s.owner()
	if h != nil {
		h.applyHealth(s.q)
		s.applyCostModel(h)
		if h.cluster != nil {
			h.cluster.store.Poll()
		}
		s.syncSlots(h, time.Now())
		s.syncShares(h, time.Now())
		s.syncAccount(h, time.Now())
	}
	s.q.Tick()
	s.sample(h)
}

// Interface guards
var (
	_ caddy.Destructor    = (*sharedQueue)(nil)
	_ caddyevents.Handler = startedHandler(nil)
)
