package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// clusterKeysTmpl: one gateway sharing its slots and its tenants' service
// through Redis, with a quota of one request a second on every unknown
// caller.
const clusterKeysTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 4
		cluster {
			redis {{.Redis}}
			instances 1
			prefix keys:
			timeout ` + clusterTimeout + `
			share_slots
			share_fairness
			sync 50ms
		}
		default_tenant weight 1 class interactive wait_budget 200ms {
			quota qps 1 burst_allow 0
		}
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// TestClusterTenantNamedAfterInternalKeys: through the binary and a real
// redis-server, callers whose tenant IDs spell the cluster's own keys (the
// pool's and the stream's hash tags and namespaces, the keys whole, the
// gateway's own meters) are each held to their quota in Redis like any
// other caller, and the pool of shared slots and the stream of served
// cost stay what they are: the pool's fields are the gateways' entries
// only (a tenant "slots" once wrote its meters into it, and a refund
// deleted it), the stream stays a stream (a tenant "shares" once met it
// as a key of the wrong type and was decided locally), and no decision is
// made locally or sync fails while Redis is up.
func TestClusterTenantNamedAfterInternalKeys(t *testing.T) {
	t.Parallel()
	rs := harness.StartRedis(t)
	fakes := startFakes(t, 1, "ckeys", harness.FakeOptions{Slots: 4})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, clusterKeysTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...), "Redis": rs.URL()})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	waitMetricEq(t, c, 1, "caddy_fair_queue_cluster_redis_up")
	waitMetricEq(t, c, 4, "caddy_fair_queue_cluster_slot_grant")
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()
	ctx := context.Background()

	names := []string{"slots", "shares", "{slots}", "{shares}", "slots}:up", "slots}:moves", "pool{slots}",
		"stream{shares}", "keys:pool{slots}", "keys:pool{slots}:up", "keys:stream{shares}", "pool", "stream",
		"upstream", "probe", "i{upstream}", "i{probe}", "t{slots}"}
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	for _, tenant := range names {
		// Three back to back: the first served, the next two refused by
		// the tenant's own meter (one request a second).
		var codes []string
		for i := range 3 {
			r := send(ctx, cl, base, chatReq{Tenant: tenant, TestID: fmt.Sprintf("%s-%d", tenant, i), MaxTokens: 5})
			if r.Err != nil {
				t.Fatalf("tenant %q: %v", tenant, r)
			}
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(r.Body, &body)
			codes = append(codes, fmt.Sprint(r.Status, body.Error.Code))
		}
		if want := []string{"200", "429quota_exceeded", "429quota_exceeded"}; fmt.Sprint(codes) != fmt.Sprint(want) {
			t.Errorf("tenant %q: answers %v, want %v (its own quota, one request a second)", tenant, codes, want)
		}
		if n := rc.Exists(ctx, "keys:t{"+tenant+"}").Val(); n != 1 {
			t.Errorf("tenant %q: no meter of its own in the tenants' namespace", tenant)
		}
	}
	// The stream is written once a tenant was served (an entry per sync
	// with service to send).
	harness.WaitFor(t, "the stream of served cost", func() (bool, string) {
		typ := rc.Type(ctx, "keys:stream{shares}").Val()
		return typ == "stream", "type " + typ
	})
	entry := regexp.MustCompile(`^\d+,\d+,\d+,\d+,\d+,\d+$`)
	pool, err := rc.HGetAll(ctx, "keys:pool{slots}").Result()
	if err != nil || len(pool) != 1 {
		t.Errorf("the pool %v (%v), want one gateway's entry", pool, err)
	}
	for field, v := range pool {
		if !entry.MatchString(v) {
			t.Errorf("the pool's field %q holds %q, not a gateway's entry", field, v)
		}
	}
	s := scrape(t, c)
	for _, m := range []string{"caddy_fair_queue_cluster_fallback_total", "caddy_fair_queue_cluster_share_failures_total"} {
		if v := metric(s, m); v != 0 {
			t.Errorf("%s %v with redis up: a tenant's key was of another type", m, v)
		}
	}
	if v := metric(s, "caddy_fair_queue_cluster_slot_grant"); v != 4 {
		t.Errorf("cluster_slot_grant %v, want the pool's 4", v)
	}
	// Every meter comes back to rest within its second and is deleted;
	// the pool and the stream stay.
	harness.WaitFor(t, "the tenants' meters gone at rest", func() (bool, string) {
		keys := rc.Keys(ctx, "keys:t{*").Val()
		return len(keys) == 0, fmt.Sprintf("left: %q", keys)
	})
	if n := rc.Exists(ctx, "keys:pool{slots}", "keys:stream{shares}").Val(); n != 2 {
		t.Errorf("after the tenants' meters expired, %d of the pool and the stream are left, want 2", n)
	}
	for _, line := range strings.Split(c.Logs(), "\n") {
		if strings.Contains(line, "WRONGTYPE") {
			t.Errorf("logged a key of the wrong type: %s", line)
		}
	}
}
