package cluster

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// clientConfig is what NewClient is given.
type clientConfig struct {
	Redis        string
	Sentinel     *SentinelConfig
	ClusterAddrs []string
}

// A redis-sentinel:// URL is read into the sentinels, the primary's name,
// its database and the credentials; each kind of Redis is made a client
// of its kind with the options every call relies on; mixed or incomplete
// settings are refused with what to write, and no error shows the URL's
// secret.
func TestClientKinds(t *testing.T) {
	var o redis.UniversalOptions
	if err := parseSentinelURL("redis-sentinel://u:p%40ss@s1:26379,s2:26379/mymaster/3", &o); err != nil {
		t.Fatal(err)
	}
	if o.MasterName != "mymaster" || o.DB != 3 || o.Username != "u" || o.Password != "p@ss" || o.SentinelPassword != "p@ss" ||
		strings.Join(o.Addrs, ",") != "s1:26379,s2:26379" {
		t.Errorf("redis-sentinel URL read as %+v", o)
	}
	for _, c := range []struct {
		cfg  clientConfig
		kind string // the client's type, or the error's text
	}{
		{clientConfig{Redis: "redis://127.0.0.1:1"}, "*redis.Client"},
		{clientConfig{Redis: "redis-sentinel://127.0.0.1:1/m"}, "*redis.Client"}, // a failover client is a *Client
		{clientConfig{ClusterAddrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.ClusterClient"},
		{clientConfig{ClusterAddrs: []string{"127.0.0.1:1"}}, "*redis.ClusterClient"},
		{clientConfig{}, "missing redis <url>, sentinel or cluster_addrs"},
		{clientConfig{Redis: "redis-sentinel://127.0.0.1:1"}, "no master name"},
		{clientConfig{Redis: "redis-sentinel://127.0.0.1:1/m", ClusterAddrs: []string{"a:1"}}, "not both"},
		{clientConfig{Sentinel: &SentinelConfig{Master: "m", Addrs: []string{"a:1"}}, ClusterAddrs: []string{"a:1"}}, "give one"},
		{clientConfig{Redis: "redis://h:1/2", ClusterAddrs: []string{"a:1"}}, "database 0 only"},
		{clientConfig{ClusterAddrs: []string{"nowhere"}}, `"nowhere" is not a host:port`},
		{clientConfig{Redis: "http://secret@x"}, "not a redis://, rediss:// or redis-sentinel:// URL"},
	} {
		cl, err := NewClient(c.cfg.Redis, c.cfg.Sentinel, c.cfg.ClusterAddrs, 50*time.Millisecond, nil)
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
	for name, src := range map[string]string{"quota.lua": mustRead(t, "quota.lua"), "sync.lua": mustRead(t, "sync.lua")} {
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
	r := NewQuotaStore(c, prefix, 0)
	l := quota.MustCompile(quota.Config{QPS: 10, TokensPerMin: 6000})
	for _, tenant := range []string{"acme", "\x00upstream", "a{b}c", "}{"} {
		_, _ = r.Peek(ctx, tenant, l, quota.Backlog{Requests: 1})
		_, _ = r.Charge(ctx, tenant, l, 10)
		_, _ = r.Reconcile(ctx, tenant, l, 10, 5)
		_, _ = r.Refund(ctx, tenant, l, 5)
		_, _ = r.Status(ctx, tenant, l)
	}
	b := NewBroker(c, PoolKey(prefix), time.Minute)
	if _, err := b.Sync(ctx, Renewal{Instance: "gw", Slots: 8, Demand: 3, Holding: 1, Weight: 1,
		Loads: []Load{{Upstream: "u1:1", Inflight: 1, Slots: 4}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "gw"); err != nil {
		t.Fatal(err)
	}
	x := NewExchange(c, SharesKey(prefix), "gw", time.Minute)
	for range 2 {
		if _, err := x.Swap(ctx, []fairqueue.Served{{Tenant: "a", Cost: 1}, {Group: true, Cost: 2}}, nil); err != nil {
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
