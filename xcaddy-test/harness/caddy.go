package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Caddy is a running Caddy process.
type Caddy struct {
	child
	admin string // host:port of the admin endpoint
}

// StartCaddy writes caddyfile into a temporary directory and runs
//
//	<bin> run --config <file> --adapter caddyfile
//
// with its own XDG config and data directories (so parallel instances share
// no storage, autosave or locks). It returns once the admin endpoint answers
// GET /config/ and every site listener accepts connections, and stops Caddy
// when the test ends. The Caddyfile must name a loopback admin address, e.g.
// "{ admin 127.0.0.1:{{.Admin}} }" rendered with Render and Ports: the default
// localhost:2019 would collide between tests.
func StartCaddy(t testing.TB, bin, caddyfile string) *Caddy {
	t.Helper()
	dir := t.TempDir()
	// Adapting first gives the addresses to wait for, and a clear error for a
	// Caddyfile that does not parse.
	cfgPath, adapted := adapt(t, bin, dir, caddyfile)
	admin, listeners, err := addresses(adapted)
	if err != nil {
		t.Fatalf("harness: %v\nCaddyfile:\n%s", err, caddyfile)
	}

	c := &Caddy{child: newChild(t, filepath.Join(dir, "caddy.log"), "caddy"), admin: admin}
	t.Cleanup(func() { c.Stop() })
	c.start(t, "caddy", bin, []string{"run", "--config", cfgPath, "--adapter", "caddyfile"}, caddyEnv(dir), func() (bool, error) {
		code, _, err := httpStatus("GET", c.AdminURL()+"/config/", "", nil)
		if err != nil || code != 200 {
			return false, err
		}
		for _, l := range listeners {
			conn, err := net.DialTimeout("tcp", l, time.Second)
			if err != nil {
				return false, err
			}
			conn.Close()
		}
		return true, nil
	})
	return c
}

// caddyEnv isolates a Caddy process's storage in dir.
func caddyEnv(dir string) []string {
	return append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
}

// AdminURL is the base URL of Caddy's admin endpoint, e.g. for
// Metrics(t, c.AdminURL()+"/metrics").
func (c *Caddy) AdminURL() string { return "http://" + c.admin }

// PID is the Caddy process's id, e.g. to read its CPU time from /proc; it
// stays the same across Reload.
func (c *Caddy) PID() int { return c.cmd.Process.Pid }

// Reload replaces the running configuration through the admin API (POST
// /load with Content-Type text/caddyfile), as an operator would under load.
// The new configuration must keep the admin address. It returns an error
// carrying the response body when Caddy refuses the new configuration;
// Caddy then keeps running the old one.
func (c *Caddy) Reload(caddyfile string) error {
	code, body, err := httpStatus("POST", c.AdminURL()+"/load", "text/caddyfile", []byte(caddyfile))
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if code != 200 {
		return fmt.Errorf("reload: status %d: %s", code, bytes.TrimSpace(body))
	}
	return nil
}

// Stop ends Caddy with SIGTERM (a graceful stop, which waits for responses in
// flight), killing it if it has not exited after ten seconds (times
// scaled). It returns nil when Caddy exited cleanly. Calling it again is
// harmless.
func (c *Caddy) Stop() error { return c.stop() }

// Adapt runs "caddy adapt" on caddyfile and returns the JSON config.
func Adapt(t testing.TB, bin, caddyfile string) []byte {
	t.Helper()
	_, out := adapt(t, bin, t.TempDir(), caddyfile)
	return out
}

// adapt writes caddyfile to dir/Caddyfile and adapts it.
func adapt(t testing.TB, bin, dir, caddyfile string) (path string, adapted []byte) {
	t.Helper()
	path = filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "adapt", "--config", path, "--adapter", "caddyfile")
	cmd.Env = caddyEnv(dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	adapted, err := cmd.Output()
	if err != nil {
		t.Fatalf("harness: caddy adapt Caddyfile: %v\n%s", err, stderr.String())
	}
	return path, adapted
}

// Validate runs "caddy validate" on a config file, with an adapter when
// adapter is not empty ("caddyfile"; "" for JSON). It loads and provisions
// every module, so it catches what adapt cannot. The error carries Caddy's
// output.
func Validate(t testing.TB, bin, file, adapter string) error {
	t.Helper()
	args := []string{"validate", "--config", file}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = caddyEnv(t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("caddy validate %s: %v\n%s", file, err, out)
	}
	return nil
}

// addresses reads the admin address and the TCP addresses to dial for the
// HTTP servers' listeners from an adapted config.
func addresses(adapted []byte) (admin string, listeners []string, err error) {
	var cfg struct {
		Admin *struct {
			Disabled bool   `json:"disabled"`
			Listen   string `json:"listen"`
		} `json:"admin"`
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		return "", nil, fmt.Errorf("reading adapted config: %w", err)
	}
	if cfg.Admin == nil || cfg.Admin.Disabled || cfg.Admin.Listen == "" {
		return "", nil, errors.New("the Caddyfile must set a loopback admin address in its global options, e.g. { admin 127.0.0.1:{{.Admin}} } with a port from FreePort or Ports; the default localhost:2019 would collide between tests")
	}
	admin, err = dialAddr(cfg.Admin.Listen)
	if err != nil {
		return "", nil, fmt.Errorf("admin address %q: %w", cfg.Admin.Listen, err)
	}
	for _, srv := range cfg.Apps.HTTP.Servers {
		for _, l := range srv.Listen {
			a, err := dialAddr(l)
			if errors.Is(err, errNotTCP) {
				continue // e.g. a unix socket: nothing to dial over TCP
			}
			if err != nil {
				return "", nil, fmt.Errorf("listener %q: %w", l, err)
			}
			listeners = append(listeners, a)
		}
	}
	return admin, listeners, nil
}

// dialAddr turns a Caddy network address ("[network/]host:port[-port]") into
// a loopback host:port to dial: a wildcard host becomes 127.0.0.1 and a port
// range its first port.
func dialAddr(addr string) (string, error) {
	if network, rest, ok := strings.Cut(addr, "/"); ok {
		if network != "tcp" && network != "tcp4" && network != "tcp6" {
			return "", errNotTCP
		}
		addr = rest
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	port, _, _ = strings.Cut(port, "-")
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}
