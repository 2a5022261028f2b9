package cluster

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed sync.lua
var syncLua string

var syncScript = redis.NewScript(syncLua)

// Broker keeps one pool's grants in Redis.
type Broker struct {
	client  redis.UniversalClient
	key     string
	upKey   string
	channel string
	ttl     time.Duration
}

// NewBroker returns a broker for the pool at key (one Redis hash; put a
// hash tag in it for Redis Cluster). Entries live ttl without renewal.
// Syncs announce claims and freed slots on the channel key+":moves"
// (Moves).
func NewBroker(client redis.UniversalClient, key string, ttl time.Duration) *Broker {
	return &Broker{client: client, key: key, upKey: key + ":up", channel: key + ":moves", ttl: ttl}
}

// Grant is what a Sync returns.
type Grant struct {
	// Slots is how many requests the gateway may have in flight on the
	// pool until its next Sync.
	Slots int
	// Fair is its fair share of the pool; above Slots while others still
	// hold slots that are its due.
	Fair int
	// Announced is what the call announced to the other gateways, Claim
	// or Freed; "" when nothing (see Move).
	Announced string
	// Others is, for each upstream the Sync named, the requests the other
	// live gateways had in flight on it at their last Sync.
	Others map[string]int
	// Targets is, for each upstream the Sync named, how many of the
	// gateway's requests it should have on it (see sync.lua).
	Targets map[string]int
	// Fresh reports that the pool held no entry of the gateway before
	// this call (its first, Redis lost the pool, or the entry lapsed).
	Fresh bool
	// Now is the call's time on Redis's clock (Unix ms), for a later
	// Renewal.Since.
	Now int64
	// Renewed is how many other live gateways renewed their entries at
	// or after Renewal.Since (0 when not asked).
	Renewed int
}

// Load is a gateway's requests in flight on one upstream of the pool.
type Load struct {
	Upstream string // its name, the same on every gateway (its address)
	Inflight int
	// Slots is what the upstream holds (max_inflight), 0 while unhealthy.
	Slots int
}

// The kinds of Move, as sync.lua publishes them.
const (
	// Claim: the gateway is owed slots; the others should renew now.
	Claim = "claim"
	// Freed: the gateway holds fewer slots than before.
	Freed = "freed"
)

// announced is the Move kind of the sync script's "moved" value.
var announced = map[int64]string{1: Claim, 2: Freed}

// Move is an announcement on the broker's channel.
type Move struct {
	Kind     string // Claim or Freed
	Instance string
}

// parseMove reads a message of the broker's channel.
func parseMove(payload string) (Move, bool) {
	kind, inst, ok := strings.Cut(payload, " ")
	if !ok || (kind != Claim && kind != Freed) {
		return Move{}, false
	}
	return Move{Kind: kind, Instance: inst}, true
}

// Moves is a subscription to the announcements of a pool's gateways.
type Moves struct {
	ps      *redis.PubSub
	channel string
}

// Moves returns a subscription to the pool's moves without a call (it may
// be made under a lock): Follow connects it.
func (b *Broker) Moves() *Moves {
	return &Moves{ps: b.client.Subscribe(context.Background()), channel: b.channel}
}

// Follow subscribes and passes each move to each until Close; listening
// is called once Redis confirms. The subscription reconnects by itself.
func (m *Moves) Follow(listening func(), each func(Move)) {
	ctx := context.Background()
	if err := m.ps.Subscribe(ctx, m.channel); err == nil {
		if _, err := m.ps.Receive(ctx); err == nil { // Redis's confirmation
			listening()
		}
	}
	for msg := range m.ps.Channel() {
		if mv, ok := parseMove(msg.Payload); ok {
			each(mv)
		}
	}
}

// Close ends the subscription, and Follow.
func (m *Moves) Close() error { return m.ps.Close() }

// Renewal is what a gateway tells the pool at a Sync.
type Renewal struct {
	Instance string
	// Slots is the pool's size (e.g. max_inflight x healthy upstreams),
	// the same on every gateway.
	Slots int
	// Demand is the gateway's requests in flight plus queued; Holding
	// what it may have in flight until it applies the grant returned
	// (see doc.go).
	Demand, Holding int
	// Weight is the weights of the tenants it has work for.
	Weight float64
	// Loads are its requests in flight on each upstream (Grant.Others,
	// Grant.Targets).
	Loads []Load
	// Since, a time on Redis's clock (an earlier Grant.Now), asks how
	// many other live gateways have renewed since (Grant.Renewed); 0:
	// not asked.
	Since int64
}

// Sync renews r.Instance's entry and returns its grant, in one round trip
// that also announces a Move when one is due.
func (b *Broker) Sync(ctx context.Context, r Renewal) (Grant, error) {
	ttl := max(b.ttl.Milliseconds(), 1)
	milli := int64(1)
	if w := r.Weight; w > 0 && !math.IsInf(w, 0) {
		// At most 1e12 milli-units: Lua writes it back as an integer.
		milli = max(int64(math.Round(min(w, 1e9)*1000)), 1)
	}
	args := make([]any, 0, 8+3*len(r.Loads))
	args = append(args, r.Instance, max(r.Demand, 0), max(r.Holding, 0), max(r.Slots, 0), ttl, milli, b.channel, max(r.Since, 0))
	for _, l := range r.Loads {
		args = append(args, l.Upstream, max(l.Inflight, 0), max(l.Slots, 0))
	}
	v, err := syncScript.Run(ctx, b.client, []string{b.key, b.upKey}, args...).Slice()
	if err != nil {
		return Grant{}, fmt.Errorf("slots: %w", err)
	}
	const head = 6 // grant, fair, moved, fresh, now, renewed
	if len(v) != head+3*len(r.Loads) {
		return Grant{}, fmt.Errorf("slots: the sync script returned %d values, want %d", len(v), head+3*len(r.Loads))
	}
	var n [head]int64
	for i := range n {
		x, ok := v[i].(int64)
		if !ok {
			return Grant{}, fmt.Errorf("slots: the sync script returned %T at %d, want an integer", v[i], i)
		}
		n[i] = x
	}
	g := Grant{Slots: int(n[0]), Fair: int(n[1]), Announced: announced[n[2]], Fresh: n[3] == 1, Now: n[4], Renewed: int(n[5])}
	if len(r.Loads) > 0 {
		g.Others = make(map[string]int, len(r.Loads))
		g.Targets = make(map[string]int, len(r.Loads))
		for i := head; i+2 < len(v); i += 3 {
			u, _ := v[i].(string)
			c, _ := v[i+1].(int64)
			t, _ := v[i+2].(int64)
			g.Others[u], g.Targets[u] = int(c), int(t)
		}
	}
	return g, nil
}

// Release drops instance's entry (a gateway stopping cleanly), so its
// slots come back at once rather than after the TTL.
func (b *Broker) Release(ctx context.Context, instance string) error {
	// Announced, so that a gateway owed slots takes them now.
	_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, b.key, instance)
		p.HDel(ctx, b.upKey, instance)
		p.Publish(ctx, b.channel, Freed+" "+instance)
		return nil
	})
	return err
}
