package fairqueue

import (
	"math"
	"runtime"
	"slices"
	"strings"
)

// TenantStats is one tenant's view for metrics and reports.
type TenantStats struct {
	Name       string
	Known      bool
	Weight     float64
	Queued     int
	QueuedCost int64 // estimated tokens queued (also with CostRequests)
	Inflight   int
	// Served is the cost charged so far: estimates at dispatch, corrected
	// to actual cost by back-fill on completion.
	Served float64
	// VirtualTime is the tenant's virtual time (served / weight, lifted),
	// net of refunds not yet applied to its ordering.
	VirtualTime float64
}

// Stats is a snapshot of the queue (see Queue.Stats for how consistent).
type Stats struct {
	Healthy         int
	Capacity        int
	TokenCapacity   int64
	Queued          int
	QueuedCost      int64 // estimated tokens queued (also with CostRequests)
	Inflight        int
	InflightCost    int64 // estimated tokens in flight, what the token cap gates
	BoostedInflight int
	// QueuedBytes is Request.Bytes summed over queued requests.
	QueuedBytes int64
	// Remembered is how many tenants the queue holds state for.
	Remembered int
	// Water is the queue's fill level (see Queue.Water).
	Water   float64
	Tenants []TenantStats
}

// statsChunk is how many tenants Stats copies per hold of the queue's
// lock: a few microseconds of copying.
const statsChunk = 256

// statsPause runs between Stats' chunks, the lock released (tests replace it).
var statsPause = runtime.Gosched // let a dispatch waiting for the lock have it

// Stats returns a snapshot; with tenants, one entry per tenant the queue
// remembers, sorted by name. The totals are one consistent instant. The
// tenants are copied statsChunk at a time, the lock released between
// chunks: each entry is consistent in itself, every tenant remembered for
// the whole copy appears exactly once, and one created or forgotten
// meanwhile appears once at most.
func (q *Queue) Stats(tenants bool) Stats {
	if !tenants {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.statsLocked()
	}
	// One copy at a time: the cursor it leaves on the queue is its own.
	q.statsMu.Lock()
	defer q.statsMu.Unlock()
	s, out := q.copyTenants()
	// Of two entries with one name the later copy is kept: reversed, then
	// sorted stably, it comes first.
	slices.Reverse(out)
	slices.SortStableFunc(out, func(a, b TenantStats) int { return strings.Compare(a.Name, b.Name) })
	s.Tenants = slices.CompactFunc(out, func(a, b TenantStats) bool { return a.Name == b.Name })
	return s
}

// copyTenants copies the totals and, in chunks, the tenants for Stats,
// which holds statsMu.
func (q *Queue) copyTenants() (Stats, []TenantStats) {
	var out []TenantStats
	q.mu.Lock()
	s := q.statsLocked()
	q.scan = 0
	for {
		if need := statsChunk + len(q.scanMoved); cap(out)-len(out) < need {
			// Allocated, and grown (geometrically once copying began),
			// outside the lock. Forgets may have shrunk the roster below
			// the cursor.
			want := max(len(q.roster)-q.scan, 0) + need
			q.mu.Unlock()
			out = append(make([]TenantStats, 0, len(out)+want+max(want/16, len(out))), out...)
			q.mu.Lock()
			continue
		}
		// Tenants moved behind the cursor (forget's swap-remove) are
		// copied here, unless forgotten since.
		for _, t := range q.scanMoved {
			if t.rosterIdx >= 0 {
				out = append(out, t.statsLocked())
			}
		}
		clear(q.scanMoved)
		q.scanMoved = q.scanMoved[:0]
		// Forgets may have shrunk the roster below the cursor: what stood
		// ahead of it then moved behind it and is in scanMoved.
		start := min(q.scan, len(q.roster))
		end := min(start+statsChunk, len(q.roster))
		for _, t := range q.roster[start:end] {
			out = append(out, t.statsLocked())
		}
		q.scan = end
		if end == len(q.roster) {
			break
		}
		q.mu.Unlock()
		statsPause()
		q.mu.Lock()
	}
	q.scan = -1
	q.mu.Unlock()
	return s, out
}

// statsLocked is the snapshot's totals.
func (q *Queue) statsLocked() Stats {
	return Stats{Healthy: q.healthy, Capacity: q.capacity, TokenCapacity: q.tokenCap,
		Queued: q.queued, QueuedCost: q.queuedCost, Inflight: q.inflight,
		InflightCost: q.inflightCost, BoostedInflight: q.boostedInflight,
		QueuedBytes: q.queuedBytes, Remembered: len(q.tenants), Water: q.waterLocked()}
}

func (t *tenant) statsLocked() TenantStats {
	return TenantStats{Name: t.name, Known: t.known,
		Weight: t.weight, Queued: t.queued, QueuedCost: t.queuedCost,
		Inflight: t.inflight, Served: t.served, VirtualTime: t.vt - t.credit}
}

// addRosterLocked lists a new tenant. Appended past the cursor, it is
// copied by a Stats under way.
func (q *Queue) addRosterLocked(t *tenant) {
	t.rosterIdx = int32(len(q.roster))
	q.roster = append(q.roster, t)
}

// removeRosterLocked unlists a forgotten tenant in O(1): the last tenant
// takes its place, and a Stats copy is told when that moves it behind its
// cursor (scanMoved).
func (q *Queue) removeRosterLocked(t *tenant) {
	i, last := int(t.rosterIdx), len(q.roster)-1
	if m := q.roster[last]; i != last {
		q.roster[i], m.rosterIdx = m, int32(i)
		if q.scan >= 0 && i < q.scan && last >= q.scan {
			q.scanMoved = append(q.scanMoved, m)
		}
	}
	q.roster[last] = nil
	q.roster = q.roster[:last]
	t.rosterIdx = -1
	// Like the map (forgetLocked), give back a burst's room.
	if c := cap(q.roster); c >= 1024 && last < c/4 {
		q.roster = append(make([]*tenant, 0, 2*last), q.roster...)
	}
}

// busyLocked keeps BackloggedWeight's sum as t's queued count changes.
// An undeclared tenant counts through the group (publishBackloggedLocked).
func (q *Queue) busyLocked(t *tenant) {
	if t.group != nil || (t.queued > 0) == t.busy {
		return
	}
	b := !t.busy
	t.busy = b
	switch {
	case b:
		q.busyN++
		q.busyWeight += t.weight
	case q.busyN == 1:
		q.busyN, q.busyWeight = 0, 0 // no rounding left over from the additions
	default:
		q.busyN--
		q.busyWeight -= t.weight
	}
	q.publishBackloggedLocked()
}

// recountBusyLocked recomputes BackloggedWeight's sum after weights
// changed.
func (q *Queue) recountBusyLocked() {
	q.busyWeight = 0
	for _, t := range q.roster {
		if t.busy {
			q.busyWeight += t.weight
		}
	}
	q.publishBackloggedLocked()
}

// publishBackloggedLocked stores BackloggedWeight's value after a change.
func (q *Queue) publishBackloggedLocked() {
	w := q.busyWeight
	if q.group.queued > 0 {
		w += q.group.weight
	}
	q.backlogged.Store(math.Float64bits(w))
}

// Water is the queue's fill level: the larger of queued requests over
// MaxQueue and the token term over MaxQueueTokens (0 when neither is set).
// In the token term each queued request counts at most waterCap tokens
// (MaxQueueTokens/MaxWaterShareInverse, or MaxQueueTokens/MaxQueue when
// larger), so no single request moves the level by more than
// 1/MaxWaterShareInverse, while a crowd of large requests still raises it.
func (q *Queue) Water() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waterLocked()
}

// MaxWaterShareInverse is 1 over the most one request may add to the water
// level through its tokens (see Queue.Water).
const MaxWaterShareInverse = 20

func (q *Queue) waterLocked() float64 {
	w := 0.0
	if q.cfg.MaxQueue > 0 {
		w = float64(q.queued) / float64(q.cfg.MaxQueue)
	}
	if q.cfg.MaxQueueTokens > 0 {
		w = max(w, float64(q.waterCost)/float64(q.cfg.MaxQueueTokens))
	}
	return w
}

// waterCap is the most tokens one request contributes to the water level's
// token term (see Queue.Water); 0 without MaxQueueTokens.
func waterCap(c *Config) int64 {
	m := c.MaxQueueTokens
	if m <= 0 {
		return 0
	}
	capTokens := max(m/MaxWaterShareInverse, 1)
	if c.MaxQueue > 0 {
		capTokens = max(capTokens, m/int64(c.MaxQueue))
	}
	return capTokens
}

// recountWaterLocked recomputes the token term after its cap changed.
func (q *Queue) recountWaterLocked() {
	q.waterCost = 0
	add := func(l *ticketList) {
		for tk := l.head; tk != nil; tk = tk.next {
			q.waterCost += min(tk.tokens, q.waterCap)
		}
	}
	add(&q.boost)
	for _, t := range q.tenants {
		for _, f := range t.flows {
			add(&f.q)
		}
	}
}

// BackloggedWeight is the weight of the tenants with requests queued (the
// undeclared group's weight once if any of them has one): what this
// queue's claim on a pool shared with other gateways weighs (cluster
// share_slots). Requests in flight do not count: they hold their slots
// already. O(1), without the lock.
func (q *Queue) BackloggedWeight() float64 {
	return math.Float64frombits(q.backlogged.Load())
}
