package harness

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// NodeClient runs "node client.mjs" in dir, the directory of a script
// driving an official client (xcaddy-test/openai-client, anthropic-client),
// with env added to its environment, and returns its standard output. pkg
// is the client's package under node_modules (scripts/test.sh installs it
// with npm ci), checked first so that a missing install says what to do.
func NodeClient(t testing.TB, dir, pkg string, env ...string) []byte {
	t.Helper()
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg)); err != nil {
		t.Fatalf("the official client %s is not installed: run 'npm ci' in %s (scripts/test.sh does): %v", pkg, dir, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Scale(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("node client.mjs: %v\n%s\n%s", err, out, stderr)
	}
	return out
}
