package fairqueue

import "sort"

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

// Stats is a consistent snapshot of the queue.
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
	// Remembered is how many tenants the queue holds state for: those
	// queued, in flight, or idle for less than IdleForget.
	Remembered int
	// Water is the queue's fill level (see Queue.Water).
	Water   float64
	Tenants []TenantStats
}

// Stats returns a snapshot; with tenants, one entry per tenant the queue
// currently remembers, sorted by name.
func (q *Queue) Stats(tenants bool) Stats {
	q.mu.Lock()
	s := Stats{Healthy: q.healthy, Capacity: q.capacity, TokenCapacity: q.tokenCap,
		Queued: q.queued, QueuedCost: q.queuedCost, Inflight: q.inflight,
		InflightCost: q.inflightCost, BoostedInflight: q.boostedInflight,
		QueuedBytes: q.queuedBytes, Remembered: len(q.tenants), Water: q.waterLocked()}
	if tenants {
		s.Tenants = make([]TenantStats, 0, len(q.tenants))
		for _, t := range q.tenants {
			s.Tenants = append(s.Tenants, TenantStats{Name: t.name, Known: t.known,
				Weight: t.weight, Queued: t.queued, QueuedCost: t.queuedCost,
				Inflight: t.inflight, Served: t.served, VirtualTime: t.vt - t.credit})
		}
	}
	q.mu.Unlock()
	// O(n log n), outside the lock: dispatch waits only for the copy.
	sort.Slice(s.Tenants, func(i, j int) bool { return s.Tenants[i].Name < s.Tenants[j].Name })
	return s
}

// Water is the queue's fill level: the larger of queued requests over
// MaxQueue and the token term over MaxQueueTokens (0 when neither is set).
//
// In the token term each queued request counts at most waterCap tokens:
// MaxQueueTokens/MaxWaterShareInverse, or the mean room per request
// (MaxQueueTokens/MaxQueue) when that is larger. So no single request moves
// the water level by more than 1/MaxWaterShareInverse (5 points): one
// maximum-size request on an empty queue cannot engage a step, while a
// crowd of large requests still raises the level as its tokens do. The
// admission caps themselves (MaxQueueTokens) count every token.
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
		if x := float64(q.waterCost) / float64(q.cfg.MaxQueueTokens); x > w {
			w = x
		}
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

// recountWaterLocked recomputes the token term after its cap changed (a
// reload): O(queued), as rare as reloads.
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

// Idle reports whether a request enqueued now would be dispatched at once:
// nothing waits and a slot is free.
func (q *Queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued == 0 && q.inflight < q.capacity
}

// BackloggedWeight is the weight of the tenants with work queued or in
// flight: the declared ones' weights, plus the undeclared group's weight
// once if any of them has work. It is what this queue's claim on a pool
// shared with other gateways weighs (cluster share_slots). O(tenants)
// under the lock: for a sync every 100 ms, not for the request path.
func (q *Queue) BackloggedWeight() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := 0.0
	if q.group.queued > 0 || q.group.inflight > 0 {
		w = q.group.weight
	}
	for _, t := range q.tenants {
		if t.group == nil && (t.queued > 0 || t.inflight > 0) {
			w += t.weight
		}
	}
	return w
}
