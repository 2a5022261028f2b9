// Package loadtest measures what fair_queue costs through the xcaddy-built
// binary: one Caddy serves a plain reverse_proxy site and a fair_queue site
// in front of the same fast upstream, and rounds of small chat completions
// alternate between them (plain, fair, plain...) so that whatever else the
// shared machine does lands on both about equally. Each round reports
// throughput, p50 and p99, errors and Caddy's CPU time per request (from
// /proc, steadier than wall time); the summary gives medians over rounds
// and the fair/plain ratios. The load comes from vegeta used as a library.
// The command is xcaddy-test/fqload (make load); TestLoadToolRuns checks
// the machinery, never the ratios.
package loadtest

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

const (
	// QueueName is the fair site's queue (the queue label of its metrics).
	QueueName = "load"
	// BacklogQueueName is the backlog site's queue (Options.Backlog), with
	// BacklogInflight slots: far fewer than the requests the load keeps in
	// flight, so the rest wait in it.
	BacklogQueueName = "load_backlog"
	BacklogInflight  = 16
)

// caddyfileTmpl serves the same upstream through a plain reverse_proxy, a
// second identical one (the control, Options.Control), fair_queue, and the
// backlog site. The fair site's max_inflight is above the requests the load
// keeps in flight: the comparison shows its per-request cost, not queueing.
const caddyfileTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	auto_https off
	persist_config off
}
http://127.0.0.1:{{.Plain}} {
	reverse_proxy {{.Upstream}}
}
http://127.0.0.1:{{.Control}} {
	reverse_proxy {{.Upstream}}
}
http://127.0.0.1:{{.Fair}} {
	fair_queue {
		name {{.Queue}}
		tenant_key {http.request.header.X-Tenant-ID}
		max_inflight {{.MaxInflight}}
		reverse_proxy {{.Upstream}}
	}
}
http://127.0.0.1:{{.Backlog}} {
	fair_queue {
		name {{.BacklogQueue}}
		tenant_key {http.request.header.X-Tenant-ID}
		max_inflight {{.BacklogInflight}}
		reverse_proxy {{.Upstream}}
	}
}
`

// Rig is a running Caddy with the sites and their upstream.
type Rig struct {
	Caddy    *harness.Caddy // its PID gives the CPU figures
	Upstream *Upstream
	// The sites' base URLs (see caddyfileTmpl).
	PlainURL, ControlURL, FairURL, BacklogURL string
}

// Start starts the upstream and Caddy (the binary at caddyBin) with the
// sites, and stops both when t ends. maxInflight is the fair site's
// max_inflight (Options.MaxInflight).
func Start(t testing.TB, caddyBin string, maxInflight int) *Rig {
	t.Helper()
	up := startUpstream(t)
	p := harness.Ports(t, "Admin", "Plain", "Control", "Fair", "Backlog")
	cf := harness.Render(t, caddyfileTmpl, map[string]any{
		"Admin": p["Admin"], "Plain": p["Plain"], "Control": p["Control"], "Fair": p["Fair"], "Backlog": p["Backlog"],
		"Upstream": up.Addr(), "Queue": QueueName, "MaxInflight": maxInflight,
		"BacklogQueue": BacklogQueueName, "BacklogInflight": BacklogInflight,
	})
	url := func(site string) string { return "http://127.0.0.1:" + strconv.Itoa(p[site]) }
	return &Rig{
		Caddy:    harness.StartCaddy(t, caddyBin, cf),
		Upstream: up,
		PlainURL: url("Plain"), ControlURL: url("Control"), FairURL: url("Fair"), BacklogURL: url("Backlog"),
	}
}

// completion is the upstream's answer to every request: a small chat
// completion with usage, so fair_queue reads usage as from a model server.
var completion = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":25,"completion_tokens":7,"total_tokens":32}}`)

// Upstream is a model server as fast as a loopback HTTP server gets: no
// slots, no latency unless SetDelay gives it one, no request record (which
// would add its own cost to both sides of the comparison).
type Upstream struct {
	ln     net.Listener
	srv    *http.Server
	served atomic.Uint64
	delay  atomic.Int64 // ns before each answer
}

// SetDelay makes the upstream answer each request d after reading it, as a
// model server takes its time: a slow upstream fills fair_queue's slots.
func (u *Upstream) SetDelay(d time.Duration) { u.delay.Store(int64(d)) }

// startUpstream starts the upstream, stopped when t ends.
func startUpstream(t testing.TB) *Upstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("loadtest: upstream: %v", err)
	}
	u := &Upstream{ln: ln}
	clen := strconv.Itoa(len(completion))
	u.srv = &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if d := time.Duration(u.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			h := w.Header()
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{clen}
			_, _ = w.Write(completion)
			u.served.Add(1)
		}),
	}
	go u.srv.Serve(ln)
	t.Cleanup(func() { u.srv.Close() })
	return u
}

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// Served is how many requests the upstream has answered.
func (u *Upstream) Served() uint64 { return u.served.Load() }
