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
	tenant, class, tokens := r.Tenant, r.Class, r.Cost
	q.mu.Lock()
	defer q.mu.Unlock()
	// The time is needed only to refuse or to peek at a throttle: read on
	// demand, so that a request the queue takes costs no clock reading here.
	var clk clockReading
	t := q.tenants[tenant]
	tc, known, class := q.settingsLocked(t, tenant, class)
	if rej := q.admitLocked(&clk, t, r.Tenant, tc, known, max(tokens, 1), max(r.Bytes, 0)); rej != nil {
		return rej
	}
	if q.ov.throttle != nil {
		return q.throttleLocked(&clk, class, tc.Class, tokens, false)
	}
	return nil
}
