package caddyfairqueue

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is a fair queue in front of a reverse proxy to OpenAI-compatible
// model servers: it holds each request in its tenant's sub-queue until
// weighted fair queuing grants it a slot on a healthy upstream.
type Handler struct {
	// Name of the queue, which survives config reloads with everything
	// queued and in flight; use one handler per name. Default: "default".
	Name string `json:"name,omitempty"`

	// TenantKey is a placeholder that evaluates to the tenant of a request.
	// Default: {http.request.header.X-Tenant-ID}; {http.auth.user.id}
	// after an authentication handler is the secure choice.
	TenantKey string `json:"tenant_key,omitempty"`

	// CostUnit is what fairness is measured in: "estimated_tokens" (default:
	// prompt tokens plus output cap, corrected by actual usage),
	// "requests", or "learned" (model-server time, from the cost model the
	// queue learns; estimated_tokens until the fit is ready).
	CostUnit string `json:"cost_unit,omitempty"`

	// Tokenizer counts prompt tokens: "cl100k_base" (default), "o200k_base",
	// or "approx" (a fast byte heuristic). A long prompt's place in the
	// queue is estimated from samples; limits use the exact count.
	Tokenizer string `json:"tokenizer,omitempty"`

	// DefaultMaxTokens is the output cap assumed when a request names none.
	// Default: 512.
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`

	// MaxBody is the largest request body accepted, in bytes; larger bodies
	// get 413. Default: 8 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// BodyTimeout bounds the time to receive a whole request body (else
	// 408 request_timeout); the wait budget starts after it. Default: 30s.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// MaxRequestTokens caps one request's estimated cost (prompt tokens
	// plus output cap, times n); above it, 400 context_length_exceeded.
	// Default: 131072.
	MaxRequestTokens int64 `json:"max_request_tokens,omitempty"`

	// MaxInflight is the number of concurrent requests per healthy upstream.
	// Default: 16.
	MaxInflight int `json:"max_inflight,omitempty"`

	// MaxInflightTokens, when set, also caps the estimated tokens in flight
	// per healthy upstream (a model server's KV-cache budget).
	MaxInflightTokens int64 `json:"max_inflight_tokens,omitempty"`

	// MaxQueue caps the queued requests of all tenants (503 server_busy)
	// and is the denominator of the degrade ladder's water level. Default:
	// 10000.
	MaxQueue int `json:"max_queue,omitempty"`

	// MaxQueueTokens, when set, caps the queued estimated tokens as well.
	MaxQueueTokens int64 `json:"max_queue_tokens,omitempty"`

	// MaxQueueBytes caps the request bodies held by queued requests (503
	// server_busy). Default: 256 MiB.
	MaxQueueBytes int64 `json:"max_queue_bytes,omitempty"`

	// Classes of service and their wait budgets: realtime (5s), interactive
	// (15s) and batch (300s) always exist; entries here change their
	// budgets or add classes. A request may lower its class
	// (X-Fair-Queue-Class).
	Classes []*ClassConfig `json:"classes,omitempty"`

	// Tenants maps tenant names to their settings.
	Tenants map[string]*TenantConfig `json:"tenants,omitempty"`

	// DefaultTenant applies to tenants not listed in Tenants, as one group
	// (weight and max_queue of all of them together, one metrics label).
	// Default: weight 1, class batch, max_queue half of the queue's.
	DefaultTenant *TenantConfig `json:"default_tenant,omitempty"`

	// RejectUnknownTenants answers requests of unlisted tenants (and
	// requests with no tenant) with 403 unknown_tenant.
	RejectUnknownTenants bool `json:"reject_unknown_tenants,omitempty"`

	// HandleErrors hands the gateway's own refusals (429, 503, 413, ...) to
	// the site's handle_errors routes instead of answering them in the
	// OpenAI error shape; {http.fair_queue.error_code}, .error_message and
	// .retry_after say what happened.
	HandleErrors bool `json:"handle_errors,omitempty"`

	// QuotaDefaults is the shape of every tenant quota that does not set
	// its own (no rates: those belong to tenants).
	QuotaDefaults *QuotaConfig `json:"quota_defaults,omitempty"`

	// UpstreamQuota is the provider account's requests and tokens per
	// minute that dispatch is gated by (see UpstreamQuotaConfig).
	UpstreamQuota *UpstreamQuotaConfig `json:"upstream_quota,omitempty"`

	// Fallback is a second upstream pool the tenants it lists use when the
	// primary cannot serve them (see FallbackConfig).
	Fallback *FallbackConfig `json:"fallback,omitempty"`

	// CircuitBreak sheds tenants tier by tier, lowest first, while demand
	// stays above what the model servers serve (429 circuit_open).
	CircuitBreak *CircuitBreakConfig `json:"circuit_break,omitempty"`

	// AntiStarvation bounds the boost given to requests that would miss
	// their wait budget.
	AntiStarvation *AntiStarvation `json:"anti_starvation,omitempty"`

	// Degrade declares the ladder walked on queue water level.
	Degrade *DegradeConfig `json:"degrade,omitempty"`

	// Cluster shares the tenant quotas with the other gateways whose queue
	// of the same name uses the same Redis.
	Cluster *ClusterConfig `json:"cluster,omitempty"`

	// ProxyRaw is the reverse_proxy that serves dispatched requests; its
	// healthy upstreams set the capacity (dynamic upstreams count as one).
	// Default selection policy: least_conn.
	ProxyRaw json.RawMessage `json:"proxy,omitempty" caddy:"namespace=http.handlers inline_key=handler"`

	proxy  *reverseproxy.Handler
	shared *sharedQueue
	// placed is the shared queue's placements when the proxy selects with
	// ClusterLeastConn (nil otherwise): each request carries its place.
	placed    *placements
	counter   llmapi.Counter // exact: for limits, light mode and streamed usage
	estimator llmapi.Counter // bounded work: for the queue's order
	qcfg      fairqueue.Config
	logger    *zap.Logger
	usageLog  *zap.Logger // clampLogger(logger)
	ctx       caddy.Context
	events    *caddyevents.App
	classIdx  map[string]time.Duration
	// tenantHeader is the canonical name of the header tenant_key reads
	// when it is one request-header placeholder, else "" (see tenantOf).
	tenantHeader string
	metrics      *metricsCache
	left         bool         // Cleanup ran: no longer a user of its queue
	gone         *sharedQueue // the queue Cleanup removed as its last user
	// quotaAuto: some quota takes its token_to_qps_weight from the
	// learned cost model.
	quotaAuto bool
	// committed is set once this config is in force (sharedQueue.adopt);
	// a pointer, as Caddy copies the Handler value.
	committed *atomic.Bool
	// cluster is the Redis client and quota store of Cluster, which this
	// handler owns and closes at Cleanup.
	cluster *clusterStore
}

// ClassConfig declares a class of service.
type ClassConfig struct {
	// Name of the class.
	Name string `json:"name"`
	// WaitBudget is the longest a request of this class waits in the queue
	// before it is dispatched or told to retry.
	WaitBudget caddy.Duration `json:"wait_budget,omitempty"`
}

// TenantConfig is one tenant's settings.
type TenantConfig struct {
	// Weight is the tenant's share of capacity relative to the other
	// backlogged tenants. Default: 1.
	Weight float64 `json:"weight,omitempty"`
	// Class is the tenant's class of service. Default: batch.
	Class string `json:"class,omitempty"`
	// WaitBudget overrides the class's wait budget.
	WaitBudget caddy.Duration `json:"wait_budget,omitempty"`
	// MaxQueue caps this tenant's queued requests (429 tenant_queue_full);
	// for default_tenant, all unknown tenants' together.
	MaxQueue int `json:"max_queue,omitempty"`
	// MaxInflight caps this tenant's requests in flight; for
	// default_tenant, each unknown tenant's. 0: no cap.
	MaxInflight int `json:"max_inflight,omitempty"`
	// MaxRequestTokens overrides the queue's max_request_tokens.
	MaxRequestTokens int64 `json:"max_request_tokens,omitempty"`
	// Quota caps the tenant's requests and tokens per unit of time, even
	// when capacity is idle (429 quota_exceeded if the wait budget cannot
	// cover the wait). For default_tenant, per unknown tenant. Fields left
	// out come from quota_defaults.
	Quota *QuotaConfig `json:"quota,omitempty"`
	// Reserve is the share of upstream_quota only this tenant may draw
	// from, in (0, 1); beyond it, it competes for the rest by weight.
	Reserve float64 `json:"reserve,omitempty"`
	// Tier names the tenant's tier in circuit_break's order.
	Tier string `json:"tier,omitempty"`
}

// AntiStarvation configures the bounded boost.
type AntiStarvation struct {
	// BoostShareMax is the largest fraction of dispatch capacity that
	// boosted requests may hold at once. Default 0.10; 0 disables boosting.
	BoostShareMax *float64 `json:"boost_share_max,omitempty"`
	// PerTenantBoostHourly caps the boosts of one tenant in any rolling
	// hour. Default 200; 0 means no per-tenant cap.
	PerTenantBoostHourly *int `json:"per_tenant_boost_hourly,omitempty"`
	// FastFail refuses requests whose estimated dispatch time is beyond
	// their budget (503 wait_budget_exceeded), at admission and while
	// queued. Default true.
	FastFail *bool `json:"fast_fail,omitempty"`
	// ThroughputPrior is the rate, in cost units per second per healthy
	// upstream, assumed before the queue has measured its own.
	ThroughputPrior float64 `json:"throughput_prior,omitempty"`
}

// DegradeConfig is the declared degrade ladder.
type DegradeConfig struct {
	// Hold is the minimum time a step stays engaged or released before it
	// may change again, against flapping. Default: 5s.
	Hold caddy.Duration `json:"hold,omitempty"`
	// Steps, in order of rising trigger.
	Steps []*DegradeStep `json:"steps,omitempty"`
}

// DegradeStep is one rung of the ladder.
type DegradeStep struct {
	// Name of the step, e.g. L1.
	Name string `json:"name"`
	// Trigger: the step engages when water rises above this line.
	Trigger float64 `json:"trigger"`
	// Recover: the step releases when water falls below this line.
	Recover float64 `json:"recover"`
	// Action is pause, light_mode or throttle.
	Action string `json:"action"`
	// Class the action applies to.
	Class string `json:"class"`
	// MaxInputTokens (light_mode): prompt budget after trimming.
	MaxInputTokens int `json:"max_input_tokens,omitempty"`
	// MaxTokens (light_mode): output cap.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Rate (throttle): "20/s" requests or "5000tok/s" tokens.
	Rate string `json:"rate,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Defaults of the three built-in classes.
var builtinClasses = []fairqueue.ClassConfig{
	{Name: "realtime", WaitBudget: 5 * time.Second},
	{Name: "interactive", WaitBudget: 15 * time.Second},
	{Name: "batch", WaitBudget: 300 * time.Second},
}

func (h *Handler) setDefaults() {
	h.Name = cmp.Or(h.Name, "default")
	h.TenantKey = cmp.Or(h.TenantKey, "{http.request.header.X-Tenant-ID}")
	h.CostUnit = cmp.Or(h.CostUnit, "estimated_tokens")
	h.Tokenizer = cmp.Or(h.Tokenizer, "cl100k_base")
	h.DefaultMaxTokens = cmp.Or(h.DefaultMaxTokens, 512)
	h.MaxBody = cmp.Or(h.MaxBody, 8<<20)
	h.MaxInflight = cmp.Or(h.MaxInflight, 16)
	h.MaxQueue = cmp.Or(h.MaxQueue, 10000)
	h.BodyTimeout = cmp.Or(h.BodyTimeout, caddy.Duration(30*time.Second))
	h.MaxRequestTokens = cmp.Or(h.MaxRequestTokens, 131072)
	h.MaxQueueBytes = cmp.Or(h.MaxQueueBytes, 256<<20)
}

// queueConfig turns the handler's JSON into the scheduler's config.
func (h *Handler) queueConfig() (fairqueue.Config, error) {
	cfg := fairqueue.Config{
		MaxInflight:       h.MaxInflight,
		MaxInflightTokens: h.MaxInflightTokens,
		MaxQueue:          h.MaxQueue,
		MaxQueueTokens:    h.MaxQueueTokens,
		MaxQueueBytes:     h.MaxQueueBytes,
		Tenants:           make(map[string]fairqueue.TenantConfig, len(h.Tenants)),
		ExpiryMargin:      2 * tickPeriod,
	}
	var err error
	if cfg.CostUnit, err = costUnit(h.CostUnit); err != nil {
		return cfg, err
	}
	if cfg.Classes, err = h.classes(); err != nil {
		return cfg, err
	}
	if err := h.QuotaDefaults.checkDefaults(); err != nil {
		return cfg, err
	}
	for name, t := range h.Tenants {
		if name == unknownTenantLabel {
			return cfg, fmt.Errorf("tenant %q: the name is the metrics label of every undeclared tenant; choose another", name)
		}
		if cfg.Tenants[name], err = h.tenantConfig("tenant "+strconv.Quote(name), t); err != nil {
			return cfg, err
		}
	}
	if cfg.Default, err = h.tenantConfig("default_tenant", h.DefaultTenant); err != nil {
		return cfg, err
	}
	if cfg.Default.MaxQueue == 0 {
		// Unknown tenants are one group: rotating tenant IDs must not
		// fill the room declared tenants queue in.
		cfg.Default.MaxQueue = max(h.MaxQueue/2, 1)
	}
	// Nor may one unknown tenant fill the group's room.
	cfg.DefaultPerTenantMaxQueue = max(cfg.Default.MaxQueue/4, 1)
	cfg.Admission = h.admissionConfig()
	cfg.Circuit = h.CircuitBreak.engine()
	cfg.UpstreamQuota = h.UpstreamQuota.engine()
	cfg.Fallback = h.Fallback.engine()
	return cfg, nil
}

// costUnit is the scheduler's unit for cost_unit.
func costUnit(name string) (fairqueue.CostUnit, error) {
	for _, u := range []fairqueue.CostUnit{fairqueue.CostTokens, fairqueue.CostRequests, fairqueue.CostLearned} {
		if u.String() == name {
			return u, nil
		}
	}
	return fairqueue.CostTokens, fmt.Errorf("cost_unit: want estimated_tokens, requests or learned, got %q", name)
}

// classes is the built-in classes with the configured ones applied: a
// class of a built-in name changes its budget, any other is added.
func (h *Handler) classes() ([]fairqueue.ClassConfig, error) {
	classes := slices.Clone(builtinClasses)
	for _, c := range h.Classes {
		if c == nil || c.Name == "" {
			return nil, fmt.Errorf("class: a class needs a name")
		}
		cc := fairqueue.ClassConfig{Name: c.Name, WaitBudget: time.Duration(c.WaitBudget)}
		if i := slices.IndexFunc(classes, func(x fairqueue.ClassConfig) bool { return x.Name == c.Name }); i >= 0 {
			classes[i] = cc
		} else {
			classes = append(classes, cc)
		}
	}
	return classes, nil
}

// tenantConfig is the scheduler's config of a tenant (who names it in
// errors): weight 1 and class batch unless t says otherwise.
func (h *Handler) tenantConfig(who string, t *TenantConfig) (fairqueue.TenantConfig, error) {
	if t == nil {
		t = new(TenantConfig)
	}
	if t.MaxRequestTokens < 0 || t.MaxInflight < 0 {
		return fairqueue.TenantConfig{}, fmt.Errorf("%s: max_request_tokens and max_inflight must not be negative", who)
	}
	tc := fairqueue.TenantConfig{Weight: cmp.Or(t.Weight, 1), Class: cmp.Or(t.Class, "batch"),
		WaitBudget: time.Duration(t.WaitBudget), MaxQueue: t.MaxQueue, MaxInflight: t.MaxInflight,
		Tier: t.Tier, Reserve: t.Reserve}
	var err error
	if tc.Quota, err = compileQuota(who+": quota", t.Quota, h.QuotaDefaults); err != nil {
		return tc, err
	}
	tc.QuotaAutoWeight = quotaAuto(t.Quota, h.QuotaDefaults)
	h.quotaAuto = h.quotaAuto || tc.QuotaAutoWeight
	return tc, nil
}

// checkLimits refuses negative sizes, durations and token limits, which
// the JSON form can say (a tenant's: tenantConfig).
func (h *Handler) checkLimits() error {
	for _, l := range []struct {
		name string
		v    int64
	}{
		{"max_body", h.MaxBody}, {"body_timeout", int64(h.BodyTimeout)},
		{"max_request_tokens", h.MaxRequestTokens}, {"default_max_tokens", int64(h.DefaultMaxTokens)},
		{"max_queue_bytes", h.MaxQueueBytes},
	} {
		if l.v < 0 {
			return fmt.Errorf("%s must not be negative, got %d", l.name, l.v)
		}
	}
	return nil
}

// admissionConfig applies anti_starvation's defaults: boost up to 10% of
// capacity, 200 boosts per tenant per hour, fast-fail on.
func (h *Handler) admissionConfig() fairqueue.BudgetConfig {
	a := fairqueue.DefaultBudgetConfig()
	if as := h.AntiStarvation; as != nil {
		if as.BoostShareMax != nil {
			a.BoostShareMax = *as.BoostShareMax
		}
		if as.PerTenantBoostHourly != nil {
			a.PerTenantBoostHourly = *as.PerTenantBoostHourly
		}
		if as.FastFail != nil {
			a.FastFail = *as.FastFail
		}
		a.Throughput.Prior = as.ThroughputPrior
	}
	return a
}

// Provision sets defaults, loads the inner proxy and joins the named queue,
// applying this config to it.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.usageLog = clampLogger(h.logger)
	h.setDefaults()
	for _, step := range []func() error{h.compile, h.loadProxy, h.provisionFallback,
		func() error { return registerMetrics(ctx.GetMetricsRegistry()) },
		h.loadEvents, h.provisionCluster, h.joinQueue} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// compile builds and validates what the request path and the scheduler
// need from the config. It touches no shared state, so a bad config fails
// the load with the running queue untouched.
func (h *Handler) compile() error {
	var err error
	if h.counter, err = llmapi.NewCounter(h.Tokenizer); err != nil {
		return fmt.Errorf("tokenizer: %v", err)
	}
	if h.estimator, err = llmapi.NewEstimator(h.Tokenizer); err != nil {
		return fmt.Errorf("tokenizer: %v", err)
	}
	if err := h.checkLimits(); err != nil {
		return err
	}
	if h.qcfg, err = h.queueConfig(); err != nil {
		return err
	}
	h.classIdx = make(map[string]time.Duration, len(h.qcfg.Classes))
	for _, c := range h.qcfg.Classes {
		h.classIdx[c.Name] = c.WaitBudget
	}
	h.tenantHeader = headerPlaceholder(h.TenantKey)
	h.metrics = &metricsCache{queue: h.Name}
	if err := h.provisionDegrade(); err != nil {
		return err
	}
	return h.qcfg.Validate()
}

// loadProxy loads the inner reverse_proxy, with the defaults a queue in
// front of it needs (proxyDefaults).
func (h *Handler) loadProxy() error {
	if h.ProxyRaw == nil {
		return fmt.Errorf("fair_queue needs a reverse_proxy to dispatch to")
	}
	policy := "least_conn"
	if h.Cluster != nil && h.Cluster.ShareSlots {
		policy = "fair_queue_least_conn"
	}
	var err error
	h.proxy, err = loadReverseProxy(h.ctx, h, &h.ProxyRaw, policy, "proxy")
	return err
}

// loadReverseProxy loads the reverse_proxy whose JSON is *raw, the ProxyRaw
// of owner, with proxyDefaults applied; what names it in errors.
func loadReverseProxy(ctx caddy.Context, owner any, raw *json.RawMessage, policy, what string) (*reverseproxy.Handler, error) {
	var err error
	if *raw, err = proxyDefaults(*raw, policy); err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	mod, err := ctx.LoadModule(owner, "ProxyRaw")
	if err != nil {
		return nil, fmt.Errorf("loading %s: %v", what, err)
	}
	proxy, ok := mod.(*reverseproxy.Handler)
	if !ok {
		return nil, fmt.Errorf("%s must be a reverse_proxy handler, got %T", what, mod)
	}
	return proxy, nil
}

// joinQueue joins the queue of h's name, made if it is the first user.
func (h *Handler) joinQueue() error {
	h.committed = new(atomic.Bool)
	val, _, err := queues.LoadOrNew(h.Name, func() (caddy.Destructor, error) {
		return newSharedQueue(h.Name, h.qcfg)
	})
	if err != nil {
		return err
	}
	h.shared = val.(*sharedQueue)
	if p, ok := h.proxy.LoadBalancing.SelectionPolicy.(*ClusterLeastConn); ok {
		p.view, p.placed = &h.shared.slotView, &h.shared.placed
		h.placed = p.placed
	}
	if err := h.shared.adopt(h); err != nil {
		_, _ = queues.Delete(h.Name)
		h.shared = nil
		return err
	}
	return nil
}

// proxyDefaults gives the inner proxy, unless configured: the selection
// policy given (capacity is per upstream; random could pick a full one),
// and read_timeout defaultReadTimeout, so a hung server cannot hold a slot.
func proxyDefaults(raw json.RawMessage, policy string) (json.RawMessage, error) {
	var proxy map[string]json.RawMessage
	if err := json.Unmarshal(raw, &proxy); err != nil {
		return nil, err
	}
	lb, err := subObject(proxy, "load_balancing")
	if err != nil {
		return nil, err
	}
	if _, ok := lb["selection_policy"]; !ok {
		lb["selection_policy"] = json.RawMessage(`{"policy":` + strconv.Quote(policy) + `}`)
		if proxy["load_balancing"], err = json.Marshal(lb); err != nil {
			return nil, err
		}
	}
	tr, err := subObject(proxy, "transport")
	if err != nil {
		return nil, err
	}
	var protocol string
	if p, ok := tr["protocol"]; ok {
		if err := json.Unmarshal(p, &protocol); err != nil {
			return nil, err
		}
	}
	if _, ok := tr["read_timeout"]; !ok && (protocol == "" || protocol == "http") {
		tr["protocol"] = json.RawMessage(`"http"`)
		tr["read_timeout"] = json.RawMessage(strconv.Quote(defaultReadTimeout.String()))
		if proxy["transport"], err = json.Marshal(tr); err != nil {
			return nil, err
		}
	}
	return json.Marshal(proxy)
}

// defaultReadTimeout must exceed the longest non-streamed generation,
// which sends nothing until the whole answer is ready.
const defaultReadTimeout = 5 * time.Minute

// subObject returns the JSON object m[key] decoded, or an empty one.
func subObject(m map[string]json.RawMessage, key string) (map[string]json.RawMessage, error) {
	var out map[string]json.RawMessage
	if v, ok := m[key]; ok {
		if err := json.Unmarshal(v, &out); err != nil {
			return nil, fmt.Errorf("%s: %v", key, err)
		}
	}
	if out == nil { // absent, or JSON null
		out = map[string]json.RawMessage{}
	}
	return out, nil
}

// Cleanup leaves the queue. Requests still waiting or streaming keep
// working: nothing they wait on hangs off this config's context.
func (h *Handler) Cleanup() error {
	// After leaving the queue, so that it already runs on the next
	// config's quota store, or is gone, when the client closes.
	defer h.closeCluster()
	if h.shared == nil || h.left {
		return nil
	}
	// Requests this handler admitted may still use h.shared: it stays.
	h.left = true
	h.shared.abandon(h)
	deleted, err := queues.Delete(h.Name)
	if deleted {
		h.gone = h.shared // its shared slots are released (closeCluster)
	}
	h.logger.Debug("left queue", zap.String("queue", h.Name), zap.Bool("last_user", deleted))
	return err
}

// countHealthy counts a proxy's upstreams that Caddy's active and passive
// health checks consider healthy.
func countHealthy(p *reverseproxy.Handler) int {
	if p == nil {
		return 0
	}
	if len(p.Upstreams) == 0 {
		return 1 // dynamic upstreams carry no health state
	}
	n := 0
	for _, u := range p.Upstreams {
		if u.Healthy() {
			n++
		}
	}
	return n
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// headerPlaceholder returns the header's canonical name when key is
// exactly one request-header placeholder, such as
// "{http.request.header.X-Tenant-ID}"; "" otherwise.
func headerPlaceholder(key string) string {
	name, ok1 := strings.CutPrefix(key, "{http.request.header.")
	name, ok2 := strings.CutSuffix(name, "}")
	if !ok1 || !ok2 || name == "" {
		return ""
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return ""
		}
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}
