package caddyfairqueue

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestBodyWatch: a body that stalls is ended once its deadline passed, on
// a real connection (its read deadline) and where there is none (the body
// closed); a body that arrives in time is untouched; once nothing is
// being read, the watch's goroutine is gone.
func TestBodyWatch(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	const timeout = 150 * time.Millisecond
	read := func(w http.ResponseWriter, r *http.Request) ([]byte, error) {
		var watch bodyRead
		return readBody(w, r, 1<<20, time.Now().Add(timeout), &watch, nil)
	}

	t.Run("connection", func(t *testing.T) {
		got := make(chan error, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := read(w, r)
			got <- err
		}))
		defer srv.Close()
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// 100 bytes announced, 10 sent: the rest never comes.
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
		wantBodyTimeout(t, got)
	})

	t.Run("no connection deadline", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		r := httptest.NewRequest(http.MethodPost, "/", pr)
		r.ContentLength = 100
		done := make(chan error, 1)
		go func() {
			_, err := read(httptest.NewRecorder(), r)
			done <- err
		}()
		if _, err := pw.Write([]byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		wantBodyTimeout(t, done)
	})

	t.Run("in time", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			deadline := time.Now().Add(timeout)
			var watch bodyRead
			b, err := readBody(w, r, 1<<20, deadline, &watch, nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			// Once read, the body is no longer watched: a sweep once its
			// deadline has passed (run here, so that it surely comes,
			// rather than hoped for from the watch's goroutine within a
			// few periods) leaves the connection alone, so its next
			// request is read as usual.
			time.Sleep(time.Until(deadline))
			bodies.sweep(time.Now())
			_, _ = w.Write(b)
		}))
		defer srv.Close()
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for i := range 2 {
			body := fmt.Sprintf("request %d", i)
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != body {
				t.Fatalf("request %d: %d %q, want 200 %q", i, resp.StatusCode, b, body)
			}
		}
	})

	if bodies.sweep(time.Now()) {
		t.Fatal("a body is still watched after its read ended")
	}
	eventually(t, "the body watch's goroutine gone, nothing being watched", func() bool { return !bodies.running.Load() })
	goleak.VerifyNone(t, ignore)
}

// wantBodyTimeout waits for a stalled read's error: errBodyTimeout.
func wantBodyTimeout(t *testing.T, got <-chan error) {
	t.Helper()
	select {
	case err := <-got:
		if !errors.Is(err, errBodyTimeout) {
			t.Fatalf("stalled body: %v, want errBodyTimeout", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("a stalled body was not ended within %s", waitLimit)
	}
}

// TestBodyWatchKeepsOthers: ending one late body leaves the others being
// read alone, whatever their place in the list.
func TestBodyWatchKeepsOthers(t *testing.T) {
	now := time.Now()
	reads := make([]bodyRead, 5)
	closed := make([]bool, len(reads))
	for i := range reads {
		deadline := now.Add(time.Hour)
		if i%2 == 1 {
			deadline = now.Add(-time.Second)
		}
		reads[i] = bodyRead{deadline: deadline, body: closeFunc(func() { closed[i] = true })}
		bodies.add(&reads[i])
	}
	if !bodies.sweep(now) {
		t.Fatal("sweep saw no body")
	}
	for i := range reads {
		if want := i%2 == 1; reads[i].timedOut() != want || closed[i] != want {
			t.Errorf("read %d: timed out %v, closed %v; want %v", i, reads[i].timedOut(), closed[i], want)
		}
	}
	for i := range reads {
		reads[i].done()
	}
	if bodies.sweep(now) {
		t.Fatal("reads left in the watch")
	}
}

type closeFunc func()

func (f closeFunc) Close() error { f(); return nil }

// TestBodyWatchRestarts: the watch's goroutine leaves when nothing is
// watched and comes back with the next read, however the two race: a late
// read is always ended, from any of several goroutines at once.
func TestBodyWatchRestarts(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	const workers, rounds = 4, 12
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range rounds {
				fired := make(chan struct{})
				b := &bodyRead{deadline: time.Now().Add(-time.Second), body: closeFunc(func() { close(fired) })}
				bodies.add(b)
				select {
				case <-fired:
				case <-time.After(waitLimit):
					errs <- fmt.Errorf("worker %d round %d: a late read was not ended within %s", w, i, waitLimit)
					return
				}
				b.done()
				// Now and then nothing is watched for longer than a
				// period, and the goroutine goes (pacing only: the test
				// asserts that every late read is ended, however the
				// goroutine's leaving and coming back interleave).
				if i%5 == 0 {
					time.Sleep(2 * bodyWatchPeriod)
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the body watch's goroutine gone, nothing being watched", func() bool { return !bodies.running.Load() })
	goleak.VerifyNone(t, ignore)
}
