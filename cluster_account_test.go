package caddyfairqueue

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// accountSyncs is how many syncs of queue's provider account were
// observed (cluster_account_sync_seconds' count).
func accountSyncs(t *testing.T, queue string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := clusterAccountSyncSeconds.WithLabelValues(queue).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestClusterAccountMirror: a gateway of a cluster with a provider account
// keeps the account on a quota.Mirror (the queue's AccountStore; without
// upstream_quota it has none), which its syncs, made off the lock by the
// tick, push to Redis: the account's meter appears there after a request,
// and the syncs are counted. With Redis gone, requests are still served
// on the gateway's share of the account and the failed syncs counted.
func TestClusterAccountMirror(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, fmt.Sprintf(`"upstream_quota":{"tpm":6000000,"rpm":60000},"cluster":{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"acct:"}`, mr.Addr())))
	if _, ok := h.qcfg.AccountStore.(*quota.Mirror); !ok || h.cluster.account == nil {
		t.Fatalf("the queue's account store is %T, want the cluster's quota.Mirror", h.qcfg.AccountStore)
	}
	hq, _ := mustLoad(t, clusterJSON(name+"_noacct", u, fmt.Sprintf(`{"redis":"redis://%s"}`, mr.Addr())))
	if hq.qcfg.AccountStore != nil || hq.cluster.account != nil {
		t.Errorf("without upstream_quota: account store %T, want none", hq.qcfg.AccountStore)
	}
	g := newGateway(t, h)
	if r := g.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	eventually(t, "the account's meter in redis, pushed by a sync", func() bool { return mr.Exists("acct:i{upstream}") })
	eventually(t, "the sync counted", func() bool { return accountSyncs(t, name) > 0 })

	mr.Close()
	errs := counterValue(clusterAccountSyncErrors, name)
	for i := range 3 {
		if r := g.post("a", chatBody("")); r.status != http.StatusOK {
			t.Fatalf("request %d with redis down: %d %s; want it served on the gateway's share of the account", i, r.status, r.body)
		}
	}
	eventually(t, "failed syncs counted", func() bool { return counterValue(clusterAccountSyncErrors, name) > errs })
}

// TestClusterAccountMirrorSurvivesReload: a reload keeps the account's
// mirror (what the gateway drew stays counted: fresh local meters would
// give it a second burst of its share), hands its syncs to the new
// config's Redis client, and the mirror is released with the queue's last
// config.
func TestClusterAccountMirrorSurvivesReload(t *testing.T) {
	u := newFakeUpstream(t)
	mr1, mr2 := miniredis.RunT(t), miniredis.RunT(t)
	name := queueName(t)
	cfg := func(mr *miniredis.Miniredis) string {
		return fqConfig(name, u, fmt.Sprintf(`"upstream_quota":{"tpm":6000000,"rpm":60000},"cluster":{"redis":"redis://%s","timeout":"5s","instances":2,"prefix":"acct:"}`, mr.Addr()))
	}
	h1, stop1 := mustLoad(t, cfg(mr1))
	g := newGateway(t, h1)
	if r := g.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("before the reload: %d %s", r.status, r.body)
	}
	h2, stop2 := mustLoad(t, cfg(mr2))
	if h2.cluster.account != h1.cluster.account {
		t.Fatal("the reload made a new account mirror: the gateway's draws would start over")
	}
	stop1()
	g.h.Store(h2)
	mr1.FlushAll()
	if r := g.post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("after the reload: %d %s", r.status, r.body)
	}
	eventually(t, "the account's meter in the new redis, pushed by the new config's sync", func() bool { return mr2.Exists("acct:i{upstream}") })
	if len(mr1.Keys()) != 0 {
		t.Errorf("keys in the old redis after the reload: %v", mr1.Keys())
	}
	stop2()
	if _, ok := accounts.References(accountKey(name, 2)); ok {
		t.Error("the account mirror is still held after the queue's last config was cleaned up")
	}
}
