package quota

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLocalRetry is how long a Local decides locally after its
// primary failed before it tries the primary again, when its options name
// no other time.
const DefaultLocalRetry = time.Second

// LocalOptions configures a Local. The zero value is usable: one
// instance, DefaultLocalRetry, time.Now, retries on a caller's call.
type LocalOptions struct {
	// Instances is the number of gateways that share the primary. While the
	// primary is unreachable each decides alone on limits scaled by
	// 1/Instances (Limits.Scale), so that together they admit about what
	// the shared store would. 0 or 1: the full limits.
	Instances int
	// Retry is how long after a failure the primary is tried again
	// (DefaultLocalRetry when zero). Between retries every call is
	// answered locally at once: an outage costs a caller the primary's
	// timeout only on the call that finds it, not on every call.
	Retry time.Duration
	// Clock reads the time for the retry schedule (time.Now when nil).
	Clock func() time.Time
	// Probe, when set, tells in the background whether the primary answers
	// again (cluster.NewQuota's reads a meter through the decisions'
	// script): once Retry has passed, a call starts one probe and is
	// answered locally, so no caller waits on a primary that is still down. The probe must bound its own time (a context timeout)
	// and may run while the Local is used. When nil, the first call
	// after Retry goes to the primary itself, and its success ends the
	// outage.
	Probe func(ctx context.Context) error
	// OnChange is called once when the primary fails after answering
	// (degraded true, with the error) and once when a retry or probe finds
	// it answering again (degraded false, nil error): once per outage each,
	// whatever the number of calls. It runs on the caller's or the probe's
	// goroutine and must not block.
	OnChange func(degraded bool, err error)
	// OnLocal is called for each call answered by the local store (a
	// metric's counter); it must not block.
	OnLocal func()
	// Outage tells an error of the primary that says it is unreachable or
	// unfit (nil: every error) from one about a single tenant, such as a
	// key of another type at its name: the call is then decided locally,
	// but no outage starts, so that one bad key does not send every
	// tenant to the local store and back every Retry.
	Outage func(error) bool
}

// Local is a Store that decides on a shared primary (Redis) and, while
// the primary fails, locally: on a Memory with limits scaled by 1/Instances:
// a quota store that is down or slow never fails a request by itself, and
// N instances deciding alone hold a tenant to about its quota, not N
// times it (guarantee 1 per instance, at rate/N; the sum is the rate when
// the load spreads evenly over the instances, less when it does not).
//
// The first failed call starts an outage: that call, and every call until
// the next retry, is decided locally. A retry (the first call after Retry,
// or Probe in the background) that succeeds ends it; calls go to the
// primary again and find it as the instances left it (a restarted Redis
// has forgotten every debt: tenants start at rest). Calls that had been
// sent to the primary before the outage was noticed neither start nor end
// another one when they return, so an outage is reported once.
//
// What a request was charged to the primary and reconciled locally (or the
// reverse) is corrected on the store it is reconciled on: extra debt is
// charged, a refund is clipped at rest as usual. A caller's own context
// ending (cancelled, deadline) is returned as is: it says nothing of the
// primary.
type Local struct {
	primary Store
	local   *Memory
	share   float64
	n       int64 // instances
	retry   int64
	clock   func() time.Time
	probe   func(context.Context) error

	onChange func(bool, error)
	onLocal  func()
	outage   func(error) bool

	// rest holds, per tenant, when the primary's last answer about it
	// (on this instance) said it would be at rest, in Unix ns of the
	// local clock: a Peek with nothing ahead of a tenant seen at rest is
	// answered without a round trip (see Peek).
	restMu    sync.Mutex
	rest      map[string]int64 // guarded by restMu
	nextSweep int64            // guarded by restMu

	degraded atomic.Bool
	outages  atomic.Uint64 // outages ended so far: a call's era
	retryAt  atomic.Int64  // Unix ns: while degraded, the next retry's time
	probing  atomic.Bool
	locals   atomic.Uint64
}

var (
	_ Store  = (*Local)(nil)
	_ Remote = (*Local)(nil)
)

// Remote implements Remote: a Local is remote when its primary is.
func (f *Local) Remote() bool {
	r, ok := f.primary.(Remote)
	return ok && r.Remote()
}

// NewLocal returns a Local deciding on primary, and on local while
// primary fails.
func NewLocal(primary Store, local *Memory, opts LocalOptions) *Local {
	f := &Local{
		primary:  primary,
		local:    local,
		share:    1,
		n:        1,
		retry:    int64(DefaultLocalRetry),
		clock:    opts.Clock,
		probe:    opts.Probe,
		onChange: opts.OnChange,
		onLocal:  opts.OnLocal,
		outage:   opts.Outage,
		rest:     make(map[string]int64),
	}
	if opts.Instances > 1 {
		f.share, f.n = instanceShare(opts.Instances), int64(opts.Instances)
	}
	if opts.Retry > 0 {
		f.retry = int64(opts.Retry)
	}
	if f.clock == nil {
		f.clock = time.Now
	}
	return f
}

// Degraded reports whether decisions are local now: the primary failed and
// no retry has found it answering since.
func (f *Local) Degraded() bool { return f.degraded.Load() }

// LocalCalls is the number of calls answered by the local store so far.
func (f *Local) LocalCalls() uint64 { return f.locals.Load() }

// Poll starts a Probe when the outage's retry is due, so that a gateway
// with no calls to make (no traffic under a quota) still finds its primary
// back and reports it. It never waits; without a Probe it does nothing.
func (f *Local) Poll() {
	if f.probe != nil {
		f.usePrimary()
	}
}

// call is what a call to the primary needs to know when it returns.
type call struct {
	use   bool   // it went to the primary
	retry bool   // it is the outage's retry: its success ends the outage
	era   uint64 // outages ended when it started
}

// usePrimary says whether a call goes to the primary.
func (f *Local) usePrimary() call {
	c := call{use: true, era: f.outages.Load()}
	if !f.degraded.Load() {
		return c
	}
	at := f.retryAt.Load()
	now := f.clock().UnixNano()
	if now < at {
		return call{}
	}
	if f.probe != nil {
		if f.probing.CompareAndSwap(false, true) {
			go f.runProbe()
		}
		return call{}
	}
	// One caller per Retry claims the retry; the others stay local.
	c.use, c.retry = f.retryAt.CompareAndSwap(at, now+f.retry), true
	return c
}

// runProbe asks Probe whether the primary is back. A panic in it is an
// error, not a crash of the process hosting the store.
func (f *Local) runProbe() {
	defer f.probing.Store(false)
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("quota: probe panicked: %v", r)
			}
		}()
		return f.probe(context.Background())
	}()
	if err != nil {
		f.retryAt.Store(f.clock().UnixNano() + f.retry)
		return
	}
	f.recovered()
}

// answered records the outcome of a call to the primary and reports
// whether its answer stands; false: decide locally.
func (f *Local) answered(ctx context.Context, err error, c call) bool {
	if err == nil {
		if c.retry {
			f.recovered()
		}
		return true
	}
	if ctx.Err() != nil {
		return true // the caller's own context ended: its error stands
	}
	switch {
	case f.outage != nil && !f.outage(err):
		// The primary answered, about this tenant only.
		if c.retry {
			f.recovered()
		}
	case c.retry:
		// The retry failed: the outage goes on, the next retry is
		// already scheduled (usePrimary).
	case f.outages.Load() != c.era:
		// Sent before an outage that has ended since: it says nothing
		// of the primary now.
	case f.degraded.CompareAndSwap(false, true):
		f.retryAt.Store(f.clock().UnixNano() + f.retry)
		if f.onChange != nil {
			f.onChange(true, err)
		}
	}
	return false
}

func (f *Local) recovered() {
	f.outages.Add(1)
	if f.degraded.CompareAndSwap(true, false) && f.onChange != nil {
		f.onChange(false, nil)
	}
}

// restSweepEvery is how often, in clock time, the record of tenants seen
// at rest drops those seen at rest that long ago: forgetting one only
// costs its next Peek a round trip.
const restSweepEvery = time.Minute

// observe records when the primary's answer st says tenant will be at
// rest.
func (f *Local) observe(tenant string, st Status, err error) {
	if err != nil {
		return
	}
	now := f.clock().UnixNano()
	at := now + int64(max(st.Requests.Reset, st.Tokens.Reset, st.Joint.Reset))
	f.restMu.Lock()
	defer f.restMu.Unlock()
	f.rest[tenant] = at
	if now >= f.nextSweep {
		for k, v := range f.rest {
			if v < now-int64(restSweepEvery) {
				delete(f.rest, k)
			}
		}
		f.nextSweep = now + int64(restSweepEvery)
	}
}

// seenAtRest reports whether the primary's last answer about tenant said
// it would be at rest by now.
func (f *Local) seenAtRest(tenant string) bool {
	now := f.clock().UnixNano()
	f.restMu.Lock()
	at, ok := f.rest[tenant]
	f.restMu.Unlock()
	return ok && at <= now
}

// instanceShare is the share of a store's limits each of n instances
// decides on alone (a Local in an outage, a Mirror always): 1/n, so
// that together they admit at most what the shared store would
// (Limits.Scale); 1 for n <= 1.
func instanceShare(n int) float64 {
	if n <= 1 {
		return 1
	}
	return 1 / float64(n)
}

// localLimits counts a local answer and returns the limits it decides on.
func (f *Local) localLimits(l *Limits) *Limits {
	f.locals.Add(1)
	if f.onLocal != nil {
		f.onLocal()
	}
	return l.Scale(f.share)
}

// Peek implements Store. The backlog ahead is the tenant's at this
// instance; on the shared store it counts Instances times, as the
// tenant's backlog in the cluster when the load balancer spreads it
// evenly (the other instances' queues are not in the store). Without it,
// each instance would admit a wait budget's worth of the quota, together
// Instances times what the quota can serve within the budget, and the
// excess would expire in the queues instead of being refused at once with
// its Retry-After. Locally the backlog counts once, against 1/Instances of
// the limits: the same wait.
//
// A Peek with nothing ahead, for a tenant whose last answer from the
// primary on this instance (a charge, a reconcile, a status) said it would
// be at rest by now, is allowed without asking the primary: a tenant at
// rest is always allowed, so the round trip would only find out whether
// other instances charged it since. If they did, the request is queued
// rather than refused at once, and the Charge at dispatch, which always
// asks the primary, holds it to the quota. For a tenant under its quota,
// this makes a request two round trips (Charge, Reconcile) instead of
// three.
func (f *Local) Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	if c := f.usePrimary(); c.use {
		if ahead == (Backlog{}) && f.seenAtRest(tenant) {
			t := Fresh(0)
			return Decision{Allowed: true, At: f.clock(), Status: StatusOf(&t, l, 0)}, nil
		}
		d, err := f.primary.Peek(ctx, tenant, l, Backlog{Requests: ahead.Requests * f.n, Tokens: ahead.Tokens * f.n})
		if f.answered(ctx, err, c) {
			f.observe(tenant, d.Status, err)
			return d, err
		}
	}
	return f.local.Peek(ctx, tenant, f.localLimits(l), ahead)
}

// Charge implements Store.
func (f *Local) Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	if c := f.usePrimary(); c.use {
		d, err := f.primary.Charge(ctx, tenant, l, tokens)
		if f.answered(ctx, err, c) {
			f.observe(tenant, d.Status, err)
			return d, err
		}
	}
	return f.local.Charge(ctx, tenant, f.localLimits(l), tokens)
}

// Book implements Store: on the primary, the cluster's first come, first
// served; locally, on 1/Instances of the limits, this instance's.
func (f *Local) Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error) {
	if c := f.usePrimary(); c.use {
		d, err := f.primary.Book(ctx, tenant, l, tokens, maxWait, lead)
		if f.answered(ctx, err, c) {
			f.observe(tenant, d.Status, err)
			return d, err
		}
	}
	return f.local.Book(ctx, tenant, f.localLimits(l), tokens, maxWait, lead)
}

// Reconcile implements Store.
func (f *Local) Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	if c := f.usePrimary(); c.use {
		st, err := f.primary.Reconcile(ctx, tenant, l, estimated, actual)
		if f.answered(ctx, err, c) {
			f.observe(tenant, st, err)
			return st, err
		}
	}
	return f.local.Reconcile(ctx, tenant, f.localLimits(l), estimated, actual)
}

// Refund implements Store.
func (f *Local) Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	if c := f.usePrimary(); c.use {
		st, err := f.primary.Refund(ctx, tenant, l, tokens)
		if f.answered(ctx, err, c) {
			f.observe(tenant, st, err)
			return st, err
		}
	}
	return f.local.Refund(ctx, tenant, f.localLimits(l), tokens)
}

// Status implements Store.
func (f *Local) Status(ctx context.Context, tenant string, l *Limits) (Status, error) {
	if c := f.usePrimary(); c.use {
		st, err := f.primary.Status(ctx, tenant, l)
		if f.answered(ctx, err, c) {
			f.observe(tenant, st, err)
			return st, err
		}
	}
	return f.local.Status(ctx, tenant, f.localLimits(l))
}
