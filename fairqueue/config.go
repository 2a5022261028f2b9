package fairqueue

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// CostUnit is what fairness is measured in.
type CostUnit int

const (
	// CostTokens measures service in estimated (then actual) tokens.
	CostTokens CostUnit = iota
	// CostRequests counts every request as 1, the classic fair queue.
	CostRequests
	// CostLearned measures service in the upstream time a request takes,
	// as a learned cost model prices it (Queue.SetCostModel): overhead +
	// prompt x promptWeight + completion, in completion-token units, so
	// tenants share model-server time rather than raw tokens. Until a
	// model is set it is CostTokens.
	CostLearned
)

// String returns the Caddyfile spelling of the unit.
func (u CostUnit) String() string {
	switch u {
	case CostRequests:
		return "requests"
	case CostLearned:
		return "learned"
	}
	return "estimated_tokens"
}

// ClassConfig declares a class of service.
type ClassConfig struct {
	// Name is how tenants, requests and degrade steps refer to the class.
	Name string
	// WaitBudget is the default longest time a request of this class may
	// wait in the queue; 0 means no budget.
	WaitBudget time.Duration
}

// TenantConfig is the scheduling identity of one tenant.
type TenantConfig struct {
	// Weight is the tenant's share relative to other backlogged tenants.
	Weight float64
	// Class is the tenant's default class; it must name a ClassConfig.
	Class string
	// WaitBudget overrides the class budget when non-zero.
	WaitBudget time.Duration
	// MaxQueue caps this tenant's queued requests; 0 means only the global
	// cap applies. In Config.Default it caps the undeclared tenants'
	// queued requests together (the group's room), not each one's.
	MaxQueue int
	// MaxInflight caps this tenant's requests in flight; 0 means no cap. A
	// tenant at its cap is not eligible for dispatch (its queued requests
	// wait, and other tenants take the capacity) until one completes. In
	// Config.Default it caps each undeclared tenant.
	MaxInflight int
	// Quota limits the tenant's requests and tokens per unit of time (see
	// package quota); nil means none. In Config.Default each undeclared
	// tenant gets this quota of its own, keyed by its name, so the tenant
	// name must come from authentication for the quota to bind a caller.
	Quota *quota.Limits
	// QuotaAutoWeight: Quota's token_to_qps_weight follows the learned
	// cost model (Queue.SetQuotaWeight).
	QuotaAutoWeight bool
	// Reserve is the fraction of Config.UpstreamQuota only this tenant
	// draws from (see upstream.go); 0 for none. Declared tenants only.
	Reserve float64
	// Tier is the tenant's tier for the circuit breaker (Config.Circuit):
	// it must be one of the circuit's Order; "" is never shed.
	Tier string
}

// Config is the whole scheduler configuration. It can be replaced while
// requests are queued and in flight (Queue.Reconfigure).
type Config struct {
	CostUnit CostUnit
	// MaxInflight is the number of concurrent requests per healthy upstream.
	MaxInflight int
	// MaxInflightTokens, when positive, caps the estimated cost in flight
	// per healthy upstream.
	MaxInflightTokens int64
	// MaxQueue caps queued requests over all tenants; 0 means unlimited.
	MaxQueue int
	// MaxQueueTokens, when positive, caps the queued estimated cost.
	MaxQueueTokens int64
	// Classes lists the classes of service; order does not imply priority.
	Classes []ClassConfig
	// MaxQueueBytes caps Request.Bytes summed over queued requests; 0
	// means unlimited. A single request larger than it is never admitted,
	// so the caller's body limit should be below it.
	MaxQueueBytes int64
	// Tenants maps known tenant names to their settings.
	Tenants map[string]TenantConfig
	// Default applies to tenants not in Tenants, the undeclared tenants,
	// as one group: Default.Weight is the weight of all of them together,
	// shared equally among those backlogged, and Default.MaxQueue caps
	// their queued requests together.
	Default TenantConfig
	// DefaultPerTenantMaxQueue caps each undeclared tenant's queued
	// requests, inside the group's cap; 0 means only the group's cap.
	DefaultPerTenantMaxQueue int
	// IdleForget is how long a tenant with nothing queued or in flight is
	// remembered (see Queue.Tick); 0 means DefaultIdleForget.
	IdleForget time.Duration
	// ExpiryMargin is how long before its deadline a still-queued request is
	// expired, so the caller's answer reaches the client before the budget
	// runs out rather than after; it should exceed the Tick period.
	ExpiryMargin time.Duration
	// Degrade is the ladder walked on the water level (see Queue.Water); its
	// steps are validated against Classes.
	Degrade []degrade.Step
	// DegradeHold is the ladder's minimum time between two transitions of a
	// step; 0 means degrade.DefaultHold.
	DegradeHold time.Duration
	// Admission makes wait budgets promises: ETAs, boosts and fast-fail.
	Admission BudgetConfig
	// QuotaStore keeps the tenants' quota meters; nil means an in-process
	// store owned by the queue (kept across Reconfigure).
	QuotaStore quota.Store
	// AccountStore keeps the provider account's meters (UpstreamQuota,
	// its reservations, the fallback's account), drawn on under the
	// queue's lock; nil means QuotaStore. A cluster sets a quota.Mirror,
	// answered in memory, so that no network call is made under the lock.
	AccountStore quota.Store
	// Circuit, when set, sheds tenants tier by tier, lowest first, while
	// demand stays above what the upstreams serve (see circuit.go).
	Circuit *degrade.CircuitConfig
	// UpstreamQuota, when set, gates dispatch by the provider account's
	// requests and tokens per minute (see upstream.go).
	UpstreamQuota *UpstreamQuota
	// Fallback is a second upstream pool the tenants it lists use when the
	// primary cannot serve them (see fallback.go); nil: none.
	Fallback *FallbackConfig
}

// Validate reports the first problem in c.
func (c *Config) Validate() error {
	if err := c.validateLimits(); err != nil {
		return err
	}
	classes, err := c.validateClasses()
	if err != nil {
		return err
	}
	if c.Circuit != nil {
		if err := c.Circuit.Validate(); err != nil {
			return err
		}
	}
	if err := c.validateTenants(classes); err != nil {
		return err
	}
	if err := c.validateFallback(); err != nil {
		return err
	}
	return c.validateDegrade()
}

// validateLimits checks the queue's numeric limits.
func (c *Config) validateLimits() error {
	if c.MaxInflight <= 0 {
		return fmt.Errorf("max_inflight must be positive, got %d", c.MaxInflight)
	}
	if a := c.Admission; a.BoostShareMax < 0 || a.BoostShareMax > 1 || a.PerTenantBoostHourly < 0 || a.Margin < 0 {
		return fmt.Errorf("anti_starvation: boost_share_max must be in [0, 1] and the other limits not negative")
	}
	if c.MaxInflightTokens < 0 || c.MaxQueueTokens < 0 || c.MaxQueue < 0 || c.MaxQueueBytes < 0 ||
		c.DefaultPerTenantMaxQueue < 0 || c.IdleForget < 0 {
		return fmt.Errorf("queue and in-flight limits and idle_forget must not be negative")
	}
	return nil
}

// validateClasses checks the classes and returns their names.
func (c *Config) validateClasses() (map[string]bool, error) {
	seen := map[string]bool{}
	for _, cl := range c.Classes {
		switch {
		case cl.Name == "":
			return nil, fmt.Errorf("class with empty name")
		case seen[cl.Name]:
			return nil, fmt.Errorf("class %q declared twice", cl.Name)
		case cl.WaitBudget < 0:
			return nil, fmt.Errorf("class %q: negative wait budget", cl.Name)
		}
		seen[cl.Name] = true
	}
	return seen, nil
}

// validateTenants checks every tenant entry and the default one against
// the classes declared.
func (c *Config) validateTenants(classes map[string]bool) error {
	for name, t := range c.Tenants {
		if err := CheckTenantID(name); err != nil {
			return fmt.Errorf("tenant %q: the name is not a valid tenant ID: it has %v", name, err)
		}
		if err := c.validateTenant(fmt.Sprintf("tenant %q", name), t, classes); err != nil {
			return err
		}
	}
	return c.validateTenant("default_tenant", c.Default, classes)
}

// validateTenant checks one tenant entry; who names it in the error.
func (c *Config) validateTenant(who string, t TenantConfig, classes map[string]bool) error {
	switch {
	case !(t.Weight > 0) || math.IsInf(t.Weight, 0):
		return fmt.Errorf("%s: weight must be a positive number, got %v", who, t.Weight)
	case !classes[t.Class]:
		return fmt.Errorf("%s: unknown class %q", who, t.Class)
	case t.MaxQueue < 0 || t.WaitBudget < 0 || t.MaxInflight < 0:
		return fmt.Errorf("%s: negative max_queue, max_inflight or wait_budget", who)
	case t.Tier != "" && c.Circuit != nil && !slices.Contains(c.Circuit.Order, t.Tier):
		return fmt.Errorf("%s: tier %q is not in circuit_break's order %v", who, t.Tier, c.Circuit.Order)
	}
	return nil
}

// validateFallback checks the names the fallback channel lists.
func (c *Config) validateFallback() error {
	if c.Fallback == nil {
		return nil
	}
	for _, name := range c.Fallback.Tenants {
		if err := CheckTenantID(name); err != nil {
			return fmt.Errorf("fallback: tenant %q is not a valid tenant ID: it has %v", name, err)
		}
	}
	return nil
}

// validateDegrade checks the degrade ladder against the classes.
func (c *Config) validateDegrade() error {
	if len(c.Degrade) == 0 {
		return nil
	}
	names := make([]string, len(c.Classes))
	for i, cl := range c.Classes {
		names[i] = cl.Name
	}
	_, err := degrade.NewLadder(c.Degrade, c.DegradeHold, names)
	return err
}

// DefaultBudgetConfig is anti_starvation's defaults, for the handler and
// the simulator.
func DefaultBudgetConfig() BudgetConfig {
	return BudgetConfig{FastFail: true, BoostShareMax: 0.10, PerTenantBoostHourly: 200,
		Margin: DefaultMargin}
}

// DefaultMargin is BudgetConfig.Margin by default: three ticks of the
// handler's 50 ms Tick period, so a request is answered before its deadline
// even when a tick comes late.
const DefaultMargin = 150 * time.Millisecond

// DefaultIdleForget is Config.IdleForget when unset: long enough that a
// tenant pausing between requests keeps its place in virtual time.
const DefaultIdleForget = 30 * time.Second

// Budget returns the wait budget of a request of tenant t in class cls,
// asking for requested (0: nothing asked); 0 means no budget. In the
// tenant's own class it is the tenant's override when set, else the class
// default; in another class, the longer of the two, so moving to a more
// patient class never shortens the wait. A shorter requested budget wins.
func (c *Config) Budget(t TenantConfig, cls string, requested time.Duration) time.Duration {
	var classDefault time.Duration
	for _, cl := range c.Classes {
		if cl.Name == cls {
			classDefault = cl.WaitBudget
			break
		}
	}
	override := t.WaitBudget
	if cls != t.Class && override > 0 && (classDefault == 0 || classDefault > override) {
		override = 0 // the longer class default applies
	}
	if classDefault == 0 && override == 0 {
		return max(requested, 0)
	}
	return budget.Budget(classDefault, override, requested)
}

// Tenant returns the settings of a tenant and whether it is declared.
func (c *Config) Tenant(name string) (TenantConfig, bool) {
	t, ok := c.Tenants[name]
	if !ok {
		return c.Default, false
	}
	return t, true
}
