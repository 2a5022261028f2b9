package quota

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLocalRetry is how long a Local decides locally after its primary
// failed before it tries the primary again.
const DefaultLocalRetry = time.Second

// LocalOptions configures a Local. The zero value is usable.
type LocalOptions struct {
	// Instances is the number of gateways sharing the primary; while it is
	// unreachable each decides on limits scaled by 1/Instances.
	Instances int
	// Retry is how long after a failure the primary is tried again
	// (DefaultLocalRetry when zero); calls between are answered locally.
	Retry time.Duration
	// Clock reads the time for the retry schedule (time.Now when nil).
	Clock func() time.Time
	// Probe, when set, tells in the background whether the primary answers
	// again: once Retry has passed a call starts one probe and is answered
	// locally, so no caller waits on a primary still down. It must bound
	// its own time. When nil, the first call after Retry goes to the
	// primary itself.
	Probe func(ctx context.Context) error
	// OnChange is called once when an outage starts (true, the error) and
	// once when it ends (false, nil). It must not block.
	OnChange func(degraded bool, err error)
	// OnLocal is called for each call answered locally; it must not block.
	OnLocal func()
	// Outage tells an error that says the primary is unreachable or unfit
	// (nil: every error) from one about a single tenant (a key of another
	// type): the latter is decided locally without starting an outage, so
	// one bad key does not flap every tenant.
	Outage func(error) bool
}

// Local is a Store that decides on a shared primary (Redis) and, while it
// fails, on a local Memory with limits scaled by 1/Instances: a quota store
// down or slow never fails a request, and N instances alone hold a tenant
// to about its quota, not N times it.
//
// The first failed call starts an outage; a retry (the first call after
// Retry, or Probe) that succeeds ends it. Calls sent before an outage was
// noticed neither start nor end another, so each is reported once. A
// caller's own context ending is returned as is: it says nothing of the
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

	// rest holds, per tenant, when the primary last said it would be at
	// rest (Unix ns, local clock); see Peek.
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

// NewLocal returns a Local on primary, and on local while primary fails.
func NewLocal(primary Store, local *Memory, opts LocalOptions) *Local {
	f := &Local{
		primary:  primary,
		local:    local,
		share:    instanceShare(opts.Instances),
		n:        int64(max(opts.Instances, 1)),
		retry:    int64(DefaultLocalRetry),
		clock:    opts.Clock,
		probe:    opts.Probe,
		onChange: opts.OnChange,
		onLocal:  opts.OnLocal,
		outage:   opts.Outage,
		rest:     make(map[string]int64),
	}
	if opts.Retry > 0 {
		f.retry = int64(opts.Retry)
	}
	if f.clock == nil {
		f.clock = time.Now
	}
	return f
}

// Degraded reports whether decisions are local now.
func (f *Local) Degraded() bool { return f.degraded.Load() }

// LocalCalls is the number of calls answered by the local store so far.
func (f *Local) LocalCalls() uint64 { return f.locals.Load() }

// Poll starts a Probe when a retry is due, so a gateway with no traffic
// under a quota still finds its primary back. It never waits.
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

// runProbe asks Probe whether the primary is back; a panic is an error.
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

// answered records the outcome of a call to the primary, with the status
// st it gave of tenant, and reports whether its answer stands; false:
// decide locally.
func (f *Local) answered(ctx context.Context, err error, c call, tenant string, st Status) bool {
	if err == nil {
		if c.retry {
			f.recovered()
		}
		f.observe(tenant, st)
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

// restSweepEvery is how often the record of tenants seen at rest drops
// those older than this: forgetting one costs a round trip.
const restSweepEvery = time.Minute

// observe records when the primary's answer st says tenant will be at
// rest.
func (f *Local) observe(tenant string, st Status) {
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

// instanceShare is the share of the limits each of n instances decides on
// alone: 1/n, or 1 for n <= 1.
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

// viaPrimary answers call on the primary unless it is in an outage or
// fails, else on the local store with the scaled limits.
func viaPrimary[T any](f *Local, ctx context.Context, tenant string, l *Limits, status func(T) Status, call func(Store, *Limits) (T, error)) (T, error) {
	if c := f.usePrimary(); c.use {
		v, err := call(f.primary, l)
		if f.answered(ctx, err, c, tenant, status(v)) {
			return v, err
		}
	}
	return call(f.local, f.localLimits(l))
}

func decisionStatus(d Decision) Status { return d.Status }
func sameStatus(s Status) Status       { return s }

// Peek implements Store. The backlog ahead counts Instances times on the
// shared store, as the tenant's backlog in an evenly balanced cluster;
// otherwise each instance would admit a wait budget's worth of the quota.
// Locally it counts once, against 1/Instances of the limits.
//
// A Peek with nothing ahead, for a tenant the primary last said would be
// at rest by now, is allowed without a round trip: a tenant at rest is
// always allowed, and the Charge at dispatch, which always asks the
// primary, holds it to the quota if other instances charged it since.
func (f *Local) Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	if c := f.usePrimary(); c.use {
		if ahead == (Backlog{}) && f.seenAtRest(tenant) {
			t := Fresh(0)
			return Decision{Allowed: true, At: f.clock(), Status: StatusOf(&t, l, 0)}, nil
		}
		d, err := f.primary.Peek(ctx, tenant, l, Backlog{Requests: ahead.Requests * f.n, Tokens: ahead.Tokens * f.n})
		if f.answered(ctx, err, c, tenant, d.Status) {
			return d, err
		}
	}
	return f.local.Peek(ctx, tenant, f.localLimits(l), ahead)
}

// Charge implements Store.
func (f *Local) Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	return viaPrimary(f, ctx, tenant, l, decisionStatus, func(s Store, sl *Limits) (Decision, error) {
		return s.Charge(ctx, tenant, sl, tokens)
	})
}

// Book implements Store: on the primary, the cluster's first come, first
// served; locally, this instance's.
func (f *Local) Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error) {
	return viaPrimary(f, ctx, tenant, l, decisionStatus, func(s Store, sl *Limits) (Decision, error) {
		return s.Book(ctx, tenant, sl, tokens, maxWait, lead)
	})
}

// Reconcile implements Store.
func (f *Local) Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	return viaPrimary(f, ctx, tenant, l, sameStatus, func(s Store, sl *Limits) (Status, error) {
		return s.Reconcile(ctx, tenant, sl, estimated, actual)
	})
}

// Refund implements Store.
func (f *Local) Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	return viaPrimary(f, ctx, tenant, l, sameStatus, func(s Store, sl *Limits) (Status, error) {
		return s.Refund(ctx, tenant, sl, tokens)
	})
}

// Status implements Store.
func (f *Local) Status(ctx context.Context, tenant string, l *Limits) (Status, error) {
	return viaPrimary(f, ctx, tenant, l, sameStatus, func(s Store, sl *Limits) (Status, error) {
		return s.Status(ctx, tenant, sl)
	})
}
