package fairqueue

// Precheck returns the refusal Enqueue would give a request of tenant and
// class estimated at tokens, among those that need no body: no healthy
// upstream, tokens beyond what any capacity could take, the tenant's, the
// undeclared group's or the global queue full (in requests, tokens or
// bytes already queued), or the class throttled (the request's class or
// its tenant's). It returns nil when
// none applies; Enqueue still decides. The handler calls it before reading
// the body, so a request bound to be refused costs neither the upload nor
// the tokenizer. tokens may be 0 when no estimate exists yet (it then
// counts as 1, and only the checks that hold whatever the size apply).
// class "" means the tenant's class. Nothing is consumed (a throttle is
// only peeked at) and nothing is allocated unless a request is refused.
func (q *Queue) Precheck(tenant, class string, tokens int64) *Rejection {
	return q.PrecheckRequest(Request{Tenant: tenant, Class: class, Cost: tokens})
}

// PrecheckRequest is Precheck with the request's other body-free facts: its
// Bytes, taken from Content-Length before the body is read, count against
// MaxQueueBytes as Enqueue will count them. Deadline is not looked at.
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
