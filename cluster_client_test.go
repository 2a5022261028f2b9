package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
	"github.com/caddy-fair-queue/caddy-fair-queue/shares"
	"github.com/caddy-fair-queue/caddy-fair-queue/slots"
)

// The cluster block takes one Redis, a primary behind Sentinel (URL or
// block) or a Redis Cluster's seed nodes, each made a client of its kind
// with the options every call relies on; mixed or incomplete settings are
// refused with what to write.
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

	var o redis.UniversalOptions
	if err := parseSentinelURL("redis-sentinel://u:p%40ss@s1:26379,s2:26379/mymaster/3", &o); err != nil {
		t.Fatal(err)
	}
	if o.MasterName != "mymaster" || o.DB != 3 || o.Username != "u" || o.Password != "p@ss" || o.SentinelPassword != "p@ss" ||
		strings.Join(o.Addrs, ",") != "s1:26379,s2:26379" {
		t.Errorf("redis-sentinel URL read as %+v", o)
	}
	for _, c := range []struct {
		cfg  ClusterConfig
		kind string // the client's type, or the error's text
	}{
		{ClusterConfig{Redis: "redis://127.0.0.1:1"}, "*redis.Client"},
		{ClusterConfig{Redis: "redis-sentinel://127.0.0.1:1/m"}, "*redis.Client"}, // a failover client is a *Client
		{ClusterConfig{ClusterAddrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.ClusterClient"},
		{ClusterConfig{ClusterAddrs: []string{"127.0.0.1:1"}}, "*redis.ClusterClient"},
		{ClusterConfig{}, "missing redis <url>, sentinel or cluster_addrs"},
		{ClusterConfig{Redis: "redis-sentinel://127.0.0.1:1"}, "no master name"},
		{ClusterConfig{Redis: "redis-sentinel://127.0.0.1:1/m", ClusterAddrs: []string{"a:1"}}, "not both"},
		{ClusterConfig{Sentinel: &SentinelConfig{Master: "m", Addrs: []string{"a:1"}}, ClusterAddrs: []string{"a:1"}}, "give one"},
		{ClusterConfig{Redis: "redis://h:1/2", ClusterAddrs: []string{"a:1"}}, "database 0 only"},
		{ClusterConfig{ClusterAddrs: []string{"nowhere"}}, `"nowhere" is not a host:port`},
		{ClusterConfig{Redis: "http://secret@x"}, "not a redis://, rediss:// or redis-sentinel:// URL"},
	} {
		cl, err := newClusterClient(&c.cfg, 50*time.Millisecond)
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			got = fmt.Sprintf("%T", cl)
			cl.Close()
		}
		if !strings.Contains(got, c.kind) {
			t.Errorf("%+v: %s, want %s", c.cfg, got, c.kind)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("%+v: the error shows the URL's secret: %s", c.cfg, got)
		}
	}
}

// slotProbe records every command's keys.
type slotProbe struct{ cmds [][]string }

func (p *slotProbe) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *slotProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.cmds = append(p.cmds, keysOf(cmd))
		return next(ctx, cmd)
	}
}
func (p *slotProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			p.cmds = append(p.cmds, keysOf(c))
		}
		return next(ctx, cmds)
	}
}

// keysOf is a command's name and the keys it names: a script call's
// KEYS, or the first argument of the single-key commands the cluster
// sends; a channel is no key.
func keysOf(cmd redis.Cmder) []string {
	args := cmd.Args()
	name := strings.ToLower(fmt.Sprint(args[0]))
	out := []string{name}
	switch name {
	case "eval", "evalsha", "evalsha_ro", "eval_ro":
		n, _ := strconv.Atoi(fmt.Sprint(args[2]))
		for _, k := range args[3 : 3+n] {
			out = append(out, fmt.Sprint(k))
		}
	case "publish", "script", "subscribe", "ping", "hello":
	default:
		if len(args) > 1 {
			out = append(out, fmt.Sprint(args[1]))
		}
	}
	return out
}

// luaCall finds each redis.call in a script and its first argument after
// the command's name.
var luaCall = regexp.MustCompile(`redis\.call\('([A-Z]+)'(?:,\s*([A-Za-z_\[\]0-9]+))?`)

// TestClusterScriptsTouchOneSlot: every script and command the cluster
// sends touches the keys of one Redis Cluster hash slot: the scripts touch
// only the keys they are given (never one they build), each call's keys
// share a hash tag, and so does every other command's. A script that
// touched two slots would fail on a Redis Cluster (CROSSSLOT).
func TestClusterScriptsTouchOneSlot(t *testing.T) {
	for name, src := range map[string]string{"quota/redis.lua": mustRead(t, "quota/redis.lua"), "slots/sync.lua": mustRead(t, "slots/sync.lua")} {
		for _, m := range luaCall.FindAllStringSubmatch(src, -1) {
			switch cmd, arg := m[1], m[2]; {
			case cmd == "TIME":
			case cmd == "PUBLISH" && arg == "channel":
			case arg == "key" || arg == "upkey" || strings.HasPrefix(arg, "KEYS["):
			default:
				t.Errorf("%s: redis.call('%s', %s): not a key the script is given", name, cmd, arg)
			}
		}
	}
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	probe := &slotProbe{}
	c.AddHook(probe)
	ctx := context.Background()
	prefix := "fq:quota:default:"
	r := quota.NewRedis(c, quota.RedisOptions{Prefix: prefix})
	l := quota.MustCompile(quota.Config{QPS: 10, TokensPerMin: 6000})
	for _, tenant := range []string{"acme", "\x00upstream", "a{b}c", "}{"} {
		_, _ = r.Peek(ctx, tenant, l, quota.Backlog{Requests: 1})
		_, _ = r.Charge(ctx, tenant, l, 10)
		_, _ = r.Reconcile(ctx, tenant, l, 10, 5)
		_, _ = r.Refund(ctx, tenant, l, 5)
		_, _ = r.Status(ctx, tenant, l)
	}
	b := slots.NewBroker(c, poolKey(prefix), time.Minute)
	if _, err := b.Sync(ctx, slots.Renewal{Instance: "gw", Slots: 8, Demand: 3, Holding: 1, Weight: 1,
		Loads: []slots.Load{{Upstream: "u1:1", Inflight: 1, Slots: 4}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "gw"); err != nil {
		t.Fatal(err)
	}
	x := shares.New(c, sharesKey(prefix), "gw", time.Minute)
	for range 2 {
		if _, err := x.Swap(ctx, []shares.Served{{Tenant: "a", Cost: 1}, {Group: true, Cost: 2}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	scripts := 0
	for _, cmd := range probe.cmds {
		if cmd[0] == "evalsha" || cmd[0] == "eval" {
			scripts++
		}
		if len(cmd) < 3 {
			continue
		}
		want := c.ClusterKeySlot(ctx, cmd[1]).Val()
		for _, k := range cmd[2:] {
			if got := c.ClusterKeySlot(ctx, k).Val(); got != want {
				t.Errorf("%s touches %q (slot %d) and %q (slot %d)", cmd[0], cmd[1], want, k, got)
			}
		}
	}
	if scripts < 21 {
		t.Errorf("%d script calls seen, want every operation's (21)", scripts)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
