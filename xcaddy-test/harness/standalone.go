package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
)

// Standalone runs f with a testing.TB that works outside "go test", so a
// command (the load tool, xcaddy-test/fqload) can build and run Caddy and
// the fakes with the same helpers as the tests, instead of a second copy of
// the process management. It behaves like a test's T where the harness
// relies on it: Fatal ends f (runtime.Goexit, so f must call it from its own
// goroutine, as in a test), Cleanup functions run last-in first-out once f
// has returned (a TempDir's removal among them), and Context is cancelled just
// before the cleanups, or when parent is (e.g. on an interrupt, which then
// stops a build in progress). Log output goes to logw (nil: discarded). The
// error says whether f failed (Error, Fatal or Fail) and why.
func Standalone(parent context.Context, name string, logw io.Writer, f func(t testing.TB)) error {
	if logw == nil {
		logw = io.Discard
	}
	ctx, cancel := context.WithCancel(parent)
	s := &standaloneTB{name: name, out: logw, ctx: ctx}
	goexitSafe(func() { f(s) })
	cancel()
	s.runCleanups()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		if s.firstErr == "" {
			s.firstErr = "failed"
		}
		return fmt.Errorf("%s: %s", name, s.firstErr)
	}
	return nil
}

// standaloneTB is Standalone's testing.TB: the methods the harness and the
// load tool call. The embedded interface is nil; it supplies TB's
// unexported method, and calling any other (Skip, Setenv...) panics.
type standaloneTB struct {
	testing.TB

	name string
	out  io.Writer
	ctx  context.Context

	mu       sync.Mutex
	failed   bool
	firstErr string
	cleanups []func()
}

func (s *standaloneTB) runCleanups() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			return
		}
		fn := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		goexitSafe(fn) // a Fatal inside a cleanup ends only that cleanup
	}
}

// goexitSafe runs f on a goroutine of its own and waits for it, so that
// f's Fatal (runtime.Goexit) ends f, not the caller.
func goexitSafe(f func()) {
	var wg sync.WaitGroup
	wg.Go(f)
	wg.Wait()
}

func (s *standaloneTB) fail(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed = true
	if s.firstErr == "" {
		s.firstErr = msg
	}
}

func (s *standaloneTB) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}
func (s *standaloneTB) Error(args ...any)                 { s.Log(args...); s.fail(fmt.Sprint(args...)) }
func (s *standaloneTB) Errorf(format string, args ...any) { s.Error(fmt.Sprintf(format, args...)) }
func (s *standaloneTB) Fatal(args ...any) {
	s.Error(args...)
	runtime.Goexit()
}
func (s *standaloneTB) Fatalf(format string, args ...any) { s.Fatal(fmt.Sprintf(format, args...)) }
func (s *standaloneTB) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}
func (s *standaloneTB) Helper()                         {}
func (s *standaloneTB) Log(args ...any)                 { fmt.Fprintln(s.out, args...) }
func (s *standaloneTB) Logf(format string, args ...any) { s.Log(fmt.Sprintf(format, args...)) }
func (s *standaloneTB) TempDir() string {
	d, err := os.MkdirTemp("", "fairqueue-"+s.name+"-")
	if err != nil {
		s.Fatal(err)
	}
	s.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (s *standaloneTB) Context() context.Context { return s.ctx }
