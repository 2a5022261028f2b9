package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Syncer is the shared side of a Mirror: the store its charges are pushed
// to and its meters read back from. Memory and cluster.QuotaStore implement it.
type Syncer interface {
	// Add moves tenant's meters by a batch of charges already decided
	// elsewhere, without a test: requests requests and tokens tokens,
	// either negative for a net refund (see the package function Add),
	// and returns the meters after it. An empty batch only reads them.
	Add(ctx context.Context, tenant string, l *Limits, requests, tokens int64) (Status, error)
}

// Scaled is implemented by a Store that decides on other limits than its
// callers give it (a Mirror: 1/Instances of them). A caller comparing a
// request's increment with a Status computes it on DecidesOn(l).
type Scaled interface {
	DecidesOn(l *Limits) *Limits
}

// MirrorOptions configures a Mirror. The zero value is usable.
type MirrorOptions struct {
	// Instances is the number of gateways that share the Syncer: each
	// decides alone on 1/Instances of the limits.
	Instances int
	// Clock reads the time (time.Now when nil).
	Clock func() time.Time
}

// mirrorForget is how long a Mirror keeps syncing a meter nobody called
// and that has nothing to push.
const mirrorForget = time.Minute

// Mirror is a Store for meters a queue decides on under its lock whose
// limits several gateways share (a cluster's provider account): every call
// is answered by a local Memory on 1/Instances of the limits, with no
// network, so N <= Instances gateways together never admit more than one
// store on the full limits, whether Redis answers or not. The cost: a
// gateway never takes more than its share, even under an uneven load.
//
// Sync, called off the lock every sync interval, pushes this gateway's net
// charges to the shared store and reads the shared meters back. A shared
// debt past twice the tolerance plus the time since the previous Sync
// holds this gateway back until it is within that again: the safety net
// for more gateways than Instances. (The second tolerance keeps a cluster
// within its limits from holding back: there the shared debt stays within
// one tolerance plus each gateway's last request.) A failed Sync drops its
// batch, so nothing is pushed twice.
type Mirror struct {
	sharedMu sync.Mutex
	shared   Syncer // guarded by sharedMu
	local    *Memory
	share    float64
	clock    func() time.Time

	mu     sync.Mutex
	meters map[string]*mirrorMeter // guarded by mu

	syncMu   sync.Mutex // one Sync at a time
	lastSync time.Time  // guarded by syncMu
	batch    []mirrorPush

	holds atomic.Uint64
}

// mirrorMeter is what a Mirror keeps of one meter between syncs.
type mirrorMeter struct {
	limits *Limits // the full limits last given for it
	// requests and tokens are the net charges since the last Sync.
	requests, tokens int64
	used             time.Time // the last call on it
}

type mirrorPush struct {
	key              string
	limits           *Limits
	requests, tokens int64
}

var (
	_ Store  = (*Mirror)(nil)
	_ Scaled = (*Mirror)(nil)
)

// NewMirror returns a Mirror deciding on a local Memory on the clock of
// opts, and syncing with shared.
func NewMirror(shared Syncer, opts MirrorOptions) *Mirror {
	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}
	return &Mirror{shared: shared, local: NewMemory(clock), share: instanceShare(opts.Instances),
		clock: clock, meters: make(map[string]*mirrorMeter)}
}

// SetShared makes s the store the next Syncs push to, the local meters
// kept: a reload's new Redis client takes over without a fresh burst.
func (m *Mirror) SetShared(s Syncer) {
	m.sharedMu.Lock()
	defer m.sharedMu.Unlock()
	m.shared = s
}

// DecidesOn implements Scaled: the local decisions are on 1/Instances of
// l.
func (m *Mirror) DecidesOn(l *Limits) *Limits { return l.Scale(m.share) }

// Holds is the number of times a Sync found a shared meter past its
// tolerance and held this gateway back.
func (m *Mirror) Holds() uint64 { return m.holds.Load() }

// Pending reports whether charges were made since the last Sync: a
// caller about to drop the Mirror syncs it once more if so.
func (m *Mirror) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.meters {
		if e.requests != 0 || e.tokens != 0 {
			return true
		}
	}
	return false
}

// note records a call on key, with the net charge it made.
func (m *Mirror) note(key string, l *Limits, requests, tokens int64) {
	now := m.clock()
	m.mu.Lock()
	e := m.meters[key]
	if e == nil {
		e = &mirrorMeter{}
		m.meters[key] = e
	}
	e.limits, e.used = l, now
	e.requests += requests
	e.tokens += tokens
	m.mu.Unlock()
}

// Peek implements Store, locally.
func (m *Mirror) Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error) {
	m.note(tenant, l, 0, 0)
	return m.local.Peek(ctx, tenant, m.DecidesOn(l), ahead)
}

// Charge implements Store, locally; an allowed charge is pushed at the
// next Sync.
func (m *Mirror) Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error) {
	d, err := m.local.Charge(ctx, tenant, m.DecidesOn(l), tokens)
	if d.Allowed {
		m.note(tenant, l, 1, max(tokens, 0))
	} else {
		m.note(tenant, l, 0, 0)
	}
	return d, err
}

// Book implements Store, locally, on this gateway's share; a booking is
// pushed at the next Sync.
func (m *Mirror) Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error) {
	d, err := m.local.Book(ctx, tenant, m.DecidesOn(l), tokens, maxWait, lead)
	if d.Allowed {
		m.note(tenant, l, 1, max(tokens, 0))
	} else {
		m.note(tenant, l, 0, 0)
	}
	return d, err
}

// Reconcile implements Store, locally; the difference is pushed at the
// next Sync.
func (m *Mirror) Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error) {
	m.note(tenant, l, 0, max(actual, 0)-max(estimated, 0))
	return m.local.Reconcile(ctx, tenant, m.DecidesOn(l), estimated, actual)
}

// Refund implements Store, locally; the refund is pushed at the next
// Sync.
func (m *Mirror) Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error) {
	m.note(tenant, l, -1, -max(tokens, 0))
	return m.local.Refund(ctx, tenant, m.DecidesOn(l), tokens)
}

// Status implements Store: the local meter, at this gateway's share.
func (m *Mirror) Status(ctx context.Context, tenant string, l *Limits) (Status, error) {
	m.note(tenant, l, 0, 0)
	return m.local.Status(ctx, tenant, m.DecidesOn(l))
}

// Sync pushes the net charges on each meter since the last Sync to the
// shared store, one Add a meter, and holds this gateway back where needed
// (see Mirror). It makes network calls: call it off the callers' locks.
// It returns the calls' errors, joined.
func (m *Mirror) Sync(ctx context.Context) error {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()
	m.sharedMu.Lock()
	shared := m.shared
	m.sharedMu.Unlock()
	now := m.clock()
	var span time.Duration
	if !m.lastSync.IsZero() {
		span = max(now.Sub(m.lastSync), 0)
	}
	m.lastSync = now
	m.batch = m.batch[:0]
	m.mu.Lock()
	for k, e := range m.meters {
		if e.requests == 0 && e.tokens == 0 && now.Sub(e.used) > mirrorForget {
			delete(m.meters, k)
			continue
		}
		m.batch = append(m.batch, mirrorPush{key: k, limits: e.limits, requests: e.requests, tokens: e.tokens})
		e.requests, e.tokens = 0, 0
	}
	m.mu.Unlock()
	var errs []error
	for i := range m.batch {
		p := &m.batch[i]
		st, err := shared.Add(ctx, p.key, p.limits, p.requests, p.tokens)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.holdBack(p.key, p.limits, st, span)
	}
	clear(m.batch)
	return errors.Join(errs...)
}

// holdBack takes a shared meter's debt into the local one when it is past
// twice the tolerance plus span (see Mirror).
func (m *Mirror) holdBack(key string, l *Limits, st Status, span time.Duration) {
	var debt [numDims]int64
	over := false
	for i := 0; i < numDims; i++ {
		ms := st.at(i)
		if !ms.Enabled || l.interval[i] == 0 {
			continue
		}
		if d, limit := int64(ms.Reset), 2*l.tolerance+int64(span); d > limit {
			// Locally conforming again when the shared debt is back
			// at the limit: a local debt of d - limit + tolerance.
			debt[i], over = d-limit+l.tolerance, true
		}
	}
	if over {
		m.holds.Add(1)
		m.local.raise(key, m.DecidesOn(l), debt)
	}
}
