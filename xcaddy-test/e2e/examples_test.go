package e2e

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// isCaddyfile tells Caddyfiles by name: Caddyfile, Caddyfile.<x>,
// <x>.Caddyfile or <x>.caddyfile.
func isCaddyfile(name string) bool {
	return name == "Caddyfile" || strings.HasPrefix(name, "Caddyfile.") ||
		strings.HasSuffix(name, ".Caddyfile") || strings.HasSuffix(name, ".caddyfile")
}

// TestExamples: every Caddyfile in examples/ adapts, and validates (every
// module provisioned) both as a Caddyfile and as the JSON it adapts to;
// every JSON Caddy config there (a top-level "apps") validates too.
func TestExamples(t *testing.T) {
	t.Parallel()
	cbin, _ := bins(t)
	dir := filepath.Join(harness.RepoRoot(t), "examples")
	var caddyfiles, jsonConfigs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		switch {
		case isCaddyfile(d.Name()):
			caddyfiles = append(caddyfiles, p)
		case strings.HasSuffix(d.Name(), ".json"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var top map[string]json.RawMessage
			if json.Unmarshal(b, &top) == nil && top["apps"] != nil {
				jsonConfigs = append(jsonConfigs, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	if len(caddyfiles) == 0 {
		t.Fatalf("no Caddyfile found under %s: the examples are part of the contract (DESIGN section 7) and must exist", dir)
	}
	t.Logf("Caddyfiles: %v; JSON configs: %v", caddyfiles, jsonConfigs)

	for _, p := range caddyfiles {
		rel, _ := filepath.Rel(dir, p)
		t.Run(rel, func(t *testing.T) {
			src, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			adapted := harness.Adapt(t, cbin, string(src))
			if !strings.Contains(string(adapted), `"handler":"fair_queue"`) {
				t.Errorf("%s adapts to a config without a fair_queue handler:\n%s", rel, adapted)
			}
			if err := harness.Validate(t, cbin, p, "caddyfile"); err != nil {
				t.Errorf("validate as Caddyfile: %v", err)
			}
			// Round trip: the adapted JSON is itself a valid config.
			jp := filepath.Join(t.TempDir(), "adapted.json")
			if err := os.WriteFile(jp, adapted, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := harness.Validate(t, cbin, jp, ""); err != nil {
				t.Errorf("validate adapted JSON: %v", err)
			}
		})
	}
	for _, p := range jsonConfigs {
		rel, _ := filepath.Rel(dir, p)
		t.Run(rel, func(t *testing.T) {
			if err := harness.Validate(t, cbin, p, ""); err != nil {
				t.Errorf("validate: %v", err)
			}
		})
	}
}
