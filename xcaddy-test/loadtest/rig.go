// Package loadtest measures what fair_queue costs through the xcaddy-built
// binary: one Caddy serves two sites in front of the same fast upstream, a
// plain reverse_proxy and a fair_queue, and rounds of small chat completions
// alternate between them (plain, fair, plain, fair...) so that whatever else
// the shared machine does in the meantime lands on both about equally. Each
// round reports throughput, p50 and p99 latency, errors and the Caddy
// process's CPU time per request (utime + stime from /proc, steadier than
// wall time on a shared machine); the summary gives medians over rounds and
// the fair/plain ratios.
//
// The load comes from vegeta (github.com/tsenart/vegeta/v12) used as a
// library: max-rate mode with a fixed number of workers, or a fixed rate.
// The command is xcaddy-test/fqload (make load); the end-to-end test
// TestLoadToolRuns runs a short version and checks the machinery, never the
// ratios.
package loadtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// QueueName is the fair_queue's name in the load Caddyfile, the queue label
// of its metrics.
const QueueName = "load"

// BacklogQueueName is the backlog site's fair_queue (see Options.Backlog),
// whose max_inflight is BacklogInflight: far fewer slots than the load keeps
// requests in flight, so the rest wait in its queue.
const (
	BacklogQueueName = "load_backlog"
	BacklogInflight  = 16
)

// caddyfileTmpl is the Caddy under test: the same upstream behind a plain
// reverse_proxy, behind a second identical one (the control, see
// Options.Control) and behind fair_queue. max_inflight is set above the number
// of requests the load keeps in flight, so fair_queue never holds a request
// back: what the comparison shows is its per-request cost, not queueing.
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
	// Caddy is the process under test; its PID gives the CPU figures.
	Caddy *harness.Caddy
	// Upstream is the fast in-process upstream both sites proxy to.
	Upstream *Upstream
	// PlainURL, ControlURL and FairURL are the sites' base URLs: a plain
	// reverse_proxy, another one just like it, and fair_queue. BacklogURL
	// is a fair_queue with BacklogInflight slots (Options.Backlog).
	PlainURL, ControlURL, FairURL, BacklogURL string
	// Caddyfile is the configuration Caddy runs.
	Caddyfile string
}

// Start starts the upstream and Caddy (the binary at caddyBin, e.g.
// harness.BuildCaddy) with the three sites, and stops both when t ends.
// maxInflight is fair_queue's max_inflight: keep it above the requests the
// load keeps in flight (Options.MaxInflight).
func Start(t testing.TB, caddyBin string, maxInflight int) *Rig {
	t.Helper()
	up, err := StartUpstream()
	if err != nil {
		t.Fatalf("loadtest: upstream: %v", err)
	}
	t.Cleanup(func() { up.Close() })
	p := harness.Ports(t, "Admin", "Plain", "Control", "Fair", "Backlog")
	cf := harness.Render(t, caddyfileTmpl, map[string]any{
		"Admin": p["Admin"], "Plain": p["Plain"], "Control": p["Control"], "Fair": p["Fair"], "Backlog": p["Backlog"],
		"Upstream": up.Addr(), "Queue": QueueName, "MaxInflight": maxInflight,
		"BacklogQueue": BacklogQueueName, "BacklogInflight": BacklogInflight,
	})
	c := harness.StartCaddy(t, caddyBin, cf)
	return &Rig{
		Caddy:      c,
		Upstream:   up,
		PlainURL:   "http://127.0.0.1:" + strconv.Itoa(p["Plain"]),
		ControlURL: "http://127.0.0.1:" + strconv.Itoa(p["Control"]),
		FairURL:    "http://127.0.0.1:" + strconv.Itoa(p["Fair"]),
		BacklogURL: "http://127.0.0.1:" + strconv.Itoa(p["Backlog"]),
		Caddyfile:  cf,
	}
}

// completion is the upstream's answer to every request: a small chat
// completion with usage, as BenchmarkProxy's upstream answers, so fair_queue
// reads actual usage as it would from a model server.
var completion = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":25,"completion_tokens":7,"total_tokens":32}}`)

// Upstream is a model server as fast as a loopback HTTP server gets: no
// slots, no latency unless SetDelay gives it one, no request record
// (fakellm keeps one per request, which would add its own cost to both
// sides of the comparison).
type Upstream struct {
	ln     net.Listener
	srv    *http.Server
	served atomic.Uint64
	delay  atomic.Int64 // ns before each answer
	done   chan error
}

// SetDelay makes the upstream answer each request d after reading it, as a
// model server takes its time: a slow upstream fills fair_queue's slots.
func (u *Upstream) SetDelay(d time.Duration) { u.delay.Store(int64(d)) }

// StartUpstream listens on a free loopback port and serves until Close.
func StartUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{ln: ln, done: make(chan error, 1)}
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
	go func() { u.done <- u.srv.Serve(ln) }()
	return u, nil
}

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// Served is how many requests the upstream has answered.
func (u *Upstream) Served() uint64 { return u.served.Load() }

// Close stops the upstream, cutting its connections.
func (u *Upstream) Close() error {
	err := u.srv.Close()
	if serr := <-u.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("upstream: %w", serr)
	}
	return err
}
