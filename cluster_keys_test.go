package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
)

// internalNames are tenant IDs spelled after the cluster's own keys: their
// hash tags, their namespaces, the keys themselves with and without the
// prefix, and the names of the gateway's own meters less their NUL.
func internalNames(prefix string) []string {
	names := []string{"slots", "shares", "{slots}", "{shares}", "slots}:up", "slots}:moves",
		"probe", "upstream", "reserve", "i{probe}", "i{upstream}", "t{x}", "}", "{", ""}
	for _, k := range []string{cluster.PoolKey(prefix), cluster.PoolKey(prefix) + ":up", cluster.PoolKey(prefix) + ":moves", cluster.SharesKey(prefix)} {
		rest := strings.TrimPrefix(k, prefix)
		names = append(names, k, rest, rest[strings.Index(rest, "{"):])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TestClusterTenantsApartFromInternalKeys: every tenant ID spelled after
// one of the cluster's own keys gets a meter of its own under the tenants'
// namespace; the shared slots' pool stays a pool (its fields the gateways'
// entries only, never a tenant's q, t, j), the stream of served cost stays
// a stream, and each such tenant is held to its quota like any other
// caller, in Redis (no WRONGTYPE sending it to the local meters). A
// tenant's meter brought back to rest (a refund, as for a request its
// upstream failed) deletes its own key and nothing else.
func TestClusterTenantsApartFromInternalKeys(t *testing.T) {
	u := newFakeUpstream(t)
	mr := miniredis.RunT(t)
	const prefix = "keys:"
	cfg := fmt.Sprintf(`{"redis":"redis://%s","instances":1,"prefix":%q,"share_slots":true,"share_fairness":true,"sync":"20ms","timeout":"5s"}`, mr.Addr(), prefix)
	name := queueName(t)
	h, _ := mustLoad(t, fqConfig(name, u, `"default_tenant":{"wait_budget":"100ms","quota":{"qps":0.01,"burst_allow":0}},"cluster":`+cfg))
	g := newGateway(t, h)
	eventually(t, "the first grant and the first exchange", func() bool {
		return h.shared.slotsUp.Load() && h.shared.sharesUp.Load()
	})
	fallbacks := counterValue(clusterFallbacks, name)
	names := internalNames(prefix)
	for _, tenant := range names {
		if tenant == "" {
			continue // no tenant ID: the default tenant's own name
		}
		if r := g.post(tenant, chatBody("")); r.status != http.StatusOK {
			t.Fatalf("tenant %q: first request %d %s", tenant, r.status, r.body)
		}
		// Held to its quota, one request per 100 s (so that its meter
		// stays charged however slowly the test runs): the meter is its
		// own and in Redis.
		wantQuotaExceeded(t, g.post(tenant, chatBody("")))
		if k := prefix + cluster.TenantSpace + "{" + tenant + "}"; !mr.Exists(k) {
			t.Errorf("tenant %q: no meter at %q; keys %q", tenant, k, mr.Keys())
		}
	}
	if got := counterValue(clusterFallbacks, name); got != fallbacks {
		t.Errorf("%v decisions were made locally with redis up (a tenant's key of another type)", got-fallbacks)
	}
	checkInternal := func(when string) {
		t.Helper()
		fields, err := mr.HKeys(cluster.PoolKey(prefix))
		if err != nil || len(fields) != 1 || fields[0] != h.shared.instance {
			t.Errorf("%s: the pool's fields %q (%v), want only this gateway's entry %q", when, fields, err, h.shared.instance)
		}
		if typ := mr.Type(cluster.SharesKey(prefix)); typ != "stream" {
			t.Errorf("%s: the stream of served cost is a %q", when, typ)
		}
	}
	checkInternal("after the requests")
	// Refunds bring each meter to rest, which deletes its key: only its
	// own.
	l := h.qcfg.Default.Quota
	for _, tenant := range names {
		if tenant == "" {
			continue
		}
		if _, err := h.cluster.store.Refund(context.Background(), tenant, l, 1<<20); err != nil {
			t.Fatalf("refund %q: %v", tenant, err)
		}
		if k := prefix + cluster.TenantSpace + "{" + tenant + "}"; mr.Exists(k) {
			t.Errorf("tenant %q: its meter %q is still there at rest", tenant, k)
		}
	}
	checkInternal("after the refunds")
	for _, k := range mr.Keys() {
		if !strings.HasPrefix(k, cluster.PoolKey(prefix)) && k != cluster.SharesKey(prefix) {
			t.Errorf("key %q left over", k)
		}
	}
}

// TestClusterKeyNamespaces: the pool's keys share one hash tag (its script
// touches one Redis Cluster slot), and no tenant name spells a key of the
// pool, of the stream or of the gateway's own meters.
func TestClusterKeyNamespaces(t *testing.T) {
	const prefix = "fq:quota:default:"
	r := cluster.NewQuotaStore(nil, prefix, 0)
	internal := map[string]bool{cluster.PoolKey(prefix): true, cluster.PoolKey(prefix) + ":up": true, cluster.SharesKey(prefix): true,
		r.Key("\x00upstream"): true, r.Key("\x00reserve\x00vip"): true, r.Key(cluster.ProbeTenant): true}
	for k := range internal {
		if strings.HasPrefix(k, prefix+cluster.TenantSpace+"{") {
			t.Errorf("internal key %q is in the tenants' namespace", k)
		}
	}
	for _, tenant := range append(internalNames(prefix), "upstream", "reserve\x00vip", "\x01probe") {
		k := r.Key(tenant)
		if internal[k] || !strings.HasPrefix(k, prefix+cluster.TenantSpace+"{") {
			t.Errorf("tenant %q: key %q is not in the tenants' namespace", tenant, k)
		}
	}
	if got, want := hashTag(cluster.PoolKey(prefix)+":up"), hashTag(cluster.PoolKey(prefix)); got != want || want != "slots" {
		t.Errorf("the pool's keys are tagged %q and %q, want both slots", want, got)
	}
}

// hashTag is the part of key Redis Cluster hashes: what the first '{'
// and the next '}' enclose, when not empty; else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}
