package caddyfairqueue

import (
	"cmp"
	"errors"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// unknownTenantLabel is the one metrics label all undeclared tenants
// share, so a client inventing tenant names cannot explode cardinality.
const unknownTenantLabel = "_unknown"

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "fair_queue"
)

// Collectors are package-level: Caddy makes a new registry per config load,
// and each Provision registers the same collectors into it.
var (
	requestsTotal = counterVec("requests_total",
		"Requests handled, by tenant and outcome (served, or the error code answered).",
		"queue", "tenant", "outcome")
	waitSeconds = histogramVec("wait_seconds",
		"Time served requests waited in the queue before dispatch.",
		[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300}, "queue", "tenant")
	estimatedTokens = counterVec("estimated_tokens_total",
		"Estimated cost (prompt tokens + output cap) of dispatched requests.",
		"queue", "tenant")
	actualTokens = counterVec("actual_tokens_total",
		"Actual tokens (prompt + completion) reported or counted for completed requests.",
		"queue", "tenant")
	boostsTotal = counterVec("boosts_total",
		"Requests dispatched ahead of tag order to meet their wait budget.",
		"queue", "tenant")
	etaRatio = histogramVec("eta_ratio",
		"Predicted wait / actual wait of queued requests that were dispatched (1 = exact).",
		[]float64{0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4}, "queue", "tenant")
	budgetRefusals = counterVec("budget_refusals_total",
		"Requests answered wait_budget_exceeded, by moment: at_admission, or while_queued (admitted, then refused once their ETA showed they could not start in time).",
		"queue", "tenant", "moment")
	budgetLeftRatio = histogramVec("budget_left_ratio",
		"Fraction of its wait budget a request had left when refused with wait_budget_exceeded (1 at admission): how early the caller was told.",
		[]float64{0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99, 1}, "queue", "moment")
	quotaLimited = counterVec("quota_limited_total",
		"Requests a tenant's quota limited, by meter (qps, tokens, joint) and action: delayed (queued until the quota allowed it) or refused (429 quota_exceeded).",
		"queue", "tenant", "reason", "action")
	quotaCharged = counterVec("quota_charged_total",
		"Units charged to tenants' quotas, corrected to actual usage, by meter: requests (qps), tokens, request-equivalents (joint). rate()*60 over quota_limit is the tenant's occupancy.",
		"queue", "tenant", "meter")
	queueCollector = &stateCollector{}
	// The provider account's syncs with the cluster's Redis
	// (cluster_account.go).
	clusterAccountSyncSeconds = histogramVec("cluster_account_sync_seconds",
		"With upstream_quota (or a fallback's) and a cluster: how long each sync of the provider account with Redis took (this gateway's draws pushed, the shared meters read back), errors included. The account is decided in memory on 1/instances of it; only the sync waits on Redis, off the queue's lock.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "queue")
	clusterAccountSyncErrors = counterVec("cluster_account_sync_errors_total",
		"With upstream_quota (or a fallback's) and a cluster: syncs of the provider account with Redis that failed (unreachable or past the timeout). Their draws are not pushed; each gateway goes on deciding on its 1/instances of the account.",
		"queue")
)

// counterVec and histogramVec make the vectors named
// caddy_fair_queue_<name>.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help}, labels)
}

func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help, Buckets: buckets}, labels)
}

// gauge sends a gauge's value at scrape time.
func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

var collectors = []prometheus.Collector{requestsTotal, waitSeconds, estimatedTokens, actualTokens,
	boostsTotal, etaRatio, budgetRefusals, budgetLeftRatio, degradeTransitions, quotaLimited, quotaCharged,
	circuitTransitions, providerRefusals, fallbacks, usageClamped, queueCollector, clusterFallbacks, clusterShared, clusterShareFailures, clusterSlotMoves, clusterRedisSeconds,
	clusterAccountSyncSeconds, clusterAccountSyncErrors}

// registerMetrics adds the collectors to a config's registry; registering
// into a registry that already has them (two handlers, one config) is fine.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// metricsCache holds one handler's metric children per tenant label
// (bounded: declared tenants and unknownTenantLabel), so that a served
// request updates its series without hashing its labels into every
// vector. Nothing deletes the collectors' children, so a cached child
// stays the one a scrape reads.
type metricsCache struct {
	queue string
	m     sync.Map // label -> *tenantMetrics; written once, then only read
}

// of returns label's children.
func (c *metricsCache) of(label string) *tenantMetrics {
	if t, ok := c.m.Load(label); ok {
		return t.(*tenantMetrics)
	}
	t, _ := c.m.LoadOrStore(label, &tenantMetrics{queue: c.queue, label: label})
	return t.(*tenantMetrics)
}

// tenantMetrics are one (queue, tenant label)'s children in the vectors
// the served path updates, each made when first used, as WithLabelValues
// would make it.
type tenantMetrics struct {
	queue, label string

	servedOnce sync.Once
	served     prometheus.Counter  // requests_total{outcome="served"}
	wait       prometheus.Observer // wait_seconds
	estimated  prometheus.Counter  // estimated_tokens_total

	actualOnce sync.Once
	actual     prometheus.Counter // actual_tokens_total

	etaOnce sync.Once
	eta     prometheus.Observer // eta_ratio

	quotaOnce sync.Once
	charged   [3]prometheus.Counter // quota_charged_total, by quotaDims
}

// quotaDims are the quota's meters, in the order of tenantMetrics.charged.
var quotaDims = [3]quota.Dimension{quota.DimQPS, quota.DimTokens, quota.DimJoint}

// observeQuotaUse counts what a completed request used of its tenant's
// quota, in each meter's units, from its actual tokens.
func (t *tenantMetrics) observeQuotaUse(l *quota.Limits, tokens int64) {
	if l == nil {
		return
	}
	t.quotaOnce.Do(func() {
		for i, d := range quotaDims {
			t.charged[i] = quotaCharged.WithLabelValues(t.queue, t.label, string(d))
		}
	})
	c := l.Config()
	if c.QPS > 0 {
		t.charged[0].Inc()
	}
	if c.TokensPerMin > 0 {
		t.charged[1].Add(float64(tokens))
	}
	if l.Enabled(quota.DimJoint) {
		t.charged[2].Add(1 + float64(tokens)*c.TokenToQPSWeight)
	}
}

// observeOutcome counts a request's outcome and, for one proxied, its
// wait and estimated cost.
func (t *tenantMetrics) observeOutcome(outcome string, wait time.Duration, est float64) {
	if outcome != outcomeServed {
		requestsTotal.WithLabelValues(t.queue, t.label, outcome).Inc()
		if outcome == outcomeProxyError {
			waitSeconds.WithLabelValues(t.queue, t.label).Observe(wait.Seconds())
			estimatedTokens.WithLabelValues(t.queue, t.label).Add(est)
		}
		return
	}
	t.servedOnce.Do(func() {
		t.served = requestsTotal.WithLabelValues(t.queue, t.label, outcomeServed)
		t.wait = waitSeconds.WithLabelValues(t.queue, t.label)
		t.estimated = estimatedTokens.WithLabelValues(t.queue, t.label)
	})
	t.served.Inc()
	t.wait.Observe(wait.Seconds())
	t.estimated.Add(est)
}

// observeDispatch records what the wait-budget logic did for a request.
func (t *tenantMetrics) observeDispatch(boosted bool, eta, wait time.Duration) {
	if boosted {
		boostsTotal.WithLabelValues(t.queue, t.label).Inc()
	}
	if eta > 0 && wait > 0 {
		t.etaOnce.Do(func() { t.eta = etaRatio.WithLabelValues(t.queue, t.label) })
		t.eta.Observe(eta.Seconds() / wait.Seconds())
	}
}

func (t *tenantMetrics) observeActual(v float64) {
	t.actualOnce.Do(func() { t.actual = actualTokens.WithLabelValues(t.queue, t.label) })
	t.actual.Add(v)
}

// Moments of a wait_budget_exceeded refusal (label values).
const (
	momentAtAdmission = "at_admission"
	momentWhileQueued = "while_queued"
)

// observeRefusal records a wait-budget refusal: when it was made, and how
// much of the request's budget was left.
func observeRefusal(queue, tenant string, rej *fairqueue.Rejection) {
	if rej.Reason == fairqueue.ReasonQuotaExceeded {
		quotaLimited.WithLabelValues(queue, tenant, string(rej.Quota), "refused").Inc()
		return
	}
	if rej.Reason != fairqueue.ReasonBudgetExceeded {
		return
	}
	moment := momentAtAdmission
	if rej.WhileQueued {
		moment = momentWhileQueued
	}
	budgetRefusals.WithLabelValues(queue, tenant, moment).Inc()
	budgetLeftRatio.WithLabelValues(queue, moment).Observe(rej.BudgetLeft)
}

// fqName is a metric's full name: caddy_fair_queue_<name>.
func fqName(name string) string {
	return prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name)
}

// stateCollector reads queue state at scrape time, so the request path
// updates no gauges.
type stateCollector struct{}

var (
	descDepth = prometheus.NewDesc(fqName("queue_depth"),
		"Requests waiting, per tenant.", []string{"queue", "tenant"}, nil)
	descQueuedTokens = prometheus.NewDesc(fqName("queued_tokens"),
		"Estimated tokens waiting, per tenant.", []string{"queue", "tenant"}, nil)
	descInflight = prometheus.NewDesc(fqName("inflight"),
		"Requests dispatched and not yet complete, per tenant.", []string{"queue", "tenant"}, nil)
	descHealthy = prometheus.NewDesc(fqName("healthy_upstreams"),
		"Upstreams Caddy's health checks consider healthy.", []string{"queue"}, nil)
	descCapacity = prometheus.NewDesc(fqName("capacity"),
		"Dispatch slots: max_inflight x healthy upstreams.", []string{"queue"}, nil)
	descTokenCapacity = prometheus.NewDesc(fqName("token_capacity"),
		"In-flight token capacity (0 when unset).", []string{"queue"}, nil)
	descWater = prometheus.NewDesc(fqName("water_level"),
		"Queue fill level watched by the degrade ladder.", []string{"queue"}, nil)
	descBoosted = prometheus.NewDesc(fqName("boosted_inflight"),
		"Boosted requests in flight (bounded by boost_share_max of capacity).", []string{"queue"}, nil)
	descWeight = prometheus.NewDesc(fqName("tenant_weight"),
		"Configured weight of each declared tenant currently known to the queue.", []string{"queue", "tenant"}, nil)
	descQuotaLimit = prometheus.NewDesc(fqName("quota_limit"),
		"Each declared tenant's quota per minute, by meter: requests (qps), tokens, request-equivalents (joint).", []string{"queue", "tenant", "meter"}, nil)
	descTenantInfo = prometheus.NewDesc(fqName("tenant_info"),
		"1 for each declared tenant and for _unknown (the undeclared ones, default_tenant's settings), labelled with its tier (\"none\" without one) and class: join on (queue, tenant) to name a tenant's tier.", []string{"queue", "tenant", "tier", "class"}, nil)
	descQuotaWeight = prometheus.NewDesc(fqName("quota_token_weight"),
		"Each declared tenant's token_to_qps_weight in force: request-equivalents per token in its joint meter (learned with token_to_qps_weight auto).", []string{"queue", "tenant"}, nil)
	descQuotaDebt = prometheus.NewDesc(fqName("quota_debt_seconds"),
		"How far each declared tenant's quota meter runs ahead of its rate: 0 at rest, the burst window's tolerance when held; the x-ratelimit-reset time.", []string{"queue", "tenant", "meter"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDepth, descQueuedTokens, descInflight,
		descHealthy, descCapacity, descTokenCapacity, descWater, descBoosted, descDegradeLevel, descWeight,
		descQuotaLimit, descQuotaDebt, descQuotaWeight, descTenantInfo, descCircuitShed, descCircuitDemand, descCircuitCapacity,
		descCircuitSignal, descCircuitSaturation, descCircuitBacklogTrend, descUpstreamRemaining, descUpstreamWindow, descUpstreamProvider, descUpstreamExhausted, descCostModel, descCostModelR2,
		descClusterRedisUp, descClusterSlotGrant} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	queues.Range(func(key, value any) bool {
		s, ok := value.(*sharedQueue)
		if !ok {
			return true
		}
		st := s.q.Stats(true)
		name := s.name
		gauge(ch, descHealthy, float64(st.Healthy), name)
		gauge(ch, descCapacity, float64(st.Capacity), name)
		gauge(ch, descTokenCapacity, float64(st.TokenCapacity), name)
		gauge(ch, descWater, st.Water, name)
		gauge(ch, descBoosted, float64(st.BoostedInflight), name)
		gauge(ch, descDegradeLevel, float64(s.q.DegradeLevel()), name)
		collectCircuit(ch, name, s.q.Circuit())
		collectUpstream(ch, name, s.q.Upstream())
		collectCostModel(ch, name, s.cost.Fit())
		collectCluster(ch, s)
		for _, t := range st.Tenants {
			if t.Known {
				gauge(ch, descWeight, t.Weight, name, t.Name)
			}
		}
		for label, l := range loadByLabel(st.Tenants) {
			gauge(ch, descDepth, float64(l.queued), name, label)
			gauge(ch, descQueuedTokens, float64(l.queuedCost), name, label)
			gauge(ch, descInflight, float64(l.inflight), name, label)
		}
		qcfg := s.q.Config()
		gauge(ch, descTenantInfo, 1, name, unknownTenantLabel, cmp.Or(qcfg.Default.Tier, "none"), qcfg.Default.Class)
		for tenant, tc := range qcfg.Tenants {
			gauge(ch, descTenantInfo, 1, name, tenant, cmp.Or(tc.Tier, "none"), tc.Class)
			if tc.Quota == nil {
				continue
			}
			st, ok := s.q.QuotaStatus(tenant)
			if !ok {
				continue
			}
			if st.Joint.Enabled {
				gauge(ch, descQuotaWeight, tc.Quota.Config().TokenToQPSWeight, name, tenant)
			}
			for _, d := range quotaDims {
				if m := st.Meter(d); m.Enabled {
					gauge(ch, descQuotaLimit, float64(m.Limit), name, tenant, string(d))
					gauge(ch, descQuotaDebt, m.Reset.Seconds(), name, tenant, string(d))
				}
			}
		}
		return true
	})
}

// labelLoad is what the tenants of one metrics label hold now.
type labelLoad struct {
	queued, inflight int
	queuedCost       int64
}

// loadByLabel sums the tenants' load per metrics label, the undeclared
// ones under unknownTenantLabel.
func loadByLabel(tenants []fairqueue.TenantStats) map[string]*labelLoad {
	per := make(map[string]*labelLoad, len(tenants))
	for _, t := range tenants {
		label := t.Name
		if !t.Known {
			label = unknownTenantLabel
		}
		l := per[label]
		if l == nil {
			l = &labelLoad{}
			per[label] = l
		}
		l.queued += t.Queued
		l.inflight += t.Inflight
		l.queuedCost += t.QueuedCost
	}
	return per
}

// MetricNames lists the fully qualified names of every metric the plugin
// exports, from the collectors themselves, for documentation and tests (a
// series never observed is absent from a scrape).
func MetricNames() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// descName reads the name out of prometheus.Desc's String, its only
// exported view.
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Interface guards
var _ prometheus.Collector = (*stateCollector)(nil)

// observeQuotaDelay counts and records a request its quota made wait in
// its queue.
func (h *Handler) observeQuotaDelay(label string, tk *fairqueue.Ticket) {
	if tk.QuotaWait() > 0 {
		quotaLimited.WithLabelValues(h.Name, label, string(tk.QuotaReason()), "delayed").Inc()
		h.history().QuotaLimited(label, string(tk.QuotaReason()), false)
	}
}
