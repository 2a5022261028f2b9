package caddyfairqueue

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/cluster"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// ClusterConfig makes a queue's tenant quotas cluster-wide: every gateway
// whose fair_queue of the same name names the same Redis keeps its
// tenants' quota meters there, so N gateways behind a load balancer hold a
// tenant to its quota, not N times it. With ShareSlots the upstreams'
// slots are shared too, and with ShareFairness the tenants' virtual time.
//
// Redis down or slow never fails a request: each gateway then decides
// alone on 1/instances of every quota, logs the outage once, reports it
// (caddy_fair_queue_cluster_redis_up 0), and goes back to Redis when it
// answers again.
type ClusterConfig struct {
	// Redis is the URL of the Redis server the gateways share:
	// redis://[[user]:password@]host:port[/db], or rediss:// for TLS; or
	// of the sentinels that know its primary:
	// redis-sentinel://[[user]:password@]host:port[,host:port...]/master[/db].
	// With Sentinel or ClusterAddrs it gives only the credentials, the
	// database and TLS. Placeholders are resolved when the config loads,
	// so credentials can stay out of it: {env.REDIS_URL}. Required unless
	// Sentinel or ClusterAddrs is set.
	Redis string `json:"redis,omitempty"`
	// Sentinel finds the primary through Redis Sentinel, so that a
	// failover to a replica is followed: the master's name and the
	// sentinels' addresses.
	Sentinel *cluster.SentinelConfig `json:"sentinel,omitempty"`
	// ClusterAddrs are seed nodes of a Redis Cluster (or a Valkey
	// cluster): the client finds the rest, and follows a failover. Every
	// key a script touches shares its hash tag, so each call is on one
	// node.
	ClusterAddrs []string `json:"cluster_addrs,omitempty"`
	// Instances is the number of gateways sharing Redis. While Redis is
	// unreachable each decides alone on every quota divided by it, so
	// that together they admit about the quota when the load balancer
	// spreads a tenant evenly. Default: 1 (each keeps the whole quota).
	Instances int `json:"instances,omitempty"`
	// Timeout bounds each read and write of a Redis command. A command
	// past it is decided locally and starts an outage, during which a
	// background probe retries every second. Dial and handshake have their
	// own budget, max(4 x timeout, 1s). Default: 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Prefix starts the Redis key of every tenant's meters. Default:
	// "fq:quota:<queue name>:", so queues of different names keep apart
	// on one Redis. It must not contain '{' (the tenant's name, in braces
	// after it, is the key's Redis Cluster hash tag).
	Prefix string `json:"prefix,omitempty"`
	// ShareSlots shares the upstreams' slots (max_inflight x healthy
	// upstreams, the same pool every gateway sees) among the gateways, so
	// that together they never have more requests in flight on it than
	// its slots: each holds a grant, its fair share of the pool by demand,
	// renewed every Sync (package cluster). Redis down: each takes the pool
	// divided by Instances.
	ShareSlots bool `json:"share_slots,omitempty"`
	// Sync is how often a gateway renews its grant of the shared slots
	// and exchanges its tenants' service (share_fairness). Default: 100ms.
	Sync caddy.Duration `json:"sync,omitempty"`
	// LeaseTTL is how long a grant lives without renewal: a gateway that
	// crashed gives its slots back within it. The stream of shared
	// service expires when no gateway wrote to it for as long. Default: 30s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// ShareFairness shares the tenants' virtual time among the gateways
	// (one Redis stream, exchanged every Sync), so a tenant sending
	// through several gateways gets its weight's share of the cluster,
	// not of each gateway (docs/cluster.md). Redis down: each gateway is
	// fair on its own.
	ShareFairness bool `json:"share_fairness,omitempty"`
}

// defaultClusterTimeout is ClusterConfig.Timeout's default: a Redis on
// the same network answers in about a millisecond.
const defaultClusterTimeout = 50 * time.Millisecond

// clusterStore is a handler's connection to its cluster's Redis and the
// quota store over it. The handler owns it: the queue uses it while the
// handler's config is in force, and the handler closes it at Cleanup, once
// the queue runs on the next config (or is gone).
type clusterStore struct {
	client redis.UniversalClient
	store  *quota.Local
	// account keeps the provider account's meters (upstream_quota, its
	// reservations, the fallback's account), nil without one: decided in
	// memory under the queue's lock, synced with Redis off it
	// (cluster_account.go).
	account *quota.Mirror
	// accountKey is account's key in accounts.
	accountKey string
	closed     atomic.Bool
	// broker shares the upstream slots (share_slots), nil otherwise;
	// instances, sync and ttl are the config's.
	broker *cluster.Broker
	// moves is the subscription to the pool's announcements (made at the
	// first sync, closed with the client).
	moves     *cluster.Moves
	movesOnce sync.Once
	// sharesKey is the stream of served cost (share_fairness), "" without;
	// shares is this gateway's end of it, made at the first sync (it is
	// named after the queue's instance) and used by one sync at a time.
	sharesKey string
	shares    *cluster.Exchange
	ttl       time.Duration
	instances int
	sync      time.Duration
	// budget bounds a whole call (cluster.CallBudget).
	budget time.Duration
}

// clusterSettings are a ClusterConfig's values, defaults filled in.
type clusterSettings struct {
	timeout, sync, ttl time.Duration
	prefix             string
}

// settings validates the cluster block of the queue named queue and fills
// in its defaults.
func (c *ClusterConfig) settings(queue string) (clusterSettings, error) {
	s := clusterSettings{timeout: cmp.Or(time.Duration(c.Timeout), defaultClusterTimeout), sync: time.Duration(c.Sync),
		ttl: time.Duration(c.LeaseTTL), prefix: cmp.Or(c.Prefix, cluster.DefaultPrefix+queue+":")}
	switch {
	case c.Instances < 0:
		return s, fmt.Errorf("cluster: instances must not be negative, got %d", c.Instances)
	case s.timeout < 0:
		return s, fmt.Errorf("cluster: timeout must not be negative, got %v", s.timeout)
	case strings.Contains(c.Prefix, "{"):
		return s, fmt.Errorf("cluster: prefix %q contains '{': the tenant's name in braces is the key's hash tag", c.Prefix)
	}
	if s.sync <= 0 {
		s.sync = defaultSlotSync
	}
	if s.ttl <= 0 {
		s.ttl = defaultLeaseTTL
	}
	switch {
	case strings.Contains(s.prefix, "{"):
		return s, fmt.Errorf("cluster: the queue's name %q contains '{', which the default key prefix cannot hold; set prefix", queue)
	case c.ShareSlots && c.Instances == 0:
		return s, fmt.Errorf("cluster: share_slots needs instances: while Redis is unreachable, a gateway takes the pool divided by it")
	case c.ShareSlots && s.ttl < 3*s.sync+s.timeout:
		return s, fmt.Errorf("cluster: lease_ttl %v must be at least 3 x sync + timeout (%v): a grant that expires between renewals is not counted and the pool would be oversubscribed", s.ttl, 3*s.sync+s.timeout)
	}
	return s, nil
}

// provisionCluster validates the cluster block, connects a Redis client
// (lazily: no connection is made until the first call) and sets the
// queue's quota store to the Local over it. It touches no shared state:
// a config that fails later only leaves a client for Cleanup to close.
func (h *Handler) provisionCluster() error {
	c := h.Cluster
	if c == nil {
		return nil
	}
	s, err := c.settings(h.Name)
	if err != nil {
		return err
	}
	client, err := cluster.NewClient(c.Redis, c.Sentinel, c.ClusterAddrs, s.timeout, clusterRedisSeconds.WithLabelValues(h.Name))
	if err != nil {
		return err
	}
	cs := &clusterStore{client: client, instances: c.Instances, budget: cluster.CallBudget(s.timeout),
		sync: s.sync, ttl: s.ttl}
	rs := h.clusterQuota(cs, s.prefix)
	if c.ShareFairness {
		cs.sharesKey = cluster.SharesKey(s.prefix)
	}
	if c.ShareSlots {
		cs.broker = cluster.NewBroker(client, cluster.PoolKey(s.prefix), cs.ttl)
	}
	h.cluster = cs
	h.qcfg.QuotaStore = cs.store
	if h.qcfg.UpstreamQuota != nil || h.qcfg.Fallback != nil && h.qcfg.Fallback.UpstreamQuota != nil {
		if err := h.clusterAccount(cs, rs); err != nil {
			client.Close()
			return err
		}
	}
	return nil
}

// clusterQuota sets cs.store, the tenant quotas decided on Redis (rs) and
// locally while it is unreachable, logging each outage once.
func (h *Handler) clusterQuota(cs *clusterStore, prefix string) (rs *cluster.QuotaStore) {
	logger := h.logger.Named("cluster")
	queue, instances := h.Name, cs.instances
	rs, store, err := cluster.NewQuota(cs.client, prefix, cs.budget, quota.LocalOptions{
		Instances: instances,
		OnChange: func(degraded bool, err error) {
			if cs.closed.Load() {
				return // errors of a closed client are no outage
			}
			if degraded {
				logger.Warn("redis unreachable: deciding tenant quotas locally, on 1/instances of each, until it answers",
					zap.String("queue", queue), zap.Int("instances", max(instances, 1)), zap.Error(err))
			} else {
				logger.Info("redis answers again: tenant quotas are cluster-wide again", zap.String("queue", queue))
			}
		},
		OnLocal: clusterFallbacks.WithLabelValues(h.Name).Inc,
	})
	if err != nil {
		logger.Debug("loading the quota script", zap.String("queue", queue), zap.Error(err))
	}
	cs.store = store
	return rs
}

// clusterAccount sets the provider account's store: drawn on under the
// queue's lock at every dispatch, it is decided in memory on this
// gateway's share and synced with Redis (rs) off the lock (syncAccount).
// The mirror outlives the config (accounts): a reload keeps what this
// gateway drew, and its new client takes over the syncs.
func (h *Handler) clusterAccount(cs *clusterStore, rs *cluster.QuotaStore) error {
	cs.accountKey = accountKey(h.Name, cs.instances)
	val, loaded, err := accounts.LoadOrNew(cs.accountKey, func() (caddy.Destructor, error) {
		return accountMirror{quota.NewMirror(rs, quota.MirrorOptions{Instances: cs.instances})}, nil
	})
	if err != nil {
		return err
	}
	cs.account = val.(accountMirror).Mirror
	if loaded {
		cs.account.SetShared(rs)
	}
	h.qcfg.AccountStore = cs.account
	return nil
}

// guardBackground, deferred first in each of the cluster's background
// goroutines, logs a panic with its stack rather than letting it end
// Caddy, then runs after, if any.
func guardBackground(logger *zap.Logger, what, queue string, after func()) {
	if err := recover(); err != nil {
		logger.Named("cluster").Error("panic in "+what,
			zap.String("queue", queue), zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		if after != nil {
			after()
		}
	}
}

// closeCluster closes the handler's Redis client, once. It runs at
// Cleanup, after the handler left its queue: the queue then runs on the
// next config's store, or is gone.
func (h *Handler) closeCluster() {
	cs := h.cluster
	if cs == nil || !cs.closed.CompareAndSwap(false, true) {
		return
	}
	if cs.account != nil && cs.account.Pending() {
		// The draws since the last sync go to Redis before the client
		// closes (a reload's next config starts a mirror of its own,
		// which reads them back at its first sync). One sync, bounded.
		cs.syncAccount(h.Name, false)
	}
	if cs.account != nil {
		_, _ = accounts.Delete(cs.accountKey)
	}
	// The once is spent here if no sync made the subscription: none can
	// be made on a closing client.
	cs.movesOnce.Do(func() {})
	if cs.moves != nil {
		if err := cs.moves.Close(); err != nil {
			h.logger.Debug("closing the cluster's subscription", zap.Error(err))
		}
	}
	closeClient := func() {
		if err := cs.client.Close(); err != nil {
			h.logger.Debug("closing the cluster's redis client", zap.Error(err))
		}
	}
	if s := h.gone; s != nil && cs.broker != nil {
		// The queue is gone with this config: give its slots back once its
		// last requests are done, rather than after the lease's TTL.
		release := func() {
			defer guardBackground(h.logger, "the release of the shared slots", s.name, closeClient)
			s.releaseSlots(h)
			closeClient()
		}
		if s.q.Stats(false).Inflight == 0 {
			// Nothing left to finish: release now, bounded by the timeout,
			// so the process cannot exit before the release is sent.
			release()
		} else {
			go release()
		}
		return
	}
	closeClient()
}

var (
	clusterFallbacks = counterVec("cluster_fallback_total",
		"Quota decisions (admission, dispatch, completion, status) made on the gateway's own share because the cluster's Redis was unreachable or slow.",
		"queue")
	clusterShared = counterVec("cluster_shared_entries_total",
		"With share_fairness: entries of the tenants' service (one tenant's cost in one sync interval) this gateway sent to the other gateways (direction=sent), read from theirs (received), and charged to a tenant with requests queued here (applied).",
		"queue", "direction")
	clusterSlotMoves = counterVec("cluster_slot_moves_total",
		"With share_slots: announcements between the gateways sharing the pool, which make them renew their grants at once rather than at the next sync: kind=claim (a gateway's backlogged weight grew, so the others' shares fell) or freed (a gateway gave slots back, which one owed slots may take); direction=sent or received.",
		"queue", "kind", "direction")
	clusterRedisSeconds = histogramVec("cluster_redis_seconds",
		"How long each of the gateway's Redis commands took (a script call, or a pipeline), errors included: a Redis growing slow shows here before it passes the cluster's timeout and counts as down.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}, "queue")
	clusterShareFailures = counterVec("cluster_share_failures_total",
		"With share_fairness: syncs of the tenants' service with the cluster's Redis that failed (Redis unreachable or slow); their service is not shared, and each gateway is fair on its own until Redis answers.",
		"queue")
	descClusterRedisUp = prometheus.NewDesc(fqName("cluster_redis_up"),
		"1 while the queue's tenant quotas are decided in the cluster's Redis, 0 while Redis is unreachable and they are decided locally on 1/instances of each.", []string{"queue"}, nil)
	descClusterSlotGrant = prometheus.NewDesc(fqName("cluster_slot_grant"),
		"With share_slots: the upstream slots this gateway's queue holds from the pool shared through Redis (its grant, renewed every sync; 0 before the first grant, pool/instances while Redis is unreachable). Summed over the gateways it never exceeds the pool.", []string{"queue"}, nil)
)

// collectCluster reports at scrape time whether a clustered queue decides
// in Redis, and its grant of the shared slots.
func collectCluster(ch chan<- prometheus.Metric, s *sharedQueue) {
	h := s.owner()
	if h == nil || h.cluster == nil {
		return
	}
	up := 1.0
	if h.cluster.store.Degraded() {
		up = 0
	}
	gauge(ch, descClusterRedisUp, up, s.name)
	if g := s.slotGrant.Load(); g >= 0 && h.cluster.broker != nil {
		gauge(ch, descClusterSlotGrant, float64(g), s.name)
	}
}

// sentinel parses the cluster's sentinel block.
//
//	sentinel {
//	    master <name>
//	    addrs  <host:port>...
//	}
func (p *cfParser) sentinel() (*cluster.SentinelConfig, error) {
	d := p.d
	if args := d.RemainingArgs(); len(args) > 0 {
		return nil, d.Errf("cluster: sentinel: unexpected argument %q (the settings go in a block: sentinel { master <name>; addrs <host:port>... })", args[0])
	}
	sc := new(cluster.SentinelConfig)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch key := d.Val(); key {
		case "master":
			v, err := p.oneArg("cluster: sentinel: master")
			if err != nil {
				return nil, err
			}
			sc.Master = v
		case "addrs":
			sc.Addrs = append(sc.Addrs, d.RemainingArgs()...)
		default:
			return nil, d.Errf("cluster: sentinel: unknown setting %q (want master or addrs)", key)
		}
	}
	if sc.Master == "" || len(sc.Addrs) == 0 {
		return nil, d.Errf("cluster: sentinel: want master <name> and addrs <host:port>...")
	}
	return sc, nil
}

// cluster parses the cluster block: one setting per line.
//
//	cluster {
//	    redis     <url>        # redis://, rediss:// or redis-sentinel://; placeholders allowed: {env.REDIS_URL}
//	    sentinel {             # or: the primary through Redis Sentinel
//	        master <name>
//	        addrs  <host:port>...
//	    }
//	    cluster_addrs <host:port>...  # or: a Redis Cluster's seed nodes
//	    instances <n>          # default 1
//	    timeout   <duration>   # per command's read and write; default 50ms
//	    prefix    <string>     # default fq:quota:<queue name>:
//	    share_slots            # share the upstreams' slots among the gateways
//	    sync      <duration>   # how often a grant of slots is renewed; default 100ms
//	    lease_ttl <duration>   # a grant lives this long unrenewed; default 30s
//	    share_fairness         # share the tenants' virtual time among the gateways
//	}
func (p *cfParser) cluster() error {
	d := p.d
	if args := d.RemainingArgs(); len(args) > 0 {
		return d.Errf("cluster: unexpected argument %q (the settings go in a block: cluster { redis <url> })", args[0])
	}
	c := new(ClusterConfig)
	if err := p.block("cluster", func(key string) error { return p.clusterSetting(c, key) }); err != nil {
		return err
	}
	if c.Redis == "" && c.Sentinel == nil && len(c.ClusterAddrs) == 0 {
		return d.Errf("cluster: missing 'redis <url>' (e.g. redis {env.REDIS_URL}), sentinel or cluster_addrs")
	}
	p.h.Cluster = c
	return nil
}

// clusterSetting parses one line of the cluster block.
func (p *cfParser) clusterSetting(c *ClusterConfig, key string) error {
	d := p.d
	var err error
	switch key {
	case "redis":
		c.Redis, err = p.oneArg("cluster: redis")
	case "instances":
		err = posArg(p, "cluster: instances", &c.Instances)
	case "timeout":
		c.Timeout, err = p.durationArg("cluster: timeout")
	case "sync":
		c.Sync, err = p.durationArg("cluster: sync")
	case "lease_ttl":
		c.LeaseTTL, err = p.durationArg("cluster: lease_ttl")
	case "share_slots", "share_fairness":
		if d.NextArg() {
			return d.Errf("cluster: %s takes no argument", key)
		}
		if key == "share_slots" {
			c.ShareSlots = true
		} else {
			c.ShareFairness = true
		}
	case "sentinel":
		c.Sentinel, err = p.sentinel()
	case "cluster_addrs":
		c.ClusterAddrs = d.RemainingArgs()
		if len(c.ClusterAddrs) == 0 {
			return d.Errf("cluster: cluster_addrs: want one or more host:port seed nodes of the Redis Cluster")
		}
	case "prefix":
		c.Prefix, err = p.oneArg("cluster: prefix")
		if err == nil && strings.Contains(c.Prefix, "{") {
			err = d.Errf("cluster: prefix %q contains '{' (the tenant's name in braces is the key's hash tag)", c.Prefix)
		}
	default:
		return d.Errf("cluster: unknown setting %q (want redis, sentinel, cluster_addrs, instances, timeout, prefix, share_slots, share_fairness, sync or lease_ttl)", key)
	}
	return err
}

// durationArg reads the line's one argument as a duration.
func (p *cfParser) durationArg(what string) (caddy.Duration, error) {
	v, err := p.oneArg(what)
	if err != nil {
		return 0, err
	}
	return p.duration(what, v)
}
