package fairqueue

// AppendBacklogged appends to dst the name of each declared tenant with a
// request waiting that dispatch may take (not held by its quota nor at its
// in-flight cap), and reports whether some undeclared tenant has one: the
// flow owners WFQ owes a share of the service now. O(declared tenants).
func (q *Queue) AppendBacklogged(dst []string) ([]string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for name := range q.declared {
		if t := q.tenants[name]; t != nil && t.group == nil && t.queued > 0 && !t.out {
			dst = append(dst, name)
		}
	}
	if q.group.queued > 0 {
		for _, f := range q.group.flows {
			if f.sub.len() > 0 {
				return dst, true
			}
		}
	}
	return dst, false
}
