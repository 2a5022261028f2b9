package caddyfairqueue

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(ClusterLeastConn{})
}

// ClusterLeastConn places a gateway's requests on the upstreams of a pool
// shared with other gateways (cluster share_slots). Each gateway balancing
// only its own requests spreads the pool's unevenly: three gateways each
// with one request on upstream A and none on B send A three while B
// idles, and A's model server queues them. At every renewal of its grant
// a gateway learns its targets, where to place its grant so that, with
// the others' targets, no upstream gets more than its slots (package
// slots), and the other gateways' requests in flight on each upstream.
// It picks the available upstream with the most places left below its
// target, then the fewest requests in flight cluster-wide (its own now,
// the others' at their last renewal), then at random. fair_queue puts it
// in its reverse_proxy when share_slots is on and no selection policy is
// set; elsewhere, or while Redis is unreachable, it is least_conn.
type ClusterLeastConn struct {
	// view is the queue's last renewal's view of the upstreams, set by
	// fair_queue.
	view *atomic.Pointer[upstreamView]
	// placed counts the queue's requests placed on each upstream and not
	// yet ended, set by fair_queue (see placements).
	placed *placements
}

// placements counts, by dial address, the requests Select placed on each
// upstream that have not ended. reverse_proxy counts a request on its
// upstream (NumRequests) only some steps after Select returns, so two
// requests selected at once would both see the same room below a target
// and go to the same upstream: at a flood's start, one upstream past its
// share of the pool. Select places a request under the lock instead, so
// the next Select sees it at once.
type placements struct {
	mu sync.Mutex
	n  map[string]int
}

// placement is one request's place, carried in its context from
// fair_queue to Select: a retry (lb_retries) selects again, moving the
// place, and the request's end frees it.
type placement struct {
	set  *placements
	dial string // "" while not placed
}

// placementKey is the context key of a request's *placement.
type placementKey struct{}

// withPlacement returns r with a fresh placement in set, and the
// placement, which the caller releases when the request ends.
func withPlacement(r *http.Request, set *placements) (*http.Request, *placement) {
	pl := &placement{set: set}
	return r.WithContext(context.WithValue(r.Context(), placementKey{}, pl)), pl
}

// counts copies the places held, by dial.
func (s *placements) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n)
}

// release frees the request's place, if it holds one.
func (pl *placement) release() {
	s := pl.set
	s.mu.Lock()
	defer s.mu.Unlock()
	pl.moveLocked("")
}

// moveLocked frees the request's place and takes the one at dial ("":
// none).
func (pl *placement) moveLocked(dial string) {
	s := pl.set
	if pl.dial != "" {
		if s.n[pl.dial]--; s.n[pl.dial] <= 0 {
			delete(s.n, pl.dial)
		}
	}
	pl.dial = dial
	if dial != "" {
		if s.n == nil {
			s.n = make(map[string]int)
		}
		s.n[dial]++
	}
}

// upstreamView is what a renewal of the grant says of each upstream, by
// dial address.
type upstreamView struct {
	others  map[string]int // the other gateways' requests in flight
	targets map[string]int // where this gateway places its grant
	// holds is what the renewal told the others this gateway may have on
	// each upstream until its next renewal (holdsUntilNext): room beside
	// the targets for the requests it dispatched before it applied them.
	// While the next renewal's call is made, the targets are that call's
	// holds, and holds is nil (beginRenewal).
	holds map[string]int
}

// CaddyModule returns the Caddy module information.
func (ClusterLeastConn) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.fair_queue_least_conn",
		New: func() caddy.Module { return new(ClusterLeastConn) },
	}
}

// Select picks the available upstream with the most places left below
// its target (or below what the last renewal holds for this gateway
// there, until the next renewal starts: upstreamView.holds), then the
// fewest requests in flight cluster-wide, a random one among ties. A request fair_queue placed (placement in its context)
// holds its place from here until it ends, so that concurrent Selects see
// one another's choices.
func (p *ClusterLeastConn) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var pl *placement
	if r != nil {
		pl, _ = r.Context().Value(placementKey{}).(*placement)
	}
	if pl == nil || p.placed == nil || pl.set != p.placed {
		return pick(pool, p.loadView(), nil)
	}
	// The view is read under the lock a renewal takes its loads and sets
	// the view under (beginRenewal): a place taken before is in the
	// loads, one taken after is within the renewal's holds.
	p.placed.mu.Lock()
	defer p.placed.mu.Unlock()
	v := p.loadView()
	pl.moveLocked("") // a retry's place is chosen afresh
	best := pick(pool, v, p.placed.n)
	if best != nil {
		pl.moveLocked(best.Dial)
	}
	return best
}

// loadView is the last renewal's view; empty when unknown.
func (p *ClusterLeastConn) loadView() upstreamView {
	if p.view != nil {
		if cur := p.view.Load(); cur != nil {
			return *cur
		}
	}
	return upstreamView{}
}

// pick is Select's choice given the view and the requests placed and not
// yet counted by reverse_proxy (placed, by dial; nil: none): a request
// counts once, as the larger of the two counts.
func pick(pool reverseproxy.UpstreamPool, v upstreamView, placed map[string]int) *reverseproxy.Upstream {
	var best *reverseproxy.Upstream
	bestRoom, bestLoad, ties := 0, 0, 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		mine := max(u.NumRequests(), placed[u.Dial])
		room, load := 0, mine+v.others[u.Dial]
		if v.targets != nil {
			room = max(max(v.targets[u.Dial], v.holds[u.Dial])-mine, 0)
		}
		switch {
		case best == nil || room > bestRoom || (room == bestRoom && load < bestLoad):
			best, bestRoom, bestLoad, ties = u, room, load, 1
		case room == bestRoom && load == bestLoad:
			// Reservoir sampling: each tie equally likely.
			if ties++; rand.IntN(ties) == 0 {
				best = u
			}
		}
	}
	return best
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens:
//
//	lb_policy fair_queue_least_conn
func (p *ClusterLeastConn) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the policy's name
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Interface guards
var (
	_ reverseproxy.Selector = (*ClusterLeastConn)(nil)
	_ caddyfile.Unmarshaler = (*ClusterLeastConn)(nil)
)
