package quota

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisPrefix is the key prefix of a Redis store whose options name
// none.
const DefaultRedisPrefix = "fq:quota:"

// DefaultRedisExpiryMargin is how long a Redis store keeps a tenant's key
// past the time the tenant comes to rest, when its options name no margin:
// it absorbs clock differences between a Redis primary and the replica that
// may replace it, so that a key never expires while its tenant still owes.
const DefaultRedisExpiryMargin = time.Second

// RedisOptions configures a Redis store. The zero value is usable.
type RedisOptions struct {
	// Prefix starts every key (DefaultRedisPrefix when empty). It must not
	// contain '{': the tenant's name, in braces after it, is the key's
	// Cluster hash tag.
	Prefix string
	// ExpiryMargin is added to a key's time to rest
	// (DefaultRedisExpiryMargin when zero; negative is taken as zero).
	ExpiryMargin time.Duration
	// Timeout, when positive, bounds each call: the call runs under
	// context.WithTimeout(ctx, Timeout). It bounds the socket wait only if
	// the client has ContextTimeoutEnabled (see the package doc).
	Timeout time.Duration
}

//go:embed redis.lua
var redisLua string

// redisScript is the one script of every call; Run sends EVALSHA and falls
// back to EVAL (which caches it) on NOSCRIPT.
var redisScript = redis.NewScript(redisLua)

// Redis is the Store shared by several gateways: each tenant's three TATs in
// one Redis hash, each call one EVALSHA of one Lua script that reads the
// time from Redis TIME, so that the instances' clocks never matter and
// every decision is atomic across instances. The conformance test and the
// writes run in the script with exact integer arithmetic; the earliest time,
// the reason and the status are computed in Go from the state the script
// returns, by the same functions Memory uses, so that both stores decide
// alike (see the package doc, "# Redis").
//
// Decision.At is on Redis's clock, converted to a time.Time; RetryAfter, a
// difference of two readings of that clock, is the reliable part for a
// caller whose clock differs. Errors are the client's (network, timeout,
// context) or a reply the store cannot read; the caller decides whether to
// fail open. Every method takes the tenant's *Limits, which must not be nil.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	margin  string // expiry margin, decimal milliseconds
	timeout time.Duration

	// onNow, when set (tests only), receives each call's Redis time.
	onNow func(now int64)
}

var (
	_ Store  = (*Redis)(nil)
	_ Remote = (*Redis)(nil)
)

// Remote implements Remote: every call is a round trip to Redis.
func (*Redis) Remote() bool { return true }

// NewRedis returns a Store on client: a *redis.Client, a *redis.ClusterClient
// or a failover client. The client's options decide connection pooling,
// timeouts and retries; the package doc says which suit a quota store.
func NewRedis(client redis.UniversalClient, opts RedisOptions) *Redis {
	if opts.Prefix == "" {
		opts.Prefix = DefaultRedisPrefix
	}
	if opts.ExpiryMargin == 0 {
		opts.ExpiryMargin = DefaultRedisExpiryMargin
	}
	margin := max(opts.ExpiryMargin, 0)
	// Round up: the margin is never shorter than asked.
	ms := (margin + time.Millisecond - 1) / time.Millisecond
	return &Redis{
		client:  client,
		prefix:  opts.Prefix,
		margin:  strconv.FormatInt(int64(ms), 10),
		timeout: opts.Timeout,
	}
}

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

// Key is the Redis key of a meter's hash: the prefix, its namespace, then
// the tenant in braces, its Cluster hash tag, so that every key a later
// script adds for the same tenant lands in the same slot. A name that
// starts with a NUL is one of the gateway's own meters (InternalSpace).
func (r *Redis) Key(tenant string) string {
	if name, ok := strings.CutPrefix(tenant, "\x00"); ok {
		return r.prefix + InternalSpace + "{" + name + "}"
	}
	return r.prefix + TenantSpace + "{" + tenant + "}"
}

// Load loads the script into Redis (into every primary of a Cluster), so
// that the first decision after a start or a SCRIPT FLUSH is one round trip
// too. Calling it is optional: without it, the first call on each node
// takes two (EVALSHA answered NOSCRIPT, then EVAL).
func (r *Redis) Load(ctx context.Context) error {
	if err := redisScript.Load(ctx, r.client).Err(); err != nil {
		return fmt.Errorf("quota: loading the redis script: %w", err)
	}
	return nil
}

// RedisOutage reports whether err, returned by a Redis store, may mean
// Redis is unreachable or unfit for quotas (for LocalOptions.Outage),
// rather than that one tenant's key is of another type (WRONGTYPE, which
// Redis sends from inside the script, and miniredis after its own prefix).
func RedisOutage(err error) bool {
	var re redis.Error
	return !errors.As(err, &re) || !strings.Contains(re.Error(), "WRONGTYPE")
}

// Script operations (ARGV[1]).
const (
	opRead      = "r"
	opCharge    = "c"
	opReconcile = "x"
)

// incArg is meter i's increment for tokens as a script argument: "" when
// the meter is off.
func incArg(l *Limits, i int, tokens int64) string {
	return netIncArg(l, i, 1, max(tokens, 0))
}

// netIncArg is a batch's move of meter i (Limits.netInc) as a script
// argument; "" when the meter is off.
func netIncArg(l *Limits, i int, requests, tokens int64) string {
	if l.interval[i] == 0 {
		return ""
	}
	return strconv.FormatInt(l.netInc(i, requests, tokens), 10)
}

// run calls the script once and reads its reply: whether it charged, the
// Redis time and the TATs after the call, all in Unix nanoseconds.
func (r *Redis) run(ctx context.Context, tenant string, args ...any) (charged bool, now int64, t TATs, err error) {
	charged, now, t, _, _, err = r.runAt(ctx, tenant, args...)
	return charged, now, t, err
}

// runAt is run that also returns the time a charge was made as of (now,
// but for a booking ahead) and the meter that set it (-1: none).
func (r *Redis) runAt(ctx context.Context, tenant string, args ...any) (charged bool, now int64, t TATs, at int64, why int, err error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	res, err := redisScript.Run(ctx, r.client, []string{r.Key(tenant)}, args...).Slice()
	if err != nil {
		return false, 0, t, 0, -1, fmt.Errorf("quota: redis store, tenant %q: %w", tenant, err)
	}
	charged, now, t, at, why, err = parseReply(res)
	if err != nil {
		return false, 0, t, 0, -1, fmt.Errorf("quota: redis store, tenant %q: %w", tenant, err)
	}
	if r.onNow != nil {
		r.onNow(now)
	}
	return charged, now, t, at, why, nil
}

var errReply = errors.New("unreadable script reply")

// parseReply reads the script's {allowed, now, q, t, j, at, why}; why
// is returned as a meter index, -1 for none.
func parseReply(res []any) (charged bool, now int64, t TATs, at int64, why int, err error) {
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
	if w := v[n-1]; w < 0 || w > numDims {
		return false, 0, t, 0, -1, fmt.Errorf("%w: meter %d", errReply, w)
	}
	copy(t[:], v[2:2+numDims])
	return v[0] == 1, v[1], t, v[n-2], int(v[n-1]) - 1, nil
}

func redisDecision(ok bool, at int64, reason Dimension, t *TATs, l *Limits, now int64) Decision {
	return Decision{
		Allowed:    ok,
		At:         time.Unix(0, at),
		RetryAfter: time.Duration(at - now),
		Reason:     reason,
		Status:     StatusOf(t, l, now),
	}
}

// Peek implements Store: one script call that reads the tenant's TATs and
// the Redis time; the decision, with the backlog, is Decide's.
func (r *Redis) Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	_, now, t, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return Decision{}, err
	}
	ok, at, reason := Decide(&t, l, now, ahead)
	return redisDecision(ok, at, reason, &t, l, now), nil
}

// Charge implements Store: one script call that tests and charges every
// meter atomically, so that concurrent charges from any number of gateways
// admit exactly what one Memory would.
func (r *Redis) Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	charged, now, t, err := r.run(ctx, tenant, opCharge,
		strconv.FormatInt(l.tolerance, 10), r.margin,
		incArg(l, dimQPS, tokens), incArg(l, dimTokens, tokens), incArg(l, dimJoint, tokens))
	if err != nil {
		return Decision{}, err
	}
	if charged {
		return redisDecision(true, now, "", &t, l, now), nil
	}
	// Refused: the state is the one the script tested, unchanged.
	ok, at, reason := Decide(&t, l, now, Backlog{})
	if ok {
		return Decision{}, fmt.Errorf("quota: redis store, tenant %q: the script refused a charge that Decide allows at %d", tenant, now)
	}
	return redisDecision(false, at, reason, &t, l, now), nil
}

// Book implements Store: Charge's script call, given the longest wait it
// may book: the test, the earliest time and the charge as of it in one
// atomic call, so that bookings from any number of gateways are first
// come, first served.
func (r *Redis) Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error) {
	charged, now, t, at, why, err := r.runAt(ctx, tenant, opCharge,
		strconv.FormatInt(l.tolerance, 10), r.margin,
		incArg(l, dimQPS, tokens), incArg(l, dimTokens, tokens), incArg(l, dimJoint, tokens),
		strconv.FormatInt(int64(min(max(maxWait, 0), maxBookWait)), 10), strconv.FormatInt(int64(max(lead, 0)), 10))
	if err != nil {
		return Decision{}, err
	}
	if charged {
		var reason Dimension
		if why >= 0 {
			reason = dimNames[why]
		}
		return redisDecision(true, at, reason, &t, l, now), nil
	}
	ok, at, reason := Decide(&t, l, now, Backlog{})
	if ok {
		return Decision{}, fmt.Errorf("quota: redis store, tenant %q: the script refused a booking that Decide allows at %d", tenant, now)
	}
	return redisDecision(false, at, reason, &t, l, now), nil
}

// Reconcile implements Store: one script call that moves the token and
// joint meters by the difference of the increments (computed here, as
// Reconcile does), and forgets a tenant that it brings back to rest.
func (r *Redis) Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	diff := func(i int) string {
		if l.interval[i] == 0 {
			return ""
		}
		return strconv.FormatInt(l.inc(i, actual)-l.inc(i, estimated), 10)
	}
	_, now, t, err := r.run(ctx, tenant, opReconcile, "0", r.margin, "", diff(dimTokens), diff(dimJoint))
	if err != nil {
		return Status{}, err
	}
	return StatusOf(&t, l, now), nil
}

// Refund implements Store: the reconcile script with every meter's
// increment taken back, one call.
func (r *Redis) Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	back := func(i int) string {
		if l.interval[i] == 0 {
			return ""
		}
		return strconv.FormatInt(-l.inc(i, tokens), 10)
	}
	_, now, t, err := r.run(ctx, tenant, opReconcile, "0", r.margin, back(dimQPS), back(dimTokens), back(dimJoint))
	if err != nil {
		return Status{}, err
	}
	return StatusOf(&t, l, now), nil
}

// Add implements Syncer: the reconcile script with every meter moved by
// the batch (one call; a read when the batch is empty).
func (r *Redis) Add(ctx context.Context, tenant string, l *Limits, requests, tokens int64) (Status, error) {
	if requests == 0 && tokens == 0 {
		return r.Status(ctx, tenant, l)
	}
	_, now, t, err := r.run(ctx, tenant, opReconcile, "0", r.margin,
		netIncArg(l, dimQPS, requests, tokens), netIncArg(l, dimTokens, requests, tokens), netIncArg(l, dimJoint, requests, tokens))
	if err != nil {
		return Status{}, err
	}
	return StatusOf(&t, l, now), nil
}

// Status implements Store: one read-only script call.
func (r *Redis) Status(ctx context.Context, tenant string, l *Limits) (Status, error) {
	_, now, t, err := r.run(ctx, tenant, opRead)
	if err != nil {
		return Status{}, err
	}
	return StatusOf(&t, l, now), nil
}
