package caddyfairqueue

import (
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

// TestUsageRecorderBody reads a JSON response's usage however the proxy
// writes it: in one write of its Content-Length (read in place, never
// copied), in pieces (kept, then read), without a Content-Length, and past
// the length it announced (not trusted).
func TestUsageRecorderBody(t *testing.T) {
	body := []byte(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":25,"completion_tokens":7}}`)
	want := llmapi.Usage{Prompt: 25, Completion: 7, Reported: true}
	for _, tc := range []struct {
		name   string
		length int // Content-Length header; 0 for none
		writes [][]byte
		ok     bool
		copied bool
	}{
		{"one write", len(body), [][]byte{body}, true, false},
		{"two writes", len(body), [][]byte{body[:10], body[10:]}, true, true},
		{"no length", 0, [][]byte{body}, true, true},
		{"past its length", len(body), [][]byte{body, []byte(" ")}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			u := newUsageRecorder(w, nil)
			w.Header().Set("Content-Type", "application/json")
			if tc.length > 0 {
				w.Header().Set("Content-Length", strconv.Itoa(tc.length))
			}
			for _, p := range tc.writes {
				// The proxy reuses its buffer after each write.
				buf := append([]byte(nil), p...)
				if _, err := u.Write(buf); err != nil {
					t.Fatal(err)
				}
				clear(buf)
			}
			got, ok := u.usage()
			if ok != tc.ok || ok && got != want {
				t.Fatalf("usage() = %+v, %v; want %+v, %v", got, ok, want, tc.ok)
			}
			if copied := u.body.Cap() > 0; copied != tc.copied {
				t.Errorf("body kept in a buffer: %v, want %v", copied, tc.copied)
			}
		})
	}
}
