package quota

import (
	"context"
	"time"
)

// Store keeps tenants' meters and makes each decision atomically. Every
// method is one read-modify-write of one tenant's three theoretical arrival
// times (TATs), with its inputs computed beforehand from Limits, so a Redis
// implementation does each in a single round trip (one Lua call on one
// hash-tagged key, time from Redis TIME). Limits travel with every call: a
// config reload applies to the next call, stored state untouched.
//
// Errors are the store's own (a network store's); Memory never returns one.
type Store interface {
	// Peek answers whether a request queued behind ahead (the tenant's
	// requests waiting before it; zero for none) may start now and, if
	// not, the earliest time it may and the binding dimension, charging
	// nothing (see Decide).
	Peek(ctx context.Context, tenant string, l *Limits, ahead Backlog) (Decision, error)
	// Charge is Peek followed, if allowed, by charging a request with
	// estimated tokens to every meter, atomically: all three meters or none.
	// Call it at dispatch; a refusal here (another request of the tenant
	// charged since the Peek) leaves the state untouched.
	Charge(ctx context.Context, tenant string, l *Limits, tokens int64) (Decision, error)
	// Book is Charge for a request that may wait. The request is booked
	// when the earliest time it may start is now, or no later than
	// maxWait less the lead after now: it is then charged as of that time
	// (see the package function Book) and the Decision is Allowed with
	// At that time, RetryAfter the wait until it and Reason the meter
	// that holds it ("" when it may start now); otherwise nothing is
	// charged and the Decision is Charge's refusal. The lead is the
	// longest any caller gave for the tenant within the last LeadMemory,
	// this one's included, while the tenant stays in debt (a write that
	// finds it at rest forgets it): what a caller needs between a
	// request's start and maxWait (a gateway's wait for a slot), kept
	// with the tenant's meters so that every caller books to the same
	// horizon. The caller must not start the request before At. Bookings
	// are first come, first served: a refund of one (Refund) frees its
	// place for the next.
	Book(ctx context.Context, tenant string, l *Limits, tokens int64, maxWait, lead time.Duration) (Decision, error)
	// Reconcile corrects a charged request's tokens at completion: extra
	// debt when actual > estimated, a refund when actual < estimated.
	Reconcile(ctx context.Context, tenant string, l *Limits, estimated, actual int64) (Status, error)
	// Refund takes back a whole charge of a request of the given tokens,
	// the request itself included, on every meter (never below rest): for
	// a request that was charged but never served (its upstream refused
	// it and it went back to the queue).
	Refund(ctx context.Context, tenant string, l *Limits, tokens int64) (Status, error)
	// Status reports the tenant's meters without changing them.
	Status(ctx context.Context, tenant string, l *Limits) (Status, error)
}

// Remote is implemented by a Store whose calls may wait on a network (the
// Redis store, and a Local over one): a caller that holds a lock other
// work waits on must make them outside it. A Store that does not implement
// it, or answers false, decides in memory.
type Remote interface {
	Remote() bool
}
