package slots

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed sync.lua
var syncLua string

var syncScript = redis.NewScript(syncLua)

// Broker keeps one pool's grants in Redis.
type Broker struct {
	client redis.UniversalClient
	key    string
	ttl    time.Duration
}

// NewBroker returns a broker for the pool at key (one Redis hash; put a
// hash tag in it for Redis Cluster). Entries live ttl without renewal.
func NewBroker(client redis.UniversalClient, key string, ttl time.Duration) *Broker {
	return &Broker{client: client, key: key, ttl: ttl}
}

// Sync renews instance's entry with its demand, what it holds (requests in
// flight, or more: see doc.go) and its weight (the weights of the tenants
// it has work for), and returns its grant of the pool's slots: how many
// requests it may have in flight on the pool until its next Sync. Every
// gateway must pass the same slots (the pool's size, e.g. max_inflight x
// healthy upstreams). One round trip.
func (b *Broker) Sync(ctx context.Context, instance string, slots, demand, inflight int, weight float64) (int, error) {
	ttl := max(b.ttl.Milliseconds(), 1)
	milli := int64(1)
	if weight > 0 && !math.IsInf(weight, 0) {
		// At most 1e12 milli-units: Lua writes it back as an integer.
		milli = max(int64(math.Round(min(weight, 1e9)*1000)), 1)
	}
	v, err := syncScript.Run(ctx, b.client, []string{b.key}, instance, max(demand, 0), max(inflight, 0), max(slots, 0), ttl, milli).Int()
	if err != nil {
		return 0, fmt.Errorf("slots: %w", err)
	}
	return v, nil
}

// TTL is how long an entry lives without renewal.
func (b *Broker) TTL() time.Duration { return b.ttl }

// Release drops instance's entry (a gateway stopping cleanly), so its
// slots come back at once rather than after the TTL.
func (b *Broker) Release(ctx context.Context, instance string) error {
	return b.client.HDel(ctx, b.key, instance).Err()
}
