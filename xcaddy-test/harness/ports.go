package harness

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
)

var (
	portsMu sync.Mutex
	// portsGiven keeps one test process from handing out a port twice.
	portsGiven = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// process the test is about to start. It is drawn below the kernel's
// ephemeral range (ip_local_port_range), from which every outgoing
// connection takes its local port: between this call and the process's
// bind, or while a test has a server down before starting it again on
// the same port, the many connections of tests running beside it cannot
// take it. Where that range is unknown, the kernel picks, as it does for
// a listener on port 0.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	for range 200 {
		port := 0
		if low > minPort+1000 {
			port = minPort + rand.IntN(low-minPort)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			if port != 0 {
				continue // taken
			}
			t.Fatalf("harness: %v", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		portsMu.Lock()
		fresh := !portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if fresh {
			return port
		}
	}
	t.Fatal("harness: no fresh free port after 200 tries")
	return 0
}

// minPort is the lowest port FreePort draws: above the well-known and the
// usual registered services' ports.
const minPort = 20000

// ephemeralLow is the first port of the kernel's ephemeral range, 0 when
// unknown.
var ephemeralLow = sync.OnceValue(func() int {
	b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
})

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
