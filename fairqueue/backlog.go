package fairqueue

// AppendBacklogged appends to dst the name of each declared tenant with a
// request waiting that dispatch may take — not held by its quota nor at
// its in-flight cap — and reports whether some undeclared tenant has one,
// for the group they are scheduled in as one top-level flow owner. These
// are the flow owners WFQ owes a share of the service right now: a tenant
// without such a request is owed only what it asks for. O(declared
// tenants); the dashboard's history asks on every tick.
func (q *Queue) AppendBacklogged(dst []string) ([]string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for name := range q.declared {
		if t := q.tenants[name]; t != nil && t.group == nil && t.queued > 0 && !t.out {
			dst = append(dst, name)
		}
	}
	undeclared := false
	if g := q.group; g != nil && g.queued > 0 {
		for _, f := range g.flows {
			if f.sub != nil && f.sub.len() > 0 {
				undeclared = true
				break
			}
		}
	}
	return dst, undeclared
}
