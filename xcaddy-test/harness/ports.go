package harness

import (
	"net"
	"strings"
	"sync"
	"testing"
	"text/template"
)

var (
	portsMu sync.Mutex
	// portsGiven keeps one test process from handing out a port twice: the
	// kernel may offer a just-closed ephemeral port again.
	portsGiven = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// process the test is about to start. Another process could take it in
// between; in practice ephemeral ports are not reused that fast.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		portsMu.Lock()
		fresh := !portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if fresh {
			return port
		}
	}
	t.Fatal("harness: no fresh free port after 100 tries")
	return 0
}

// Ports returns a free port for each name, for use as Render's data:
//
//	p := harness.Ports(t, "Admin", "Site")
//	cf := harness.Render(t, `{ admin 127.0.0.1:{{.Admin}} }
//	http://127.0.0.1:{{.Site}} { respond "hi" }`, p)
func Ports(t testing.TB, names ...string) map[string]int {
	t.Helper()
	m := make(map[string]int, len(names))
	for _, n := range names {
		m[n] = FreePort(t)
	}
	return m
}

// Render executes a text/template (a Caddyfile, usually) with data. Caddy's
// own placeholders use single braces, so they pass through untouched;
// referring to a missing map key is an error rather than "<no value>".
func Render(t testing.TB, tmpl string, data any) string {
	t.Helper()
	tp, err := template.New("caddyfile").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		t.Fatalf("harness: template: %v", err)
	}
	var b strings.Builder
	if err := tp.Execute(&b, data); err != nil {
		t.Fatalf("harness: template: %v", err)
	}
	return b.String()
}
