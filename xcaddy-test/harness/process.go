package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// startTimeout bounds how long a process may take to become ready
	// (scaled). It is not an assertion: it only turns a hang into a
	// failure with logs.
	startTimeout = 60 * time.Second
	// stopTimeout is how long a process gets to exit after SIGTERM before it
	// is killed (Caddy waits for streaming responses on a graceful stop),
	// scaled.
	stopTimeout = 10 * time.Second
	// tailBytes is how much of a process's output is dumped on failure.
	tailBytes = 16 << 10
)

// client talks to the admin and debug endpoints. Without keep-alives no
// connection goroutine outlives a call, which keeps goleak quiet in tests
// that use the harness. Its timeout, like every guard here, is stretched
// by Scale.
var client = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
	Timeout:   Scale(60 * time.Second),
}

// logSink keeps a process's output in memory (for Logs and failure dumps)
// and in a file (to read after the test).
type logSink struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	file *os.File
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.file != nil {
		l.file.Write(p)
	}
	return len(p), nil
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logSink) tail(n int) string {
	s := l.String()
	if len(s) > n {
		return "...\n" + s[len(s)-n:]
	}
	return s
}

// child is what Caddy, Fake and Redis share: the process the harness
// started last, and its output across restarts.
type child struct {
	out  *logSink
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's result, set before done is closed
	// dumped: the output is logged when the test fails, so a failed start
	// need not show it.
	dumped bool
}

// newChild writes the output to a file at path (closed after the test's
// later cleanups, which stop the process); with what set, the output's tail
// is logged under that name when the test fails.
func newChild(t testing.TB, path, what string) child {
	t.Helper()
	file, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Close() })
	c := child{out: &logSink{file: file}, dumped: what != ""}
	if c.dumped {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("--- %s output (tail) ---\n%s\n--- end of %s output ---", what, c.out.tail(tailBytes), what)
			}
		})
	}
	return c
}

// start runs bin and waits until ready reports true; it fails the test
// when the process cannot start, exits or is not ready in time.
func (c *child) start(t testing.TB, what, bin string, args, env []string, ready func() (bool, error)) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("harness: starting %s: %v", what, err)
	}
	done := make(chan struct{})
	c.cmd, c.done = cmd, done
	go func() {
		c.err = cmd.Wait()
		close(done)
	}()
	if err := c.waitReady(ready); err != nil {
		if !c.dumped {
			t.Fatalf("harness: %s %v; its output:\n%s", what, err, c.out.tail(tailBytes))
		}
		t.Fatalf("harness: %s %v", what, err)
	}
}

// exited reports whether the process has exited, or none was started.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return c.done == nil
	}
}

// stop sends SIGTERM, then SIGKILL if the process has not exited after
// stopTimeout (scaled). It returns the exit error of a process that exited on its own
// terms, and an error saying so if it had to be killed.
func (c *child) stop() error {
	if c.exited() {
		return c.err
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	limit := Scale(stopTimeout)
	select {
	case <-c.done:
		return c.err
	case <-time.After(limit):
	}
	c.Kill()
	return fmt.Errorf("did not exit within %s of SIGTERM; killed", limit)
}

// Kill ends the process with SIGKILL, as a crash would: its connections
// break and nothing it holds is given back cleanly.
func (c *child) Kill() {
	if !c.exited() {
		c.cmd.Process.Kill()
		<-c.done
	}
}

// waitReady polls ready until it reports true, the process exits, or
// startTimeout (scaled) passes.
func (c *child) waitReady(ready func() (bool, error)) error {
	limit := Scale(startTimeout)
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := ready()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if c.exited() {
			return fmt.Errorf("exited before it was ready: %v", c.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s (last error: %v)", limit, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Logs returns everything the process printed so far, across restarts.
func (c *child) Logs() string { return c.out.String() }

// httpStatus GETs or POSTs a URL and returns the status and body.
func httpStatus(method, url, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

var errNotTCP = errors.New("not a TCP address")
