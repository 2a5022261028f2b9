package fairqueue

// PrecheckRequest returns the refusal Enqueue would give r among those that
// need no body: no healthy upstream, a size no capacity could take, a full
// queue (the tenant's, the undeclared group's or the global one, in
// requests, tokens or bytes), or a throttled class. It returns nil when none
// applies; Enqueue still decides. The handler calls it before reading the
// body, so a request bound to be refused costs neither the upload nor the
// tokenizer. r.Cost may be 0 when no estimate exists yet (it counts as 1);
// r.Bytes is taken from Content-Length; r.Deadline is not looked at.
// Nothing is consumed (a throttle is only peeked at).
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
