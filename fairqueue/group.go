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
