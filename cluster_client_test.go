package caddyfairqueue

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The cluster block takes one Redis, a primary behind Sentinel (URL or
// block) or a Redis Cluster's seed nodes (package cluster's
// TestClientKinds makes each a client of its kind).
func TestClusterClientKinds(t *testing.T) {
	h, err := parseBlock(`fair_queue {
		cluster {
			redis redis://:pw@ignored:1/2
			sentinel {
				master mymaster
				addrs 10.0.0.1:26379 10.0.0.2:26379
			}
		}
		reverse_proxy a:1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if s := h.Cluster.Sentinel; s == nil || s.Master != "mymaster" || len(s.Addrs) != 2 {
		t.Fatalf("sentinel: %+v", s)
	}
	h, err = parseBlock("fair_queue {\ncluster {\ncluster_addrs 10.0.0.1:7000 10.0.0.2:7000 10.0.0.3:7000\n}\nreverse_proxy a:1\n}")
	if err != nil || len(h.Cluster.ClusterAddrs) != 3 {
		t.Fatalf("cluster_addrs: %v %+v", err, h.Cluster)
	}
}

// Every Redis command of a queue's cluster is timed in
// cluster_redis_seconds: a quota decision is at least one.
func TestClusterRedisSecondsObserved(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	name := queueName(t)
	h, _ := mustLoad(t, clusterJSON(name, u, fmt.Sprintf(`{"redis":"redis://%s","timeout":"5s"}`, mr.Addr())))
	count := func() uint64 {
		var m dto.Metric
		if err := clusterRedisSeconds.WithLabelValues(name).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	before := count()
	if r := newGateway(t, h).post("a", chatBody("")); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if n := count() - before; n < 2 {
		t.Errorf("%d commands timed for a metered request, want its charge and its correction at least", n)
	}
}
