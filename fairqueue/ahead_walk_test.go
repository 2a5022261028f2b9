package fairqueue

import "time"

// The walk over every backlogged flow that workAheadLocked did before the
// work-ahead index (ahead.go): O(F) per ETA. It stays here as the oracle
// the index is tested against (ahead_test.go) and the baseline of
// BenchmarkAdmissionETA.

// workAheadWalkLocked is the work dispatched before a request of tenant t,
// class cq and cost cost with ownAhead of its tenant's cost queued before
// it: its tenant's own queue ahead of it, each other backlogged tenant's
// queued cost up to the same virtual finish by weight, the boost lane, and
// the work that frees a slot when none is free. With others false the
// other tenants are left out: a lower bound in O(1), where the full sum
// costs O(backlogged flows).
func (q *Queue) workAheadWalkLocked(now time.Time, t *tenant, cq *classQ, ownAhead, cost int64, others bool) float64 {
	a := q.adm
	ahead := float64(ownAhead + a.boostCost)
	if q.inflight >= q.capacity || q.queued > 0 {
		// Even first in line, a request waits for a slot to free.
		ahead += a.slotWork(now, cost)
	}
	if !others {
		return ahead
	}
	w := t.weight
	start := t.vt
	if t.queued == 0 {
		if v := q.virtualTimeLocked(t); start < v {
			start = v
		}
	}
	start += float64(ownAhead) / w
	finish := start + float64(cost)/w
	a.stamp++
	if t.group != nil {
		// An undeclared tenant: its fellow members first, then the group
		// as one tenant at the top level.
		var inner float64
		inner, finish = q.memberAheadWalkLocked(t, cq, float64(ownAhead)+float64(cost), finish)
		ahead += inner
		t = t.group
	}
	for _, c := range q.classes {
		if c.paused && !cq.paused {
			continue // a paused class yields to this request
		}
		for i := range c.flows.e {
			f := c.flows.flows[c.flows.e[i].id]
			u := f.t
			if u == t || u.stamp == a.stamp {
				continue
			}
			u.stamp = a.stamp
			if cq.paused && !c.paused {
				ahead += float64(u.queuedWork) // yields to all of it
				continue
			}
			if room := (finish - u.vt) * u.weight; room > 0 {
				ahead += min(room, float64(u.queuedWork))
			}
		}
	}
	return ahead
}

// memberAheadWalkLocked is the inner half of an ETA for a request of the
// undeclared tenant t in class cq, whose inner finish tag is finish: the
// work of the other members that the group dispatches first, and the
// request's finish tag at the top level, where the group has the request's
// own work ahead (own, including its cost) and that inner work to do
// first. It uses the current ETA pass's stamp.
func (q *Queue) memberAheadWalkLocked(t *tenant, cq *classQ, own, finish float64) (inner, topFinish float64) {
	g := t.group
	stamp := q.adm.stamp
	for _, gf := range g.flows {
		c := gf.cq
		if c.paused && !cq.paused {
			continue // a paused class yields to this request
		}
		for i := range gf.sub.e {
			u := gf.sub.flows[gf.sub.e[i].id].t
			if u == t || u.stamp == stamp {
				continue
			}
			u.stamp = stamp
			if cq.paused && !c.paused {
				inner += float64(u.queuedWork)
				continue
			}
			if room := (finish - u.vt) * u.weight; room > 0 {
				inner += min(room, float64(u.queuedWork))
			}
		}
	}
	start := g.vt
	if g.queued == 0 {
		start = max(start, q.vfloor)
	}
	return inner, start + (own+inner)/g.weight
}
