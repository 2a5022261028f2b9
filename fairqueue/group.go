package fairqueue

// Undeclared tenants are scheduled hierarchically (see doc.go): one flow
// owner, the group, at the top level, the same rule one level down inside.

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
