package fairqueue

import (
	"fmt"
	"time"
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
)

var reasonNames = map[Reason]string{
	ReasonTenantQueueFull: "tenant_queue_full",
	ReasonQueueFull:       "queue_full",
	ReasonNoCapacity:      "no_capacity",
	ReasonBudgetExceeded:  "wait_budget_exceeded",
	ReasonQueueTimeout:    "queue_timeout",
	ReasonCancelled:       "cancelled",
	ReasonClassThrottled:  "class_throttled",
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
	// RetryAfter is a hint for when trying again is likely to succeed.
	RetryAfter time.Duration
	// Detail is a short human explanation (limits involved, ETA).
	Detail string
	// WhileQueued is set on a ReasonBudgetExceeded refusal of a request
	// that had been admitted and was refused from the queue once its ETA
	// showed it could no longer start in time (early refusal); clear for a
	// refusal at admission.
	WhileQueued bool
	// BudgetLeft is, on a ReasonBudgetExceeded refusal, the fraction of the
	// request's wait budget still left when it was refused: 1 at admission,
	// less the longer it waited. It says how early the caller was told.
	BudgetLeft float64
}

func (r *Rejection) Error() string {
	if r.Detail == "" {
		return r.Reason.String()
	}
	return r.Reason.String() + ": " + r.Detail
}
