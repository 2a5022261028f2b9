// Package slots shares an upstream pool's slots among the gateways in front
// of it, through Redis: N gateways each with the pool's full capacity would
// send N times what its model servers can hold.
//
// Each gateway holds a grant: how many requests it may have in flight on
// the pool. It renews it every sync interval with its demand (requests in
// flight plus queued, at most the pool) and what it holds (the larger of
// its requests in flight and its current grant: it may dispatch up to that
// until it applies the new grant), in one
// Lua script call on one hash (one round trip, time from Redis TIME):
//
//  1. Entries not renewed within their TTL are dropped: a crashed gateway's
//     slots come back within the TTL.
//  2. The fair share of each live gateway is the weighted max-min fair
//     division of the pool by demand (water-filling), its weight the
//     weights of the tenants it has requests queued for, in whole slots:
//     the remainder goes one slot each to the largest fractions (ties by
//     name), so the shares add up to the pool. When all the demand fits,
//     what nobody wants is shared out the same way on top of each demand,
//     so an idle gateway holds slots for its next request. Tenants
//     flooding through different gateways thus share the pool by weight;
//     a tenant with work on several gateways counts its weight on each
//     (the local fair queue shares each gateway's grant among its own
//     tenants). Requests in flight weigh nothing: they hold their slots
//     already, and weighing them would let a sparse tenant's request in
//     flight on one gateway win that gateway's other tenants the slots a
//     sparse request queued on another is waiting for.
//  3. Its grant is its fair share, but at most what the others leave: the
//     pool less, for each other gateway, the larger of its grant and its
//     requests in flight.
//
// Guarantee: the sum over gateways of max(grant, in flight) never exceeds
// the pool, at every script call (each call keeps it, and a gateway only
// dispatches below its grant), so the pool's model servers never see more
// requests than its slots, whatever the timing, up to requests that finish
// and start inside one sync interval of a gateway that lowered its grant.
// A gateway whose share fell keeps its requests in flight (nothing is
// preempted) and dispatches again once below its new grant; the others'
// grants grow as its requests complete. Shares converge to the fair
// division within two sync intervals of every gateway.
//
// Exceptions to the guarantee, by design: while Redis is unreachable a
// gateway takes the pool divided by the number of gateways configured
// (the caller's fallback), whatever the others hold. (Before its first
// grant the caller dispatches nothing: the others may hold the pool.)
// Redis losing the pool (a restart without persistence) or an outage
// ending leaves the others holding slots Redis does not count until they
// renew, which may be a second or more after Redis answers again (a
// client's reconnection backs off); the caller bridges it (Grant.Fresh):
// a gateway takes no more than it held before until Redis reports
// (Renewal.Since, Grant.Renewed) that every other gateway configured has
// renewed since, or for a lease TTL at most (one that has not renewed by
// then is taken as gone, as when its lease lapses). A gateway that stops cleanly (or whose queue a reload
// removes) renews its entry with just its last requests in flight and
// then releases it (Release); one that crashes keeps its grant counted
// until its entry's TTL passes. Queues whose keys share a prefix share
// one pool.
//
// Moves. A grant changes when its gateway renews, so a renewal every sync
// interval alone would keep a slot freed on one gateway from a request
// waiting on another for up to three intervals (the claim reaching the
// others, the slot's release reaching Redis, the owed gateway asking). A
// renewal therefore announces, on the pub/sub channel <key>:moves and in
// the same script call, a claim when the gateway's weight grew and it is
// owed slots (Grant.Fair above Grant.Slots, and demand above the grant),
// and a release when it holds fewer slots than before (Release announces
// one too); every gateway renews on a claim, a gateway owed slots on a
// release. A gateway owed slots without its weight growing (its demand
// grew) claims them at its next renewal. The caller renews at once when a request is queued by a
// tenant new to its backlog, when a request completes while it has more
// in flight than its grant, and when a lower grant left slots unfilled.
// A request queued anew thus waits for the pool's next free slot
// wherever it frees, plus about three round trips. Announcements are an
// optimisation: one lost (Redis restarting, a subscription reconnecting)
// delays the move to the next renewal, and the guarantee above never
// depends on them.
//
// Upstreams. A gateway's grant is a count over the pool; where its
// requests go is its reverse proxy's choice, and gateways each balancing
// their own requests pile onto one model server while another idles. A
// renewal given the gateway's requests in flight on each upstream and the
// upstream's slots (Load) therefore also returns its targets: its
// requests in flight where they are, then the rest of its grant one slot
// at a time where the most room is left, room being the upstream's slots
// less what the other live gateways hold there (the larger of their
// targets and their requests in flight). What a gateway reports in flight
// there is what it may have until it applies the targets returned: its
// requests at the call, plus what it may dispatch during the round trip
// by its last targets (at most what it holds beyond its requests in
// flight). Made each against the others', the targets never hold an
// upstream past its slots (TestTargetsNeverOverUpstream);
// the caller places its requests below them first
// (fair_queue_least_conn), and the pool's bound above holds whatever it
// places.
package slots
