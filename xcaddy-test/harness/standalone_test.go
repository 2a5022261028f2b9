package harness

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestStandalone checks the testing.TB a command gets from Standalone
// behaves as the harness expects of a test's: Fatal ends the function and
// fails the run with its message, cleanups run last-in first-out after it
// (even after Fatal, and the context is cancelled before them), temporary
// directories are removed, and a run without failures returns nil.
func TestStandalone(t *testing.T) {
	var (
		order      []string
		dir        string
		reached    bool
		ctxAtClean error
	)
	err := Standalone(context.Background(), "demo", nil, func(tb testing.TB) {
		dir = tb.TempDir()
		if err := os.WriteFile(dir+"/f", []byte("x"), 0o644); err != nil {
			t.Errorf("writing in TempDir: %v", err)
		}
		tb.Cleanup(func() { order = append(order, "first") })
		tb.Cleanup(func() {
			order = append(order, "second")
			ctxAtClean = tb.Context().Err()
		})
		tb.Fatalf("boom %d", 42)
		reached = true
	})
	if err == nil || !strings.Contains(err.Error(), "boom 42") {
		t.Errorf("Standalone returned %v, want the Fatal message", err)
	}
	if reached {
		t.Error("the function went on after Fatal")
	}
	if !slices.Equal(order, []string{"second", "first"}) {
		t.Errorf("cleanups ran %v, want [second first]", order)
	}
	if ctxAtClean == nil {
		t.Error("the context was still live during the cleanups")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s still there after the run: %v", dir, err)
	}

	if err := Standalone(context.Background(), "ok", nil, func(tb testing.TB) {
		tb.Logf("fine")
		if tb.Failed() {
			t.Error("Failed before any failure")
		}
	}); err != nil {
		t.Errorf("a run without failures returned %v", err)
	}

	// Error fails the run but lets the function finish.
	finished := false
	err = Standalone(context.Background(), "err", nil, func(tb testing.TB) {
		tb.Error("soft")
		finished = tb.Failed()
	})
	if err == nil || !strings.Contains(err.Error(), "soft") || !finished {
		t.Errorf("after Error: returned %v, finished and failed %v; want the message and the function to finish", err, finished)
	}
}
