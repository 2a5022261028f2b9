package harness

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis is a redis-server process on a loopback port of its own, which a
// test may kill and start again on the same port.
type Redis struct {
	child
	t    testing.TB
	args []string
	port int
	dir  string
}

// StartRedis runs redis-server with args on a free port, in a directory of
// its own, and waits until it answers PING; the test's cleanup kills it.
// Unless args make it a sentinel, it keeps nothing on disk: a restart
// forgets every key, as a crashed cache does.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not on PATH: install Debian's redis-server package (scripts/test.sh does)")
	}
	r := &Redis{t: t, args: args, port: FreePort(t), dir: t.TempDir()}
	r.child = newChild(t, filepath.Join(r.dir, "redis.log"), "")
	t.Cleanup(r.Kill)
	r.Start()
	return r
}

// Start starts the server again after Kill, on the same port.
func (r *Redis) Start() {
	r.t.Helper()
	args := append(slices.Clone(r.args), "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir)
	if !slices.Contains(r.args, "--sentinel") {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	r.start(r.t, "redis-server", "redis-server", args, os.Environ(), r.ping)
}

func (r *Redis) ping() (bool, error) {
	conn, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "+PONG") {
		return false, fmt.Errorf("PING: %q %v", line, err)
	}
	return true, nil
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is the server's redis:// URL, for a cluster block.
func (r *Redis) URL() string { return "redis://" + r.Addr() }
