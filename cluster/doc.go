// Package cluster holds fair_queue's cluster mode's Redis calls: the
// client (NewClient: one server, Sentinel or Redis Cluster, no retries, a
// timeout per command), the tenants' quota store over it (QuotaStore, and
// NewQuota's quota.Local over it), the shared slots' grants (Broker) and
// the exchange of the tenants' served cost (Exchange). Every key is
// <prefix><namespace>{<hash tag>}, so each call touches one Redis Cluster
// slot and no tenant name can spell another key.
// Redis down or slow never fails a request: each caller decides locally
// on its share (1/instances) until Redis answers.
//
// # Quotas
//
// Key layout. One hash per meter: a tenant's is <prefix>t{<tenant>}, a
// meter the gateway keeps for itself (its name starts with a NUL)
// <prefix>i{<the name less the NUL>}, with three fields q, t and j: the
// qps, tokens and joint TATs as decimal int64 nanoseconds since the Unix
// epoch. The braces make the name the key's hash tag, so every key a later
// script adds for the same tenant lands in the same slot.
//
// One round trip. Each QuotaStore method is one EVALSHA of one Lua script
// (quota.lua, embedded), with EVAL as the fallback when the server answers
// NOSCRIPT; Load puts the script on every primary beforehand, so that even
// the first call is one round trip. Go computes the script's inputs from
// quota.Limits (each meter's increment in ns, the tolerance, a reconcile's
// differences); the script reads TIME and the hash, makes quota.Decide's
// test and the writes of a charge or a reconcile, sets the expiry, and
// returns the Redis time and the TATs. Go then derives At, Reason and
// Status from them with quota.Decide and quota.StatusOf, the functions
// quota.Memory uses. Peek and Status write nothing.
//
// Time. The only clock is TIME of the Redis node holding the key, so the
// gateways' clocks never enter a decision. Decision.At is that clock as a
// time.Time: exact on Redis's time line, but off the caller's clock by their
// skew. RetryAfter, a difference of two readings of Redis's clock, is the
// reliable part: the caller retries at its own now + RetryAfter.
//
// Precision. TIME has microseconds, so now is a whole microsecond; TATs and
// increments keep nanoseconds. Lua numbers are doubles, exact only below
// 2^53 (104 days in ns) while Unix nanoseconds are about 2^61, so the
// script keeps every time as a pair (seconds, nanoseconds) whose parts are
// integers far below 2^53 and carries between them: every sum and
// comparison is the int64 Go computes, for increments up to the 2^60 ns
// cap. Decisions are those of quota.Memory at the same microsecond, field
// by field (TestRedisMatchesMemory); the quota package's guarantee 4 holds
// at the clock's resolution: a refused request is refused at the last
// microsecond before At and allowed at the first one at or after it.
//
// Expiry. Each write sets the key to expire when the tenant comes to rest
// (its largest TAT minus now, rounded up to the millisecond) plus a margin
// of 1 s (room for the clock of a replica promoted in a failover), and a
// write that leaves the tenant at rest deletes the key. Redis thus holds
// only tenants in debt, without a sweep: the quota package's guarantee 7.
//
// Failures. A method returns the client's error (connection refused, timeout,
// cancelled or expired context, a key of another type at the tenant's name)
// or one for a reply it cannot read; it never panics, and the caller
// decides, which for a quota means failing open (quota.Local). A missing or
// unreadable field is read as no debt on that meter and rewritten by the
// next charge. The client must not retry (NewClient's does not): a Charge
// retried after its first attempt reached Redis would be charged twice.
// Redis replicates asynchronously: a failover may lose the last writes,
// giving tenants back up to the replication lag's worth of charges.
//
// # Shared slots
//
// N gateways each with an upstream pool's full capacity would send N times
// what its model servers can hold. Each gateway holds a grant, how many
// requests it may have in flight on the pool, and renews it every sync
// interval with its demand (in flight plus queued, at most the pool) and
// what it holds (the larger of its requests in flight and its grant), in
// one Lua call (sync.lua) on one hash, time from Redis TIME:
//
//  1. Entries not renewed within their TTL are dropped: a crashed gateway's
//     slots come back within the TTL.
//  2. Each live gateway's fair share is the weighted max-min fair division
//     of the pool by demand (water-filling), its weight that of the tenants
//     it has requests queued for, in whole slots (the remainder one slot
//     each to the largest fractions, ties by name). When all the demand
//     fits, the rest is shared out the same way on top, so an idle gateway
//     holds slots for its next request. Requests in flight weigh nothing:
//     they hold their slots already.
//  3. Its grant is its fair share, but at most what the others leave: the
//     pool less, for each other gateway, the larger of its grant and its
//     requests in flight.
//
// Guarantee: the sum over gateways of max(grant, in flight) never exceeds
// the pool at any script call, so the model servers never see more
// requests than the pool's slots, up to requests that finish and start
// inside one sync interval of a gateway that lowered its grant. Nothing is
// preempted; shares converge to the fair division within two sync
// intervals of every gateway.
//
// Exceptions, by design: while Redis is unreachable a gateway takes the
// pool divided by the gateways configured (before its first grant it
// dispatches nothing). Redis losing the pool (a restart) or an outage
// ending leaves the others holding slots Redis does not count until they
// renew; the caller bridges it (Grant.Fresh): it takes no more than it held
// until Redis reports (Renewal.Since, Grant.Renewed) that every other
// gateway renewed since, or for one lease TTL at most. A gateway that
// stops cleanly releases its entry (Release); one that crashes keeps it
// counted until its TTL passes.
//
// Moves: a renewal announces, on the channel <key>:moves in the same
// script call, a claim when the gateway's weight grew and it is owed slots
// (Grant.Fair above Grant.Slots), and a release when it holds fewer slots
// than before; every gateway renews on a claim, one owed slots on a
// release. Announcements only speed moves up: one lost delays a move to
// the next renewal, and the guarantee never depends on them.
//
// Upstreams: given the gateway's requests in flight on each upstream and
// its slots (Load), a renewal also returns its targets: its requests where
// they are, then the rest of its grant one slot at a time where the most
// room is left, room being the upstream's slots less what the other live
// gateways hold there. Made each against the others', the targets never
// hold an upstream past its slots (TestTargetsNeverOverUpstream).
//
// # Shared service
//
// Every sync interval a gateway calls Exchange.Swap once: one pipelined
// round trip appends a stream entry with the cost it charged each tenant
// since its last call and reads the entries the others appended since the
// last one it read. An entry's fields are "g" (the writer), "t:" + each
// declared tenant's name and "u" for the undeclared ones as a group, so
// its size is bounded by the configuration. The stream is trimmed by time
// (XADD MINID) or by count (MaxLen) and expires when no gateway has
// written for its TTL. Entries a gateway misses (an outage, falling
// behind) are lost, never charged twice: its tenants are then compared on
// what it saw. Reads use exclusive ranges, which need Redis 6.2.
package cluster
