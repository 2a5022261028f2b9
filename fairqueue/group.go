package fairqueue

// Undeclared tenants are scheduled hierarchically. At the top level they are
// one flow owner, the group (Queue.group), with weight Config.Default.Weight
// and a virtual time of its own, competing with the declared tenants as a
// declared tenant would. The request it dispatches next is chosen inside
// the group by the same rule one level down: each undeclared tenant has its
// own virtual time (in the group's inner virtual time) and flows, kept in
// the group flow's sub-heap by finish tag. A dispatch and a back-fill
// charge both the member and the group, so enqueue and dispatch stay
// O(log n).

// memberAheadLocked is the inner half of an ETA for a request of the
// undeclared tenant t in class cq, whose inner finish tag is finish: the
// work of the other members that the group dispatches first, and the
// request's finish tag at the top level (groupFinishLocked). The work-ahead
// index must be in sync (aheadSyncLocked); O(log n).
func (q *Queue) memberAheadLocked(t *tenant, cq *classQ, own, finish float64) (inner, topFinish float64) {
	inner = q.aheadOthersLocked(levelMembers, t, finish, cq.paused)
	return inner, q.groupFinishLocked(t.group, own, inner)
}

// memberAheadWalkLocked is memberAheadLocked by a walk over the group's
// backlogged flows, O(F), for othersWalkLocked, whose stamp it uses.
func (q *Queue) memberAheadWalkLocked(t *tenant, cq *classQ, own, finish float64) (inner, topFinish float64) {
	for _, gf := range t.group.flows {
		inner = q.adm.walkAhead(inner, gf.sub, gf.cq, cq, t, finish)
	}
	return inner, q.groupFinishLocked(t.group, own, inner)
}

// groupFinishLocked is the top-level finish tag of a request of a member
// of g with own of its tenant's work (its cost included) and inner of the
// other members' ahead of it.
func (q *Queue) groupFinishLocked(g *tenant, own, inner float64) float64 {
	start := g.vt
	if g.queued == 0 {
		start = max(start, q.vfloor)
	}
	return start + (own+inner)/g.weight
}
