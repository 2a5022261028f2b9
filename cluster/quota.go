package cluster

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// DefaultPrefix starts the default key prefix, DefaultPrefix + the queue's
// name + ":".
const DefaultPrefix = "fq:quota:"

// expiryMargin is how long a tenant's key outlives the time the tenant
// comes to rest: it absorbs clock differences between a Redis primary and
// the replica that may replace it, so that a key never expires while its
// tenant still owes.
const expiryMargin = time.Second

// Namespaces of the keys under a prefix. Every key the cluster keeps is
// the prefix, one of these, then a hash tag in braces; the prefix holds no
// '{', so the part before the first '{' names the namespace, and no name
// in one can spell a key of another (a tenant called "slots" is
// <prefix>t{slots}, never the pool's <prefix>pool{slots}).
const (
	// TenantSpace holds the tenants' meters: <prefix>t{<tenant>}.
	TenantSpace = "t"
	// InternalSpace holds the meters the gateway keeps for itself (the
	// provider account, its reservations, the outage probe), whose names
	// the queue starts with a NUL, which no tenant ID holds (the handler
	// refuses control characters): <prefix>i{<name less the NUL>}.
	InternalSpace = "i"
)

// PoolKey and SharesKey are the keys of the shared slots and of the shared
// service. The pool's keys (the hash, its ":up" companion, its ":moves"
// channel) share the hash tag {slots}, so its script touches one Redis
// Cluster slot.
func PoolKey(prefix string) string   { return prefix + "pool{slots}" }
func SharesKey(prefix string) string { return prefix + "stream{shares}" }

// ProbeTenant and probeLimits are what the outage probe reads: a tenant
// name no caller can have (tenant keys come from placeholders, which never
// hold a NUL) and any limits.
var (
	ProbeTenant = "\x00probe"
	probeLimits = quota.MustCompile(quota.Config{QPS: 1})
)

// NewQuota returns the meters under prefix in Redis (shared) and the store
// a queue decides on (local): shared while Redis answers, on 1/instances of
// each quota while it does not. opts gives the instances and the
// callbacks; the probe and the outage test are Redis's. Each call is
// bounded by budget. It loads the script, so that the first decision is
// one round trip, and returns that load's error: Redis may not be up yet,
// which the first decision finds out.
func NewQuota(client redis.UniversalClient, prefix string, budget time.Duration, opts quota.LocalOptions) (shared *QuotaStore, local *quota.Local, loadErr error) {
	shared = NewQuotaStore(client, prefix, budget)
	// The probe is a read of the same script the decisions run (its
	// EVALSHA falls back to EVAL, which reloads the script a restarted
	// Redis lost): a Redis that answers PING or SCRIPT LOAD but refuses
	// the script (ACL, scripting off) is still down for quotas, and must
	// not flap between the two.
	opts.Probe = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		_, err := shared.Status(ctx, ProbeTenant, probeLimits)
		return err
	}
	opts.Outage = outage
	local = quota.NewLocal(shared, quota.NewMemory(time.Now), opts)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	return shared, local, shared.Load(ctx)
}

// outage reports whether err, returned by a QuotaStore, may mean Redis is
// unreachable or unfit for quotas (quota.LocalOptions.Outage), rather than
// that one tenant's key is of another type (WRONGTYPE, which Redis sends
// from inside the script, and miniredis after its own prefix): that is
// the tenant's problem, decided locally without an outage.
func outage(err error) bool {
	var re redis.Error
	return !errors.As(err, &re) || !strings.Contains(re.Error(), "WRONGTYPE")
}

//go:embed quota.lua
var quotaLua string

// quotaScript is the one script of every call; Run sends EVALSHA and falls
// back to EVAL (which caches it) on NOSCRIPT.
var quotaScript = redis.NewScript(quotaLua)

// QuotaStore is the quota.Store shared by several gateways: each tenant's
// three TATs in one Redis hash, each call one EVALSHA of one Lua script
// that reads the time from Redis TIME, so that the instances' clocks never
// matter and every decision is atomic across instances. The conformance
// test and the writes run in the script with exact integer arithmetic; the
// earliest time, the reason and the status are computed in Go from the
// state the script returns, by the functions quota.Memory uses, so that
// both stores decide alike (see the package doc, "# Quotas").
//
// Decision.At is on Redis's clock, converted to a time.Time; RetryAfter, a
// difference of two readings of that clock, is the reliable part for a
// caller whose clock differs. Errors are the client's (network, timeout,
// context) or a reply the store cannot read; the caller decides whether to
// fail open. Every method takes the tenant's *quota.Limits, which must not
// be nil.
type QuotaStore struct {
	client  redis.UniversalClient
	prefix  string
	margin  string // expiry margin, decimal milliseconds
	timeout time.Duration

	// onNow, when set (tests only), receives each call's Redis time.
	onNow func(now int64)
}

var (
	_ quota.Store  = (*QuotaStore)(nil)
	_ quota.Remote = (*QuotaStore)(nil)
	_ quota.Syncer = (*QuotaStore)(nil)
)

// Remote implements quota.Remote: every call is a round trip to Redis.
func (*QuotaStore) Remote() bool { return true }

// NewQuotaStore returns the store of the meters under prefix (which must
// not contain '{') on client: a *redis.Client, a *redis.ClusterClient or a
// failover client, made as NewClient makes it. timeout, when positive,
// bounds each call.
func NewQuotaStore(client redis.UniversalClient, prefix string, timeout time.Duration) *QuotaStore {
	return &QuotaStore{
		client:  client,
		prefix:  prefix,
		margin:  strconv.FormatInt(expiryMargin.Milliseconds(), 10),
		timeout: timeout,
	}
}

// Key is the Redis key of a meter's hash: the prefix, its namespace, then
// the tenant in braces, its Cluster hash tag, so that every key a later
// script adds for the same tenant lands in the same slot. A name that
// starts with a NUL is one of the gateway's own meters (InternalSpace).
func (r *QuotaStore) Key(tenant string) string {
	if name, ok := strings.CutPrefix(tenant, "\x00"); ok {
		return r.prefix + InternalSpace + "{" + name + "}"
	}
	return r.prefix + TenantSpace + "{" + tenant + "}"
}

// Load loads the script into Redis (into every primary of a Cluster), so
// that the first decision after a start or a SCRIPT FLUSH is one round trip
// too. Calling it is optional: without it, the first call on each node
// takes two (EVALSHA answered NOSCRIPT, then EVAL).
func (r *QuotaStore) Load(ctx context.Context) error {
	if err := quotaScript.Load(ctx, r.client).Err(); err != nil {
		return fmt.Errorf("cluster: loading the quota script: %w", err)
	}
	return nil
}

// Script operations (ARGV[1]).
const (
	opRead      = "r"
	opCharge    = "c"
	opReconcile = "x"
)

// numDims is the number of meters, TATs' length.
const numDims = len(quota.Dimensions)

// incArg is meter d's increment for tokens as a script argument: "" when
// the meter is off.
func incArg(l *quota.Limits, d quota.Dimension, tokens int64) string {
	return netIncArg(l, d, 1, max(tokens, 0))
}

// netIncArg is a batch's move of meter d (quota.Limits.NetIncrement) as a
// script argument; "" when the meter is off.
func netIncArg(l *quota.Limits, d quota.Dimension, requests, tokens int64) string {
	if !l.Enabled(d) {
		return ""
	}
	return strconv.FormatInt(int64(l.NetIncrement(d, requests, tokens)), 10)
}

// run calls the script once and reads its reply: whether it charged, the
// Redis time and the TATs after the call, all in Unix nanoseconds, the
// time a charge was made as of (now, but for a booking ahead) and the
// meter that set it (-1: none).
func (r *QuotaStore) run(ctx context.Context, tenant string, args ...any) (charged bool, now int64, t quota.TATs, at int64, why int, err error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	res, err := quotaScript.Run(ctx, r.client, []string{r.Key(tenant)}, args...).Slice()
	if err != nil {
		return false, 0, t, 0, -1, fmt.Errorf("cluster: quota store, tenant %q: %w", tenant, err)
	}
	charged, now, t, at, why, err = parseReply(res)
	if err != nil {
		return false, 0, t, 0, -1, fmt.Errorf("cluster: quota store, tenant %q: %w", tenant, err)
	}
	if r.onNow != nil {
		r.onNow(now)
	}
	return charged, now, t, at, why, nil
}

var errReply = errors.New("unreadable script reply")

// parseReply reads the script's {allowed, now, q, t, j, at, why}; why
// is returned as a meter index, -1 for none.
func parseReply(res []any) (charged bool, now int64, t quota.TATs, at int64, why int, err error) {
	const n = 4 + numDims
	if len(res) != n {
		return false, 0, t, 0, -1, fmt.Errorf("%w: %d elements, want %d", errReply, len(res), n)
	}
	var v [n]int64
	for i, e := range res {
		s, ok := e.(string)
		if !ok {
			return false, 0, t, 0, -1, fmt.Errorf("%w: element %d is %T", errReply, i, e)
		}
		if v[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return false, 0, t, 0, -1, fmt.Errorf("%w: element %d: %v", errReply, i, err)
		}
	}
	if w := v[n-1]; w < 0 || w > int64(numDims) {
		return false, 0, t, 0, -1, fmt.Errorf("%w: meter %d", errReply, w)
	}
	copy(t[:], v[2:2+numDims])
	return v[0] == 1, v[1], t, v[n-2], int(v[n-1]) - 1, nil
}

func decision(ok bool, at int64, reason quota.Dimension, t *quota.TATs, l *quota.Limits, now int64) quota.Decision {
	return quota.Decision{
		Allowed:    ok,
		At:         time.Unix(0, at),
		RetryAfter: time.Duration(at - now),
		Reason:     reason,
		Status:     quota.StatusOf(t, l, now),
	}
}

// Peek implements quota.Store: one script call that reads the tenant's TATs and
// the Redis time; the decision, with the backlog, is Decide's.
func (r *QuotaStore) Peek(ctx context.Context, tenant string, l *quota.Limits, ahead quota.Backlog) (quota.Decision, error) {
	_, now, t, _, _, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return quota.Decision{}, err
	}
	ok, at, reason := quota.Decide(&t, l, now, ahead)
	return decision(ok, at, reason, &t, l, now), nil
}

// Charge implements quota.Store: one script call that tests and charges every
// meter atomically, so that concurrent charges from any number of gateways
// admit exactly what one quota.Memory would.
func (r *QuotaStore) Charge(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Decision, error) {
	charged, now, t, _, _, err := r.run(ctx, tenant, opCharge,
		strconv.FormatInt(int64(l.Tolerance()), 10), r.margin,
		incArg(l, quota.DimQPS, tokens), incArg(l, quota.DimTokens, tokens), incArg(l, quota.DimJoint, tokens))
	if err != nil {
		return quota.Decision{}, err
	}
	if charged {
		return decision(true, now, "", &t, l, now), nil
	}
	// Refused: the state is the one the script tested, unchanged.
	ok, at, reason := quota.Decide(&t, l, now, quota.Backlog{})
	if ok {
		return quota.Decision{}, fmt.Errorf("cluster: quota store, tenant %q: the script refused a charge that Decide allows at %d", tenant, now)
	}
	return decision(false, at, reason, &t, l, now), nil
}

// Book implements quota.Store: Charge's script call, given the longest wait it
// may book: the test, the earliest time and the charge as of it in one
// atomic call, so that bookings from any number of gateways are first
// come, first served.
func (r *QuotaStore) Book(ctx context.Context, tenant string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (quota.Decision, error) {
	charged, now, t, at, why, err := r.run(ctx, tenant, opCharge,
		strconv.FormatInt(int64(l.Tolerance()), 10), r.margin,
		incArg(l, quota.DimQPS, tokens), incArg(l, quota.DimTokens, tokens), incArg(l, quota.DimJoint, tokens),
		strconv.FormatInt(int64(min(max(maxWait, 0), quota.MaxBookWait)), 10), strconv.FormatInt(int64(max(lead, 0)), 10))
	if err != nil {
		return quota.Decision{}, err
	}
	if charged {
		var reason quota.Dimension
		if why >= 0 {
			reason = quota.Dimensions[why]
		}
		return decision(true, at, reason, &t, l, now), nil
	}
	ok, at, reason := quota.Decide(&t, l, now, quota.Backlog{})
	if ok {
		return quota.Decision{}, fmt.Errorf("cluster: quota store, tenant %q: the script refused a booking that Decide allows at %d", tenant, now)
	}
	return decision(false, at, reason, &t, l, now), nil
}

// Reconcile implements quota.Store: one script call that moves the token and
// joint meters by the difference of the increments (computed here, as
// Reconcile does), and forgets a tenant that it brings back to rest.
func (r *QuotaStore) Reconcile(ctx context.Context, tenant string, l *quota.Limits, estimated, actual int64) (quota.Status, error) {
	diff := func(d quota.Dimension) string {
		if !l.Enabled(d) {
			return ""
		}
		return strconv.FormatInt(int64(l.Increment(d, actual)-l.Increment(d, estimated)), 10)
	}
	_, now, t, _, _, err := r.run(ctx, tenant, opReconcile, "0", r.margin, "", diff(quota.DimTokens), diff(quota.DimJoint))
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&t, l, now), nil
}

// Refund implements quota.Store: the reconcile script with every meter's
// increment taken back, one call.
func (r *QuotaStore) Refund(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Status, error) {
	back := func(d quota.Dimension) string {
		if !l.Enabled(d) {
			return ""
		}
		return strconv.FormatInt(-int64(l.Increment(d, tokens)), 10)
	}
	_, now, t, _, _, err := r.run(ctx, tenant, opReconcile, "0", r.margin, back(quota.DimQPS), back(quota.DimTokens), back(quota.DimJoint))
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&t, l, now), nil
}

// Add implements quota.Syncer: the reconcile script with every meter moved by
// the batch (one call; a read when the batch is empty).
func (r *QuotaStore) Add(ctx context.Context, tenant string, l *quota.Limits, requests, tokens int64) (quota.Status, error) {
	if requests == 0 && tokens == 0 {
		return r.Status(ctx, tenant, l)
	}
	_, now, t, _, _, err := r.run(ctx, tenant, opReconcile, "0", r.margin,
		netIncArg(l, quota.DimQPS, requests, tokens), netIncArg(l, quota.DimTokens, requests, tokens), netIncArg(l, quota.DimJoint, requests, tokens))
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&t, l, now), nil
}

// Status implements quota.Store: one read-only script call.
func (r *QuotaStore) Status(ctx context.Context, tenant string, l *quota.Limits) (quota.Status, error) {
	_, now, t, _, _, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&t, l, now), nil
}
