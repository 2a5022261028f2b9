// Package shares carries each tenant's served cost between the gateways
// in front of one pool, through one Redis stream, so that every gateway's
// fair queue can charge a tenant for what the others served it (shared
// virtual time; fairqueue.Queue.ChargeRemote).
//
// Every sync interval a gateway calls Swap once: in one pipelined round
// trip it appends one stream entry with the cost it charged each tenant
// since its previous call (estimates at dispatch, corrections when the
// usage is known), and reads the entries appended after the last one it
// read, skipping its own. What it reads is what the others served in the
// meantime, each entry once.
//
// An entry's fields are "g" (the writer), "t:" + each tenant's name, so
// no tenant name can pass for the writer, and "u" for the undeclared
// tenants as one group (Served.Group): the caller sends only the tenants
// its operator declared by name, so an entry's size is bounded by the
// configuration, not by the names callers choose. Reads use exclusive
// ranges ("(" + ID), which need Redis 6.2 or later.
//
// The stream is capped by time: once a gateway has read an entry, its
// writes trim what is older than the TTL by that entry's time (XADD
// MINID, on Redis's clock, approximately); before that, by count
// (MaxLen). It expires when no gateway has written for its TTL. A gateway that falls further behind
// than the cap, or misses entries while Redis is unreachable, loses them:
// what it loses is other gateways' service, so its tenants are compared
// on what it saw, which is the fairness of one gateway alone; nothing is
// charged twice. A gateway's first call reads nothing: service before it
// joined is no debt of its tenants.
//
// Cost: one round trip per sync per gateway; an entry holds the tenants
// charged within one interval; a read returns at most ReadMax entries
// (the rest on the next call). The stream is one key: give it a hash tag
// for Redis Cluster (the caller's prefix does).
package shares
