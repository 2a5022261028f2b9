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

// ClusterLeastConn is least_conn across the gateways sharing a pool
// (cluster share_slots): it picks the available upstream with the fewest
// requests in flight counting, besides this gateway's own, those the other
// gateways reported at their last renewal of the pool's grants. Each
// gateway balancing only its own requests spreads the pool's unevenly:
// three gateways each with one request on upstream A and none on B send A
// three while B idles, and A's model server queues them. fair_queue puts
// it in its reverse_proxy when share_slots is on and no selection policy
// is set; elsewhere, or while Redis is unreachable, it is least_conn.
type ClusterLeastConn struct {
	// others is the queue's view of the other gateways' requests in
	// flight per upstream (by dial address), set by fair_queue.
	others *atomic.Pointer[map[string]int]
}

// CaddyModule returns the Caddy module information.
func (ClusterLeastConn) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.fair_queue_least_conn",
		New: func() caddy.Module { return new(ClusterLeastConn) },
	}
}

// Select picks the available upstream with the fewest requests in flight
// cluster-wide, a random one among ties.
func (p *ClusterLeastConn) Select(pool reverseproxy.UpstreamPool, _ *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var others map[string]int
	if p.others != nil {
		if m := p.others.Load(); m != nil {
			others = *m
		}
	}
	var best *reverseproxy.Upstream
	least, ties := -1, 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		n := u.NumRequests() + others[u.Dial]
		if least < 0 || n < least {
			least, ties = n, 0
		}
		if n == least {
			// Reservoir sampling: each tie equally likely.
			if ties++; ties == 1 || rand.IntN(ties) == 0 {
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
