package fairqueue

import "time"

// Close ends the queue: every request still queued ends at once with
// ReasonClosed, later Enqueues are refused with it, and requests in flight
// run to completion. A queue whose config a reload removed is closed, so
// its waiters get an answer. Close is idempotent; detail says why.
func (q *Queue) Close(detail string) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.unlock()
	if q.closed == "" {
		q.closed = detail
	}
	var waiting []*Ticket
	for tk := q.boost.head; tk != nil; tk = tk.next {
		waiting = append(waiting, tk)
	}
	for _, t := range q.tenants {
		for _, f := range t.flows {
			for tk := f.q.head; tk != nil; tk = tk.next {
				waiting = append(waiting, tk)
			}
		}
	}
	for _, tk := range waiting {
		q.takeLocked(tk, true)
		q.finishLocked(now, tk, stateCancelled, q.closedLocked())
	}
}

// closedRetryAfter is the Retry-After of a closed queue's refusals.
const closedRetryAfter = time.Second

// closedLocked is the refusal of a closed queue, nil while it is open.
func (q *Queue) closedLocked() *Rejection {
	if q.closed == "" {
		return nil
	}
	return &Rejection{Reason: ReasonClosed, RetryAfter: closedRetryAfter, Detail: q.closed}
}
