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

// expiryMargin is how long a tenant's key outlives its rest: room for the
// clock of a replica that replaces the primary.
const expiryMargin = time.Second

// Namespaces of the keys under a prefix: every key is the prefix, one of
// these, then a hash tag in braces. The prefix holds no '{', so no name in
// one namespace can spell a key of another.
const (
	// TenantSpace holds the tenants' meters: <prefix>t{<tenant>}.
	TenantSpace = "t"
	// InternalSpace holds the gateway's own meters (provider account,
	// reservations, probe), whose names start with a NUL, which no tenant
	// ID holds: <prefix>i{<name less the NUL>}.
	InternalSpace = "i"
)

// PoolKey and SharesKey are the keys of the shared slots and of the shared
// service; the pool's keys share the hash tag {slots}.
func PoolKey(prefix string) string   { return prefix + "pool{slots}" }
func SharesKey(prefix string) string { return prefix + "stream{shares}" }

// ProbeTenant and probeLimits are what the outage probe reads: a name no
// tenant can have, and any limits.
var (
	ProbeTenant = "\x00probe"
	probeLimits = quota.MustCompile(quota.Config{QPS: 1})
)

// NewQuota returns the meters under prefix in Redis (shared) and the store
// a queue decides on (local): shared while Redis answers, 1/instances of
// each quota while it does not. Each call is bounded by budget. It loads
// the script and returns that load's error (Redis may not be up yet).
func NewQuota(client redis.UniversalClient, prefix string, budget time.Duration, opts quota.LocalOptions) (shared *QuotaStore, local *quota.Local, loadErr error) {
	shared = NewQuotaStore(client, prefix, budget)
	// The probe runs the decisions' script: a Redis that answers PING but
	// refuses the script (ACL, scripting off) is still down for quotas.
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

// outage reports whether err may mean Redis is unreachable or unfit
// (quota.LocalOptions.Outage), rather than one tenant's key being of
// another type (WRONGTYPE).
func outage(err error) bool {
	var re redis.Error
	return !errors.As(err, &re) || !strings.Contains(re.Error(), "WRONGTYPE")
}

//go:embed quota.lua
var quotaLua string

// quotaScript is the one script of every call (EVALSHA, EVAL on NOSCRIPT).
var quotaScript = redis.NewScript(quotaLua)

// QuotaStore is the quota.Store shared by several gateways: each tenant's
// three TATs in one Redis hash, each call one script call on Redis TIME,
// atomic across instances (see the package doc). Decision.At is on Redis's
// clock; RetryAfter is the reliable part for a caller whose clock differs.
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

// NewQuotaStore returns the store of the meters under prefix (no '{') on
// a client made as NewClient makes it. timeout, when positive, bounds each
// call.
func NewQuotaStore(client redis.UniversalClient, prefix string, timeout time.Duration) *QuotaStore {
	return &QuotaStore{
		client:  client,
		prefix:  prefix,
		margin:  strconv.FormatInt(expiryMargin.Milliseconds(), 10),
		timeout: timeout,
	}
}

// Key is the Redis key of a meter's hash: the prefix, its namespace, then
// the tenant in braces as the Cluster hash tag.
func (r *QuotaStore) Key(tenant string) string {
	if name, ok := strings.CutPrefix(tenant, "\x00"); ok {
		return r.prefix + InternalSpace + "{" + name + "}"
	}
	return r.prefix + TenantSpace + "{" + tenant + "}"
}

// Load loads the script into every primary, so the first decision is one
// round trip too. It is optional.
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

// numDims is the number of meters.
const numDims = len(quota.Dimensions)

// meterArgs is the script's per-meter arguments (q, t, j): f of each
// meter, "" when the meter is off.
func meterArgs(l *quota.Limits, f func(quota.Dimension) time.Duration) []any {
	args := make([]any, numDims)
	for i, d := range quota.Dimensions {
		args[i] = ""
		if l.Enabled(d) {
			args[i] = strconv.FormatInt(int64(f(d)), 10)
		}
	}
	return args
}

// run calls the script once and reads its reply: whether it charged, the
// Redis time and the TATs after the call (Unix ns), the time a charge was
// made as of and the meter that set it (-1: none).
func (r *QuotaStore) run(ctx context.Context, tenant string, args ...any) (charged bool, now int64, t quota.TATs, at int64, why int, err error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	res, err := quotaScript.Run(ctx, r.client, []string{r.Key(tenant)}, args...).Slice()
	if err == nil {
		charged, now, t, at, why, err = parseReply(res)
	}
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

// Peek implements quota.Store: a read, then Decide.
func (r *QuotaStore) Peek(ctx context.Context, tenant string, l *quota.Limits, ahead quota.Backlog) (quota.Decision, error) {
	_, now, t, _, _, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return quota.Decision{}, err
	}
	ok, at, reason := quota.Decide(&t, l, now, ahead)
	return decision(ok, at, reason, &t, l, now), nil
}

// Charge implements quota.Store: one atomic test and charge, so
// concurrent gateways admit exactly what one quota.Memory would.
func (r *QuotaStore) Charge(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Decision, error) {
	return r.charge(ctx, tenant, l, tokens, "charge")
}

// Book implements quota.Store: Charge's script call given the longest
// wait, so bookings from any number of gateways are first come, first
// served.
func (r *QuotaStore) Book(ctx context.Context, tenant string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (quota.Decision, error) {
	return r.charge(ctx, tenant, l, tokens, "booking",
		strconv.FormatInt(int64(min(max(maxWait, 0), quota.MaxBookWait)), 10), strconv.FormatInt(int64(max(lead, 0)), 10))
}

// charge runs the charge script, with a booking's wait and lead if given;
// what names the call in the error for a refusal that Decide contradicts.
// Without a wait the script charges as of now, on no meter's account.
func (r *QuotaStore) charge(ctx context.Context, tenant string, l *quota.Limits, tokens int64, what string, booking ...any) (quota.Decision, error) {
	args := append([]any{opCharge, strconv.FormatInt(int64(l.Tolerance()), 10), r.margin},
		meterArgs(l, func(d quota.Dimension) time.Duration { return l.Increment(d, tokens) })...)
	charged, now, t, at, why, err := r.run(ctx, tenant, append(args, booking...)...)
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
	// Refused: the state is the one the script tested, unchanged.
	ok, at, reason := quota.Decide(&t, l, now, quota.Backlog{})
	if ok {
		return quota.Decision{}, fmt.Errorf("cluster: quota store, tenant %q: the script refused a %s that Decide allows at %d", tenant, what, now)
	}
	return decision(false, at, reason, &t, l, now), nil
}

// move runs the reconcile script, moving each meter by its argument
// (meterArgs), and returns the status after it.
func (r *QuotaStore) move(ctx context.Context, tenant string, l *quota.Limits, moves []any) (quota.Status, error) {
	_, now, tats, _, _, err := r.run(ctx, tenant, append([]any{opReconcile, "0", r.margin}, moves...)...)
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&tats, l, now), nil
}

// Reconcile implements quota.Store: the token and joint meters move by the
// difference of the increments, computed as quota.Reconcile does.
func (r *QuotaStore) Reconcile(ctx context.Context, tenant string, l *quota.Limits, estimated, actual int64) (quota.Status, error) {
	moves := meterArgs(l, func(d quota.Dimension) time.Duration { return l.Increment(d, actual) - l.Increment(d, estimated) })
	moves[0] = "" // the request count is unchanged
	return r.move(ctx, tenant, l, moves)
}

// Refund implements quota.Store: every meter's increment taken back.
func (r *QuotaStore) Refund(ctx context.Context, tenant string, l *quota.Limits, tokens int64) (quota.Status, error) {
	return r.move(ctx, tenant, l, meterArgs(l, func(d quota.Dimension) time.Duration { return -l.Increment(d, tokens) }))
}

// Add implements quota.Syncer: every meter moved by the batch (a read when
// the batch is empty).
func (r *QuotaStore) Add(ctx context.Context, tenant string, l *quota.Limits, requests, tokens int64) (quota.Status, error) {
	if requests == 0 && tokens == 0 {
		return r.Status(ctx, tenant, l)
	}
	return r.move(ctx, tenant, l, meterArgs(l, func(d quota.Dimension) time.Duration { return l.NetIncrement(d, requests, tokens) }))
}

// Status implements quota.Store: one read-only script call.
func (r *QuotaStore) Status(ctx context.Context, tenant string, l *quota.Limits) (quota.Status, error) {
	_, now, t, _, _, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return quota.Status{}, err
	}
	return quota.StatusOf(&t, l, now), nil
}
