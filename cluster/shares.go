package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

const (
	// MaxLen caps the stream's entries (entries older than the TTL are
	// trimmed too); an entry names only declared tenants and the
	// undeclared group, so the stream is bounded by the configuration.
	MaxLen = 10000
	// ReadMax is the most entries one Swap reads.
	ReadMax = 1000
	// entryMax is the most tenants in one stream entry; a gateway that
	// charged more within one interval writes several.
	entryMax = 2000
)

// An entry's fields: its writer, and each tenant's name after
// tenantPrefix, so no tenant name can pass for the writer.
const (
	gatewayField = "g"
	tenantPrefix = "t:"
	groupField   = "u"
)

// Exchange is one gateway's end of the stream. It is not safe for
// concurrent use: call Swap from one goroutine at a time.
type Exchange struct {
	client   redis.UniversalClient
	key      string
	ttl      time.Duration
	instance string
	// last is the ID of the last entry read; "" before the first Swap.
	last string
	args []any
}

// NewExchange returns instance's end of the stream at key; the stream
// expires ttl after the last write of any gateway.
func NewExchange(client redis.UniversalClient, key, instance string, ttl time.Duration) *Exchange {
	return &Exchange{client: client, key: key, ttl: ttl, instance: instance}
}

// Swap appends mine (this gateway's served cost since its previous call)
// and returns, appended to theirs, what the other gateways appended since
// its last read. One round trip. On an error mine may or may not have been
// written: the caller drops it rather than risk charging it twice.
func (x *Exchange) Swap(ctx context.Context, mine []fairqueue.Served, theirs []fairqueue.Served) ([]fairqueue.Served, error) {
	// A plain pipeline, not MULTI/EXEC: nothing needs the commands
	// together, and a refused MULTI (Redis loading) leaves replies unread.
	pipe := x.client.Pipeline()
	x.write(ctx, pipe, mine)
	pipe.PExpire(ctx, x.key, x.ttl)
	var read *redis.XMessageSliceCmd
	if x.last == "" {
		read = pipe.XRevRangeN(ctx, x.key, "+", "-", 1)
	} else {
		read = pipe.XRangeN(ctx, x.key, "("+x.last, "+", ReadMax)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return theirs, fmt.Errorf("shares: %w", err)
	}
	msgs := read.Val()
	if x.last == "" {
		// The first call starts after the newest entry, its own included.
		x.last = "0-0"
		if len(msgs) > 0 {
			x.last = msgs[0].ID
		}
		return theirs, nil
	}
	for _, m := range msgs {
		x.last = m.ID
		if m.Values[gatewayField] != x.instance {
			theirs = appendServed(theirs, m.Values)
		}
	}
	return theirs, nil
}

// write queues mine on pipe, entryMax tenants an entry.
func (x *Exchange) write(ctx context.Context, pipe redis.Pipeliner, mine []fairqueue.Served) {
	for len(mine) > 0 {
		n := min(len(mine), entryMax)
		x.args = append(x.args[:0], gatewayField, x.instance)
		for _, s := range mine[:n] {
			field := tenantPrefix + s.Tenant
			if s.Group {
				field = groupField
			}
			x.args = append(x.args, field, strconv.FormatFloat(s.Cost, 'g', -1, 64))
		}
		add := &redis.XAddArgs{Stream: x.key, MaxLen: MaxLen, Approx: true, Values: x.args}
		if ms, ok := idMillis(x.last); ok && ms > x.ttl.Milliseconds() {
			// By time too, on Redis's clock: older than the TTL.
			add.MaxLen, add.MinID = 0, strconv.FormatInt(ms-x.ttl.Milliseconds(), 10)
		}
		pipe.XAdd(ctx, add)
		mine = mine[n:]
	}
}

// appendServed appends an entry's costs to theirs.
func appendServed(theirs []fairqueue.Served, values map[string]any) []fairqueue.Served {
	for k, v := range values {
		tenant, ok := strings.CutPrefix(k, tenantPrefix)
		group := k == groupField
		if group {
			tenant = ""
		} else if !ok {
			continue
		}
		s, _ := v.(string)
		c, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			continue // not written by Swap: ignored
		}
		theirs = append(theirs, fairqueue.Served{Tenant: tenant, Cost: c, Group: group})
	}
	return theirs
}

// idMillis is the time part of a stream entry's ID (Unix ms on Redis's
// clock); false for none.
func idMillis(id string) (int64, bool) {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	return n, err == nil && n > 0
}
