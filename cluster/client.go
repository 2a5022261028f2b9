package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// SentinelConfig finds the Redis primary through Redis Sentinel.
type SentinelConfig struct {
	// Master is the name the sentinels monitor the primary under.
	Master string `json:"master"`
	// Addrs are the sentinels' host:port addresses (placeholders allowed).
	Addrs []string `json:"addrs"`
}

// minIdleConns is how many idle connections the client keeps ready, so a
// call rarely pays for a connection's set-up (two round trips more).
const minIdleConns = 4

// NewClient makes the cluster's Redis client: one server (redis:// or
// rediss://), a primary found through Sentinel (redis-sentinel:// or
// sentinel), or a Redis Cluster (clusterAddrs), with placeholders
// replaced. It connects on first use; each command's time goes to observe.
func NewClient(url string, sentinel *SentinelConfig, clusterAddrs []string, timeout time.Duration, observe prometheus.Observer) (redis.UniversalClient, error) {
	repl := caddy.NewReplacer()
	raw := repl.ReplaceAll(url, "")
	if url != "" && raw == "" {
		return nil, fmt.Errorf("cluster: redis: no URL (%q is empty once its placeholders are replaced: is the variable set?)", url)
	}
	o, err := urlOptions(sentinel, clusterAddrs, raw)
	if err != nil {
		return nil, err
	}
	if err := kindOptions(sentinel, clusterAddrs, o, raw, repl); err != nil {
		return nil, err
	}
	for _, a := range o.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("cluster: %q is not a host:port address", a)
		}
	}
	clientOptions(o, timeout)
	routeRedisLog()
	client := redis.NewUniversalClient(o)
	if observe != nil {
		client.AddHook(redisTimer{observe})
	}
	return client, nil
}

// urlOptions reads the options the redis URL raw gives.
func urlOptions(sentinel *SentinelConfig, clusterAddrs []string, raw string) (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{}
	switch {
	case strings.HasPrefix(raw, "redis-sentinel://"):
		if sentinel != nil || len(clusterAddrs) > 0 {
			return nil, fmt.Errorf("cluster: a redis-sentinel:// URL names the sentinels itself: give it, or sentinel or cluster_addrs, not both")
		}
		if err := parseSentinelURL(raw, o); err != nil {
			return nil, err
		}
	case raw != "":
		opt, err := redis.ParseURL(raw)
		if err != nil {
			// The URL may carry a password: keep it out of the error.
			return nil, fmt.Errorf("cluster: redis: not a redis://, rediss:// or redis-sentinel:// URL: %v", redactURLError(err, raw))
		}
		o.Addrs, o.Username, o.Password, o.DB, o.TLSConfig = []string{opt.Addr}, opt.Username, opt.Password, opt.DB, opt.TLSConfig
	}
	return o, nil
}

// kindOptions sets the options of a sentinel block or cluster_addrs over
// what the URL gave, or checks that the URL names a server.
func kindOptions(sentinel *SentinelConfig, clusterAddrs []string, o *redis.UniversalOptions, raw string, repl *caddy.Replacer) error {
	switch {
	case sentinel != nil && len(clusterAddrs) > 0:
		return fmt.Errorf("cluster: sentinel and cluster_addrs name two kinds of Redis; give one")
	case sentinel != nil:
		if sentinel.Master == "" || len(sentinel.Addrs) == 0 {
			return fmt.Errorf("cluster: sentinel needs master <name> and addrs <host:port>...")
		}
		// The URL, if any, gives the credentials, database and TLS.
		o.MasterName, o.Addrs = sentinel.Master, nil
		for _, a := range sentinel.Addrs {
			o.Addrs = append(o.Addrs, repl.ReplaceAll(a, ""))
		}
		o.SentinelUsername, o.SentinelPassword = o.Username, o.Password
	case len(clusterAddrs) > 0:
		if o.DB != 0 {
			return fmt.Errorf("cluster: cluster_addrs: a Redis Cluster has database 0 only, the URL names %d", o.DB)
		}
		o.IsClusterMode, o.Addrs = true, nil
		for _, a := range clusterAddrs {
			o.Addrs = append(o.Addrs, repl.ReplaceAll(a, ""))
		}
	case raw == "":
		return fmt.Errorf("cluster: missing redis <url>, sentinel or cluster_addrs")
	}
	return nil
}

// parseSentinelURL reads
// redis-sentinel://[[user]:password@]host:port[,host:port...]/master[/db].
func parseSentinelURL(raw string, o *redis.UniversalOptions) error {
	rest := strings.TrimPrefix(raw, "redis-sentinel://")
	bad := func(why string) error {
		return fmt.Errorf("cluster: redis: %s (want redis-sentinel://[[user]:password@]host:port[,host:port...]/master[/db])", why)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		info, err := url.PathUnescape(hosts[:at])
		if err != nil {
			return bad("unreadable credentials")
		}
		user, pass, ok := strings.Cut(info, ":")
		if !ok {
			user, pass = "", info
		}
		o.Username, o.Password, o.SentinelUsername, o.SentinelPassword = user, pass, user, pass
		hosts = hosts[at+1:]
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return bad("an empty sentinel address")
		}
		o.Addrs = append(o.Addrs, h)
	}
	master, db, _ := strings.Cut(path, "/")
	if master == "" {
		return bad("no master name")
	}
	o.MasterName = master
	if db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return bad(fmt.Sprintf("database %q is not a number", db))
		}
		o.DB = n
	}
	return nil
}

// clientOptions sets the options every cluster call relies on: no retry
// (a retried Charge could charge twice); timeout bounds each socket read
// and write, so a slower Redis is an outage, decided locally; connections
// are kept warm, and a dial has a budget of its own (dialTimeout), so that
// timeout bounds a command, not a handshake.
func clientOptions(o *redis.UniversalOptions, timeout time.Duration) {
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = false
	o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout
	o.DialTimeout = dialTimeout(timeout)
	o.DialerRetries = 1
	o.MinIdleConns = minIdleConns
	o.ConnMaxIdleTime = -1 // kept: Redis does not close idle clients by default
	o.DisableIdentity = true
	// Pipelines on the main, warm pool: the pipeline pool never pre-dials.
	o.PipelinePoolSize = -1
}

// dialTimeout bounds a connection's set-up, which takes round trips of
// its own.
func dialTimeout(timeout time.Duration) time.Duration { return max(4*timeout, time.Second) }

// CallBudget bounds a whole call on a client of NewClient (context
// deadline): a dial and its handshake, then the command's write and read.
func CallBudget(timeout time.Duration) time.Duration { return dialTimeout(timeout) + 3*timeout }

// redisTimer is a go-redis hook that observes each command's time, and a
// pipeline's as one (cluster_redis_seconds).
type redisTimer struct{ o prometheus.Observer }

func (r redisTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r redisTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		defer r.since(time.Now())
		return next(ctx, cmd)
	}
}

func (r redisTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		defer r.since(time.Now())
		return next(ctx, cmds)
	}
}

func (r redisTimer) since(start time.Time) { r.o.Observe(time.Since(start).Seconds()) }

var _ redis.Hook = redisTimer{}

// redactURLError removes the URL, which may carry a password, from a
// parse error's text.
func redactURLError(err error, url string) error {
	return errors.New(strings.ReplaceAll(err.Error(), url, "<url>"))
}
