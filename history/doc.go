// Package history keeps what a fair queue did over the last 24 hours, in
// memory, so a dashboard can show per-tenant fairness without Prometheus.
//
// It is a set of bounded rings of per-minute aggregates: one ring per
// declared tenant plus one for every undeclared tenant together
// (UnknownTenant), one for the gateway, a ring of per-second gateway
// samples for the last five minutes, and the last MaxTransitions degrade
// and circuit transitions. A query merges the minutes of a window (5 min,
// 1 h, 24 h): wait quantiles come from merging fixed log-bucket
// histograms, so they cost the same whatever the traffic was.
//
// Fair shares are weighted fair queuing's own (see History.Sample).
//
// Memory is bounded by configuration, not by traffic: a ring of
// TenantBytes per tenant that recorded anything, plus FixedBytes. Tenants a
// reload removes are dropped (Declare), and undeclared names count under
// UnknownTenant, so a client inventing tenant IDs cannot grow it.
//
// The package is pure: time comes from the clock given to New. Every
// method is safe for concurrent use (one mutex; recording allocates
// nothing once a tenant's ring exists). A nil *History ignores records.
package history
