// Package cluster holds fair_queue's cluster mode's Redis calls: the
// client (NewClient: one server, Sentinel or Redis Cluster, no retries, a
// timeout per command), the tenants' quota store (QuotaStore, and NewQuota's
// quota.Local over it), the shared slots' grants (Broker) and the exchange
// of the tenants' served cost (Exchange). Every key is
// <prefix><namespace>{<hash tag>}, so each call touches one Redis Cluster
// slot and no tenant name can spell another key. Redis down or slow never
// fails a request: each caller decides locally on its share (1/instances)
// until Redis answers.
//
// # Quotas
//
// One hash per meter, <prefix>t{<tenant>} (or <prefix>i{<name>} for the
// gateway's own meters, whose names start with a NUL), with fields q, t
// and j: the TATs as decimal Unix nanoseconds.
//
// Each QuotaStore method is one EVALSHA of quota.lua (EVAL on NOSCRIPT;
// Load preloads it). Go computes the inputs from quota.Limits; the script
// reads TIME and the hash, makes quota.Decide's test and the writes, sets
// the expiry and returns the Redis time and the TATs, from which Go derives
// the Decision with the functions quota.Memory uses.
//
// Time is only Redis TIME on the key's node, so gateway clocks never enter
// a decision; RetryAfter, a difference of two readings of it, is what a
// caller with another clock should use. TIME has microseconds; Lua numbers
// are doubles exact below 2^53, so the script keeps times as (seconds,
// nanoseconds) pairs and every sum and comparison equals Go's int64 one.
// Decisions are quota.Memory's at the same microsecond.
//
// Each write sets the key to expire when the tenant comes to rest plus 1 s
// (room for a promoted replica's clock), and deletes it at rest: Redis
// holds only tenants in debt. A missing or unreadable field reads as no
// debt. The client must not retry: a retried Charge could be charged
// twice. Asynchronous replication means a failover may lose the last
// writes.
//
// # Shared slots
//
// N gateways each with a pool's full capacity would send N times what its
// model servers hold. Each gateway holds a grant of in-flight requests and
// renews it every sync interval with its demand and what it holds, in one
// call of sync.lua on one hash, time from Redis TIME:
//
//  1. Entries not renewed within their TTL are dropped.
//  2. Each live gateway's fair share is the weighted max-min division of
//     the pool by demand (water-filling), weighted by the tenants it has
//     queued, in whole slots; spare slots are shared the same way on top.
//  3. Its grant is its fair share, but at most the pool less, for each
//     other gateway, the larger of its grant and its requests in flight.
//
// Guarantee: the sum over gateways of max(grant, in flight) never exceeds
// the pool at any script call, up to requests that finish and start
// within one sync interval of a lowered grant. Nothing is preempted;
// shares converge within two sync intervals.
//
// While Redis is unreachable a gateway takes the pool divided by the
// gateways configured (nothing before its first grant). After Redis loses
// the pool or an outage ends (Grant.Fresh), a gateway takes no more than
// it held until every other gateway renewed (Renewal.Since,
// Grant.Renewed), or one lease TTL at most. Release drops an entry at a
// clean stop.
//
// A renewal announces on <key>:moves a claim when the gateway is owed
// slots (Grant.Fair above Grant.Slots) and a release when it holds fewer
// than before; announcements only speed moves up.
//
// Given its requests on each upstream (Load), a renewal also returns the
// gateway's targets: its grant placed where the other live gateways leave
// room, so the gateways together never hold an upstream past its slots.
//
// # Shared service
//
// Every sync interval a gateway calls Exchange.Swap: one pipelined round
// trip appends a stream entry with the cost it charged each tenant since
// its last call ("g" the writer, "t:"+tenant, "u" the undeclared group) and
// reads the others' entries since its last read. The stream is trimmed by
// time or count and expires when no gateway writes for its TTL. Missed
// entries are lost, never charged twice. Needs Redis 6.2.
package cluster
