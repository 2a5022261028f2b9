package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/fakellm/fakeapi"
)

// FakeOptions configure a fakellm process. Zero values keep fakellm's own
// defaults (4 slots, 20ms to first token, 2ms per token, 16 output tokens);
// Args can pass anything else, e.g. "-ttft=0".
type FakeOptions struct {
	Name          string // X-Fake-Upstream; default "fake1", "fake2"... in start order
	Slots         int
	TTFT          time.Duration
	PerToken      time.Duration
	DefaultOutput int
	Down          bool     // start with /health answering 503
	Args          []string // extra command-line flags
	Bin           string   // fakellm binary; default BuildFake(t)
}

// FakeStats is fakellm's /debug/stats, FakeRequest an entry of its
// /debug/requests.
type (
	FakeStats   = fakeapi.Stats
	FakeRequest = fakeapi.Record
)

// fakeCount numbers unnamed fakes so that two of them never share a name.
var fakeCount atomic.Int64

// Fake is a running fakellm process.
type Fake struct {
	child
	t    testing.TB
	opts FakeOptions
	port int
}

// StartFake runs fakellm on a loopback port, waits until /health answers (200
// or 503), and stops it when the test ends.
func StartFake(t testing.TB, opts FakeOptions) *Fake {
	t.Helper()
	if opts.Bin == "" {
		opts.Bin = BuildFake(t)
	}
	if opts.Name == "" {
		opts.Name = fmt.Sprint("fake", fakeCount.Add(1))
	}
	f := &Fake{child: newChild(t, filepath.Join(t.TempDir(), opts.Name+".log"), "fakellm "+opts.Name), t: t, opts: opts}
	t.Cleanup(func() {
		if !f.exited() {
			f.Stop()
		}
	})
	f.run()
	return f
}

func (f *Fake) run() {
	f.t.Helper()
	args := []string{"-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(f.port)), "-name", f.opts.Name}
	flag := func(name string, v any, set bool) {
		if set {
			args = append(args, fmt.Sprintf("-%s=%v", name, v))
		}
	}
	flag("slots", f.opts.Slots, f.opts.Slots != 0)
	flag("ttft", f.opts.TTFT, f.opts.TTFT != 0)
	flag("per-token", f.opts.PerToken, f.opts.PerToken != 0)
	flag("default-output", f.opts.DefaultOutput, f.opts.DefaultOutput != 0)
	flag("down", true, f.opts.Down)
	args = append(args, f.opts.Args...)

	mark := len(f.out.String())
	// The first start listens on port 0 and reads the port fakellm prints
	// (no race for a free port); a restart reuses it.
	f.start(f.t, "fakellm", f.opts.Bin, args, os.Environ(), func() (bool, error) {
		if f.port == 0 {
			port, ok := listeningPort(f.out.String()[mark:])
			if !ok {
				return false, nil
			}
			f.port = port
		}
		code, _, err := httpStatus("GET", f.URL()+"/health", "", nil)
		return code == 200 || code == 503, err
	})
}

func listeningPort(out string) (int, bool) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "FAKELLM_LISTENING "); ok {
			_, port, err := net.SplitHostPort(strings.TrimSpace(addr))
			if err != nil {
				return 0, false
			}
			n, err := strconv.Atoi(port)
			return n, err == nil
		}
	}
	return 0, false
}

// Name is the fake's name, sent in its X-Fake-Upstream response header.
func (f *Fake) Name() string { return f.opts.Name }

// Addr is the fake's host:port, e.g. for a Caddyfile's reverse_proxy.
func (f *Fake) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.port)) }

// URL is the fake's base URL.
func (f *Fake) URL() string { return "http://" + f.Addr() }

// Port is the fake's port; it stays the same across Restart.
func (f *Fake) Port() int { return f.port }

// call sends a request without a body to the fake's path and, unless v is
// nil, decodes the answer into v.
func (f *Fake) call(method, path string, v any) {
	f.t.Helper()
	code, body, err := httpStatus(method, f.URL()+path, "", nil)
	if err != nil || code != 200 {
		f.t.Fatalf("harness: fakellm %s %s: %d %s %v", method, path, code, body, err)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			f.t.Fatalf("harness: fakellm %s %s: %v", method, path, err)
		}
	}
}

// SetHealth switches what the fake's /health answers (200 or 503).
func (f *Fake) SetHealth(up bool) {
	f.t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	f.call("POST", "/admin/health?state="+state, nil)
}

// Pause makes requests that get a generation slot hold it, before their
// first token, until Resume: a deterministic way to fill the upstream and
// build a queue in the gateway.
func (f *Fake) Pause() { f.t.Helper(); f.call("POST", "/admin/pause", nil) }

// Resume lets paused requests generate.
func (f *Fake) Resume() { f.t.Helper(); f.call("POST", "/admin/resume", nil) }

// Stats returns the fake's counters since its last Reset and its live gauges.
func (f *Fake) Stats() FakeStats {
	f.t.Helper()
	var st FakeStats
	f.call("GET", "/debug/stats", &st)
	return st
}

// Requests returns the last 10000 requests the fake received, oldest first.
func (f *Fake) Requests() []FakeRequest {
	f.t.Helper()
	var rs []FakeRequest
	f.call("GET", "/debug/requests", &rs)
	return rs
}

// Reset clears the fake's request record and counters.
func (f *Fake) Reset() { f.t.Helper(); f.call("POST", "/debug/reset", nil) }

// Stop ends the fake gracefully (SIGTERM): it aborts its requests in flight
// and exits.
func (f *Fake) Stop() {
	f.t.Helper()
	if err := f.stop(); err != nil {
		f.t.Errorf("harness: fakellm %s did not stop cleanly: %v", f.Name(), err)
	}
}

// Restart stops the fake if it is running and starts a new process on the
// same port with the same options: a fresh health state, slots and record.
func (f *Fake) Restart() {
	f.t.Helper()
	if !f.exited() {
		f.Stop()
	}
	f.out.Write([]byte("--- harness: restart ---\n"))
	f.run()
}
