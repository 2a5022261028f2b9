package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// The cluster's background goroutines (the exchange of the tenants'
// service, the renewal of the shared slots, the sync of the provider
// account) log a panic with its stack, as the tick does, and the process
// goes on: the renewal can run again after one. Here their clients are
// missing, which panics inside them.
func TestClusterBackgroundRecoversPanic(t *testing.T) {
	s, err := newSharedQueue(queueName(t), minimalQueueConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destruct()
	core, logs := observer.New(zap.ErrorLevel)
	// A mirror of the account with a draw to push and no Redis behind it.
	account := quota.NewMirror(nil, quota.MirrorOptions{})
	if _, err := account.Charge(context.Background(), "\x00upstream", quota.MustCompile(quota.Config{QPS: 1}), 1); err != nil {
		t.Fatal(err)
	}
	cs := &clusterStore{sharesKey: "k", shares: cluster.NewExchange(nil, "k", "i", time.Second), broker: cluster.NewBroker(nil, "p", time.Second),
		account: account, sync: time.Millisecond, budget: time.Second, instances: 1}
	h := &Handler{logger: zap.New(core), cluster: cs}
	s.mu.Lock()
	s.owners = append(s.owners, h)
	s.mu.Unlock()
	s.syncShares(h, time.Now())
	s.startSlotSync()
	s.syncAccount(h, time.Now())
	eventually(t, "the three panics logged", func() bool {
		return logs.FilterMessage("panic in the exchange of the tenants' service").Len() == 1 &&
			logs.FilterMessage("panic in the renewal of the shared slots").Len() == 1 &&
			logs.FilterMessage("panic in the sync of the provider account").Len() == 1
	})
	for _, e := range logs.All() {
		if _, ok := e.ContextMap()["stack"]; !ok {
			t.Errorf("%q logged without its stack", e.Message)
		}
	}
	eventually(t, "the renewal free to run again", func() bool {
		return !s.slotSyncing.Load() && !s.shareSyncing.Load() && !s.acctSyncing.Load()
	})
	s.startSlotSync()
	eventually(t, "a second renewal ran (and panicked again)", func() bool {
		return logs.FilterMessage("panic in the renewal of the shared slots").Len() == 2
	})
	eventually(t, "the renewal done", func() bool { return !s.slotSyncing.Load() })
	s.mu.Lock()
	s.owners = nil
	s.mu.Unlock()
}
