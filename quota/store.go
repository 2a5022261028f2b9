package quota

import (
	"context"
	"time"
)

// Store keeps tenants' meters and makes each decision atomically: one
// read-modify-write of one tenant's TATs, with inputs computed beforehand
// from Limits (one Lua call for Redis). Limits travel with every call, so a
// reload applies to the next call. Memory never returns an error.
type Store interface {
	// Peek answers whether a request queued behind ahead may start now
	// and, if not, when and why, charging nothing (see Decide).
	Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error)
	// Charge is Peek followed, if allowed, by charging a request with
	// estimated tokens to every meter: all or none. Call it at dispatch.
	Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error)
	// Book is Charge for a request that may wait: if its earliest time
	// is within maxWait less the lead, it is charged as of that time (see
	// the function Book) and the Decision is Allowed with At that time,
	// RetryAfter the wait and Reason the meter that holds it; otherwise
	// nothing is charged. The lead is the longest any caller gave for the
	// tenant within LeadMemory while it stays in debt, kept with its
	// meters so every caller books to the same horizon. The caller must
	// not start the request before At. Bookings are first come, first
	// served.
	Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error)
	// Reconcile corrects a charged request's tokens at completion: extra
	// debt when actual > estimated, a refund when actual < estimated.
	Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error)
	// Refund takes back the whole charge of a request that was never
	// served (its upstream refused it), never below rest.
	Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error)
	// Status reports the tenant's meters without changing them.
	Status(ctx context.Context, tenant string, l *Limits) (Status, error)
}

// Remote is implemented by a Store whose calls may wait on a network: a
// caller holding a lock others wait on must call it outside the lock.
type Remote interface {
	Remote() bool
}
