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

// TestBodyTimeout: a body that stalls is ended once its deadline passed,
// on a real connection (its read deadline) and where there is none (the
// body closed); a body that arrives in time is untouched, even by a timer
// that fires after the read ended; no goroutine is left behind.
func TestBodyTimeout(t *testing.T) {
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
			var watch bodyRead
			b, err := readBody(w, r, 1<<20, time.Now().Add(timeout), &watch, nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			// Once read, the body is no longer watched: its timer
			// firing now (run here, as if it had raced done) leaves
			// the connection alone, so its next request is read as
			// usual.
			watch.fire()
			if watch.timedOut() {
				t.Error("a body read in time counts as timed out")
			}
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
