package caddyfairqueue

import (
	"math/rand/v2"
	"net/http"
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
}

// upstreamView is what a renewal of the grant says of each upstream, by
// dial address.
type upstreamView struct {
	others  map[string]int // the other gateways' requests in flight
	targets map[string]int // where this gateway places its grant
}

// CaddyModule returns the Caddy module information.
func (ClusterLeastConn) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.fair_queue_least_conn",
		New: func() caddy.Module { return new(ClusterLeastConn) },
	}
}

// Select picks the available upstream with the most places left below
// its target, then the fewest requests in flight cluster-wide, a random
// one among ties.
func (p *ClusterLeastConn) Select(pool reverseproxy.UpstreamPool, _ *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var v upstreamView
	if p.view != nil {
		if cur := p.view.Load(); cur != nil {
			v = *cur
		}
	}
	var best *reverseproxy.Upstream
	bestRoom, bestLoad, ties := 0, 0, 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		mine := u.NumRequests()
		room, load := 0, mine+v.others[u.Dial]
		if v.targets != nil {
			room = max(v.targets[u.Dial]-mine, 0)
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
