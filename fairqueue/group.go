package fairqueue

// Undeclared tenants are scheduled hierarchically. At the top level they are
// one flow owner, the group (Queue.group), with weight Config.Default.Weight
// and a virtual time of its own, competing with the declared tenants exactly
// as a declared tenant would: its flow in each class heap is keyed by the
// group's virtual time and the cost of the request it would dispatch next.
// That request is chosen inside the group by the same rule one level down:
// each undeclared tenant has its own virtual time (in the group's inner
// virtual time, counter lift included) and flows, kept in the group flow's
// sub-heap by finish tag. A dispatch charges both the member and the group,
// and a back-fill corrects both, so enqueue and dispatch stay O(log n): one
// sub-heap operation and one class-heap operation.
//
// The members share the group's service equally within the usual WFQ bound,
// and a thousand rotating IDs together get Default.Weight's share, no more.

// memberAheadLocked is the inner half of an ETA for a request of the
// undeclared tenant t in class cq, whose inner finish tag is finish: the
// work of the other members that the group dispatches first, and the
// request's finish tag at the top level, where the group has the request's
// own work ahead (own, including its cost) and that inner work to do
// first. The work-ahead index must be in sync (aheadSyncLocked); O(log n).
func (q *Queue) memberAheadLocked(t *tenant, cq *classQ, own, finish float64) (inner, topFinish float64) {
	g := t.group
	inner = q.aheadOthersLocked(levelMembers, t, finish, cq.paused)
	start := g.vt
	if g.queued == 0 {
		start = max(start, q.vfloor)
	}
	return inner, start + (own+inner)/g.weight
}

// memberAheadWalkLocked is memberAheadLocked by a walk over the group's
// backlogged flows, O(F), for othersWalkLocked, whose stamp it uses.
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
