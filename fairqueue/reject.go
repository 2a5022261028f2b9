package fairqueue

import (
	"fmt"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// Reason says why a request was refused or did not reach an upstream. The
// handler maps each reason to one HTTP status and error code.
type Reason int

// The reasons a ticket can end without being dispatched.
const (
	// ReasonTenantQueueFull: the tenant's own queue cap was reached.
	ReasonTenantQueueFull Reason = iota + 1
	// ReasonQueueFull: the global queue cap (requests or tokens) was reached.
	ReasonQueueFull
	// ReasonNoCapacity: no healthy upstream, so nothing can be dispatched.
	ReasonNoCapacity
	// ReasonBudgetExceeded: the request cannot start within its wait budget
	// (decided at admission or while queued).
	ReasonBudgetExceeded
	// ReasonQueueTimeout: the request's deadline came while it was queued.
	ReasonQueueTimeout
	// ReasonCancelled: the caller gave up (client gone) before dispatch.
	ReasonCancelled
	// ReasonClassThrottled: the degrade ladder throttles the request's class.
	ReasonClassThrottled
	// ReasonClosed: the queue was closed (its config removed by a reload).
	ReasonClosed
	// ReasonTooLarge: the request's estimated tokens exceed what one
	// upstream may hold in flight (MaxInflightTokens) or the whole queue
	// may hold (MaxQueueTokens), so no wait could ever admit it. Retrying
	// the same request is pointless (RetryAfter is 0); the HTTP answer is
	// 400 context_length_exceeded.
	ReasonTooLarge
	// ReasonQuotaExceeded: the tenant's quota cannot allow the request
	// before its deadline (Rejection.Quota names the meter).
	ReasonQuotaExceeded
	// ReasonCircuitOpen: the circuit breaker sheds the tenant's tier.
	ReasonCircuitOpen
)

var reasonNames = map[Reason]string{
	ReasonTenantQueueFull: "tenant_queue_full",
	ReasonQueueFull:       "queue_full",
	ReasonNoCapacity:      "no_capacity",
	ReasonBudgetExceeded:  "wait_budget_exceeded",
	ReasonQueueTimeout:    "queue_timeout",
	ReasonCancelled:       "cancelled",
	ReasonClassThrottled:  "class_throttled",
	ReasonClosed:          "closed",
	ReasonTooLarge:        "request_too_large_for_capacity",
	ReasonQuotaExceeded:   "quota_exceeded",
	ReasonCircuitOpen:     "circuit_open",
}

// String returns the reason's snake_case name, as used in metrics.
func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// Rejection is the error returned when a request is refused at admission or
// ends without being dispatched.
type Rejection struct {
	Reason Reason
	// RetryAfter is a hint for when trying again is likely to succeed, at
	// most budget.MaxRetryAfter; the handler turns it into the header with
	// budget.RetryAfterSeconds.
	RetryAfter time.Duration
	// Detail is a short human explanation (limits involved, ETA).
	Detail string
	// WhileQueued is set on a refusal of a request that had been admitted
	// (ReasonBudgetExceeded or ReasonQuotaExceeded); clear for a refusal at
	// admission.
	WhileQueued bool
	// BudgetLeft is, on a ReasonBudgetExceeded refusal, the fraction of the
	// request's wait budget still left when it was refused (1 at admission).
	BudgetLeft float64
	// Quota is, on a ReasonQuotaExceeded refusal, the binding meter: qps,
	// tokens or joint; QuotaStatus the tenant's meters at the refusal.
	Quota       quota.Dimension
	QuotaStatus *quota.Status
}

func (r *Rejection) Error() string {
	if r.Detail == "" {
		return r.Reason.String()
	}
	return r.Reason.String() + ": " + r.Detail
}

// retryAfterLocked is the Retry-After of a refusal whose retry should
// succeed in about eta: the budget package's rule, with this queue's
// seeded jitter.
func (q *Queue) retryAfterLocked(eta time.Duration) time.Duration {
	return budget.RetryAfterJitter(eta, q.rng.Float64())
}

// drainRetryLocked is the Retry-After of a refusal because a queue is full
// or a budget ran out: the time the measured rate needs to serve the given
// queued work (in cost units), since retrying sooner meets the same
// backlog.
func (q *Queue) drainRetryLocked(now time.Time, work int64) time.Duration {
	var eta time.Duration
	if r := q.adm.rate.Rate(now, q.healthy); r > 0 {
		eta = budget.ETA(float64(work), r)
	}
	return q.retryAfterLocked(eta)
}
