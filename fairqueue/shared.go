package fairqueue

import "math"

// Shared virtual time: gateways in front of one pool exchange the cost
// they charged each tenant (package cluster, through Redis), and each
// applies what the others charged to its own copy of the tenant, so that
// a tenant served heavily through one gateway is behind on the others.
// See doc.go, "Several gateways", for the bound.

// Served is cost charged to a tenant: what one gateway reports of its own
// service (TakeServed) and applies of the others' (ChargeRemote). The
// cost is in the queue's cost units: estimates at dispatch, corrected
// (either sign) when the usage is known, as the tenant's own virtual time
// was. Package cluster carries it between gateways; with Group it is the
// undeclared tenants' cost together (Tenant is then empty), so that the
// names callers choose never leave the gateway.
type Served struct {
	Tenant string
	Cost   float64
	Group  bool
}

// TakeServed appends to dst the cost charged to each tenant since the
// previous call, one entry per name, and clears it. The first call starts
// the bookkeeping (a queue that never shares pays nothing for it), so it
// returns nothing. O(tenants charged since the previous call).
func (q *Queue) TakeServed(dst []Served) []Served {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shareServed = true
	return q.drainServedLocked(dst, true)
}

// drainServedLocked clears the service noted since the last call,
// appending it to dst when keep (TakeServed) and dropping it otherwise
// (StopServed).
func (q *Queue) drainServedLocked(dst []Served, keep bool) []Served {
	start := len(dst)
	group := 0.0
	for _, t := range q.shareDirty {
		switch {
		case !keep || t.shareDelta == 0:
		case t.group != nil:
			// Undeclared tenants go as their group: the names callers
			// choose never reach the other gateways (nor Redis), and an
			// entry is bounded by the declared tenants.
			group += t.shareDelta
		default:
			dst = append(dst, Served{Tenant: t.name, Cost: t.shareDelta})
		}
		t.shareDelta, t.shareListed = 0, false
	}
	if keep && len(q.shareDirty) > 1 {
		// A tenant forgotten and seen again within one interval is listed
		// twice (two *tenant): one entry per name, or a reader keeping
		// the last field of a name would drop a charge.
		dst = mergeByName(dst, start, q.shareNames)
	}
	if group != 0 {
		dst = append(dst, Served{Group: true, Cost: group})
	}
	clear(q.shareDirty)
	q.shareDirty = q.shareDirty[:0]
	return dst
}

// mergeByName sums the entries of dst[start:] that share a name into the
// first of them, keeping their order; names is a scratch map.
func mergeByName(dst []Served, start int, names map[string]int) []Served {
	clear(names)
	out := dst[:start]
	for _, s := range dst[start:] {
		if i, ok := names[s.Tenant]; ok {
			out[i].Cost += s.Cost
			continue
		}
		names[s.Tenant] = len(out)
		out = append(out, s)
	}
	return out
}

// StopServed ends the bookkeeping TakeServed started (a reload turned
// sharing off) and drops what was not taken, so that sharing turned on
// again later does not send stale service.
func (q *Queue) StopServed() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shareServed = false
	q.drainServedLocked(nil, false)
}

// noteServedLocked records a charge of d to t for TakeServed.
func (q *Queue) noteServedLocked(t *tenant, d float64) {
	if !q.shareServed {
		return
	}
	if !t.shareListed {
		t.shareListed = true
		q.shareDirty = append(q.shareDirty, t)
	}
	t.shareDelta += d
}

// ChargeRemote applies what other gateways charged: each tenant with
// requests queued here has its virtual time (and its group's) moved as by a
// back-fill of that cost, so that its next requests here take their turn
// behind what it was served elsewhere. A refund gives back at most what
// ChargeRemote charged since the tenant was last idle (remoteDebt). A tenant
// with nothing queued here is left alone: it rejoins at the queue's virtual
// time, like any idle tenant. It reports how many entries it applied.
func (q *Queue) ChargeRemote(served []Served) int {
	q.mu.Lock()
	defer q.unlock()
	n := 0
	for _, s := range served {
		t := q.group
		if !s.Group {
			t = q.tenants[s.Tenant]
		}
		if q.chargeRemoteLocked(t, s.Cost) {
			n++
		}
	}
	return n
}

// chargeRemoteLocked applies one entry of ChargeRemote to t, the tenant it
// names or the undeclared tenants' group, and reports whether it did. A
// group entry moves the group alone: it competes with the declared
// tenants by its weight, and its members are compared among themselves on
// this gateway's service.
func (q *Queue) chargeRemoteLocked(t *tenant, cost float64) bool {
	if t == nil || t.queued == 0 || cost == 0 || math.IsNaN(cost) || math.IsInf(cost, 0) {
		return false
	}
	d := t.remoteChargeLocked(cost)
	if d == 0 {
		return false
	}
	moved := t.backfillLocked(d)
	if g := t.group; g != nil && g.queued > 0 {
		if gd := g.remoteChargeLocked(d); gd != 0 && g.backfillLocked(gd) {
			moved = true
		}
	}
	if moved {
		q.fixFlowsLocked(t)
	}
	return true
}

// remoteChargeLocked records a charge of d from other gateways on t and
// returns what of it applies: all of a cost, and of a refund at most what
// was charged since t came back from idle (remoteDebt).
func (t *tenant) remoteChargeLocked(d float64) float64 {
	if d < 0 {
		d = -min(-d, t.remoteDebt)
	}
	t.remoteDebt += d
	return d
}
