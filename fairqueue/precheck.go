package fairqueue

// PrecheckRequest returns the refusal Enqueue would give r among those that
// need no body (no healthy upstream, too large, a full queue, a throttled
// class), or nil; Enqueue still decides. The handler calls it before
// reading the body. r.Cost may be 0 (it counts as 1), r.Bytes is taken from
// Content-Length, r.Deadline is not looked at. Nothing is consumed.
func (q *Queue) PrecheckRequest(r Request) *Rejection {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	t := q.tenants[r.Tenant]
	tc, known, class := q.settingsLocked(t, r.Tenant, r.Class)
	if rej := q.admitLocked(now, t, r.Tenant, tc, known, max(r.Cost, 1), max(r.Bytes, 0)); rej != nil {
		return rej
	}
	return q.throttleLocked(now, class, tc.Class, r.Cost, false)
}
