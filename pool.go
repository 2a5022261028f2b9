package caddyfairqueue

import (
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// tickPeriod is how often a queue expires deadlines, re-reads upstream
// health and feeds the degrade ladder. Health changes therefore reach
// capacity within one tick, well inside any health_interval.
const tickPeriod = 50 * time.Millisecond

// queues holds one scheduler per queue name. A config reload provisions new
// handlers before cleaning up the old ones, so the usage count never drops
// to zero across a reload and the queue — with everything waiting and in
// flight — carries over to the new config.
var queues = caddy.NewUsagePool()

// sharedQueue is the state that outlives a config: the scheduler and the
// goroutine that ticks it. Handlers come and go as owners; the newest live
// one supplies the config, the proxy and the health view.
type sharedQueue struct {
	name string
	q    *fairqueue.Queue

	mu     sync.Mutex
	owners []*Handler

	stop chan struct{}
	done chan struct{}
}

func newSharedQueue(name string, cfg fairqueue.Config) (*sharedQueue, error) {
	q, err := fairqueue.New(cfg, fairqueue.RealClock{})
	if err != nil {
		return nil, err
	}
	s := &sharedQueue{name: name, q: q, stop: make(chan struct{}), done: make(chan struct{})}
	q.SetDegradeObserver(func(tr degrade.Transition) {
		if h := s.owner(); h != nil {
			h.onTransition(tr)
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

// adopt makes h the owner and applies its config. Two handlers of one
// config load that name the same queue are refused: the queue has one
// proxy and one health view, so one of them would silently lose its
// upstreams. (A reload's old and new handlers share it by design.)
func (s *sharedQueue) adopt(h *Handler) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.owners {
		// A config load's modules share its metrics registry (Caddy makes
		// one per load), while each server gets its own context.Context.
		if reg := h.ctx.GetMetricsRegistry(); reg != nil && o.ctx.GetMetricsRegistry() == reg {
			return fmt.Errorf("two fair_queue handlers are named %q in one config; "+
				"give each its own name (the name identifies the queue they share)", s.name)
		}
	}
	if err := s.q.Reconfigure(h.qcfg); err != nil {
		return err
	}
	s.owners = append(s.owners, h)
	s.q.SetHealthy(h.healthyUpstreams())
	return nil
}

// abandon removes h; if it was the owner (a config that failed to load
// after provisioning, or the old config after a reload), the previous live
// handler's config is put back in force.
func (s *sharedQueue) abandon(h *Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, o := range s.owners {
		if o == h {
			wasOwner := i == len(s.owners)-1
			s.owners = append(s.owners[:i], s.owners[i+1:]...)
			if wasOwner && len(s.owners) > 0 {
				prev := s.owners[len(s.owners)-1]
				_ = s.q.Reconfigure(prev.qcfg)
				s.q.SetHealthy(prev.healthyUpstreams())
			}
			return
		}
	}
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

func (s *sharedQueue) tick() {
	defer func() {
		if err := recover(); err != nil {
			logger := caddy.Log()
			if h := s.owner(); h != nil {
				logger = h.logger
			}
			logger.Named("ticker").Error("panic in the queue's tick",
				zap.String("queue", s.name), zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	if h := s.owner(); h != nil {
		s.q.SetHealthy(h.healthyUpstreams())
	}
	s.q.Tick()
}

// Interface guards
var _ caddy.Destructor = (*sharedQueue)(nil)
