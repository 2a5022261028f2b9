// Package harness runs end-to-end tests of caddy-fair-queue against real
// processes: a Caddy binary built by xcaddy from the local checkout, and the
// fakellm upstream (xcaddy-test/fakellm). It builds both once per source
// change (cached across test processes), starts them on loopback ports,
// captures their logs, and stops them when the test ends.
//
// Helpers take a testing.TB and fail the test on error; call them from the
// test's goroutine.
package harness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// ModulePath is the plugin's Go module.
	ModulePath = "github.com/caddy-fair-queue/caddy-fair-queue"
	// CaddyVersion is the Caddy release the plugin is built into; keep it in
	// step with go.mod.
	CaddyVersion = "v2.11.9"

	// keepBinaries is how many builds of each kind stay in the cache: enough
	// for a few branches side by side, without filling the disk.
	keepBinaries = 3
)

// goEnvAffectingBuild and xcaddyEnv are the settings that change the binary
// xcaddy or go build produce, so they are part of the cache key. The Go ones
// are read with "go env", which also sees values set with "go env -w".
var (
	goEnvAffectingBuild = []string{"GOVERSION", "GOOS", "GOARCH", "GOFLAGS", "CGO_ENABLED", "GOEXPERIMENT", "GOAMD64", "GOARM64"}
	xcaddyEnv           = []string{"XCADDY_RACE_DETECTOR", "XCADDY_DEBUG", "XCADDY_GO_BUILD_FLAGS", "XCADDY_GO_MOD_FLAGS"}
)

// RepoRoot returns the root of the caddy-fair-queue checkout the test runs
// in, found by walking up from the working directory to the go.mod that
// declares ModulePath.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if modulePathOf(filepath.Join(d, "go.mod")) == ModulePath {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("harness: no go.mod for module %s above %s", ModulePath, dir)
		}
	}
}

func modulePathOf(gomod string) string {
	b, _ := os.ReadFile(gomod)
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// BuildCaddy returns the path of a Caddy binary with the plugin from the
// local checkout, built with
//
//	xcaddy build v2.11.9 --with MODULE@v0.0.0=<repo root> --output <path>
//
// The @v0.0.0 pin matters: without a version xcaddy asks the module proxy for
// the module, which refuses unpublished modules, and the build fails at go
// get. The binary is cached (see CacheDir) under a hash of the plugin's
// sources, go.mod and go.sum, so only a change to the plugin rebuilds it (a
// cold build takes about two minutes on two cores). Concurrent test
// processes build once: the others wait on a file lock.
func BuildCaddy(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	xcaddy, err := findXcaddy()
	if err != nil {
		t.Fatal(err)
	}
	key, err := sourceKey(root, []string{"xcaddy-test"}, "caddy "+CaddyVersion+" "+ModulePath)
	if err != nil {
		t.Fatal(err)
	}
	return cachedBuild(t, "caddy", key, func(ctx context.Context, out string, log io.Writer) error {
		t.Logf("harness: building Caddy %s with %s from %s (a cold build takes minutes)", CaddyVersion, ModulePath, root)
		// Outside any module, so that nothing around the working directory
		// can steer xcaddy.
		return run(ctx, os.TempDir(), log, xcaddy, "build", CaddyVersion,
			"--with", ModulePath+"@v0.0.0="+root, "--output", out)
	})
}

// BuildFake returns the path of the fakellm binary (xcaddy-test/fakellm),
// cached like BuildCaddy.
func BuildFake(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	key, err := sourceKey(root, nil, "fakellm", "xcaddy-test/fakellm", "xcaddy-test/go.mod", "xcaddy-test/go.sum")
	if err != nil {
		t.Fatal(err)
	}
	return cachedBuild(t, "fakellm", key, func(ctx context.Context, out string, log io.Writer) error {
		// xcaddy-test is a module of its own.
		return run(ctx, filepath.Join(root, "xcaddy-test"), log, "go", "build", "-o", out, "./fakellm")
	})
}

// run runs a build command in dir, its output to log.
func run(ctx context.Context, dir string, log io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.WaitDelay = 10 * time.Second
	return cmd.Run()
}

// CacheDir is where built binaries are kept: $FAIRQUEUE_CADDY_CACHE, or
// caddy-fair-queue in the user's cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv("FAIRQUEUE_CADDY_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("harness: no cache directory (set FAIRQUEUE_CADDY_CACHE): %w", err)
	}
	return filepath.Join(d, "caddy-fair-queue"), nil
}

func findXcaddy() (string, error) {
	if p, err := exec.LookPath("xcaddy"); err == nil {
		return p, nil
	}
	var dirs []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		// One line per variable; GOBIN's is usually empty.
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(lines) == 2 {
			if gobin := strings.TrimSpace(lines[0]); gobin != "" {
				dirs = append(dirs, gobin)
			}
			for _, p := range filepath.SplitList(strings.TrimSpace(lines[1])) {
				dirs = append(dirs, filepath.Join(p, "bin"))
			}
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, "xcaddy")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("harness: xcaddy is needed to build Caddy with the plugin, and it is neither on PATH nor in %s; install it with\n\tgo install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5",
		strings.Join(dirs, ", "))
}

// sourceKey hashes what goes into a binary built from root: the files
// sourceFiles lists, the Go settings and environment that change a build,
// and salt.
func sourceKey(root string, skip []string, salt string, only ...string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "salt %s\n", salt)
	goenv, err := exec.Command("go", append([]string{"env"}, goEnvAffectingBuild...)...).Output()
	if err != nil {
		return "", fmt.Errorf("harness: go env: %w", err)
	}
	fmt.Fprintf(h, "go env\n%s\n", goenv)
	for _, k := range xcaddyEnv {
		fmt.Fprintf(h, "env %s=%s\n", k, os.Getenv(k))
	}

	files, err := sourceFiles(root, skip, only)
	if err != nil {
		return "", err
	}
	for _, rel := range files {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "file %s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:20], nil
}

// sourceFiles lists, relative to root and sorted: go.mod, go.sum, and below
// each of only (default: root) the non-test Go files and what they embed,
// leaving out skip, testdata, hidden directories and nested modules. A file
// named in only (a nested module's go.mod) is taken as it is.
func sourceFiles(root string, skip, only []string) ([]string, error) {
	set := map[string]bool{}
	for _, rel := range []string{"go.mod", "go.sum"} {
		if isFile(filepath.Join(root, rel)) {
			set[rel] = true
		}
	}
	if len(only) == 0 {
		only = []string{"."}
	}
	for _, top := range only {
		if isFile(filepath.Join(root, top)) {
			set[top] = true
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			if d.IsDir() {
				return sourceDir(path, rel, skip)
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			set[rel] = true
			embedded, err := embeddedFiles(path)
			for _, e := range embedded {
				if r, err := filepath.Rel(root, e); err == nil {
					set[r] = true
				}
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("harness: hashing sources: %w", err)
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// sourceDir returns filepath.SkipDir for a directory whose files are not
// part of the build: hidden, _-prefixed, testdata, listed in skip (relative
// to root), or a nested module; nil for the others.
func sourceDir(path, rel string, skip []string) error {
	name := filepath.Base(path)
	if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
		slices.Contains(skip, filepath.ToSlash(rel)) || isFile(filepath.Join(path, "go.mod"))) {
		return filepath.SkipDir
	}
	return nil
}

// embeddedFiles returns the files matched by the //go:embed directives of a
// Go file: they are part of the binary, so a change to them must rebuild it.
func embeddedFiles(goFile string) ([]string, error) {
	src, err := os.ReadFile(goFile)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(goFile)
	var out []string
	for line := range strings.Lines(string(src)) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "//go:embed")
		if !ok {
			continue
		}
		for _, pat := range strings.Fields(rest) {
			pat = strings.Trim(pat, "\"`")
			pat = strings.TrimPrefix(pat, "all:")
			matches, _ := filepath.Glob(filepath.Join(dir, filepath.FromSlash(pat)))
			for _, m := range matches {
				err := filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
					if err == nil && !d.IsDir() {
						out = append(out, p)
					}
					return err
				})
				if err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// cachedBuild returns CacheDir()/<kind>-<key>, running build into a
// temporary name and renaming it into place when it is missing. A file lock
// per binary makes concurrent test processes build it once; the rename makes
// a half-written binary impossible to see.
func cachedBuild(t testing.TB, kind, key string, build func(ctx context.Context, out string, log io.Writer) error) string {
	t.Helper()
	dir, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("harness: %v", err)
	}
	final := filepath.Join(dir, kind+"-"+key)
	if isFile(final) {
		touch(final)
		return final
	}

	lock, err := os.OpenFile(final+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	defer lock.Close()
	if err := flock(t.Context(), lock, func() {
		t.Logf("harness: waiting for another process building %s", final)
	}); err != nil {
		t.Fatalf("harness: locking %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if isFile(final) { // built by the process we waited for
		touch(final)
		return final
	}

	tmp, err := os.CreateTemp(dir, "."+kind+"-"+key+".tmp-*")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op once renamed
	var log bytes.Buffer
	if err := build(t.Context(), tmp.Name(), &log); err != nil {
		t.Logf("harness: build output:\n%s", log.String())
		t.Fatalf("harness: building %s failed: %v", kind, err)
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		t.Fatalf("harness: %v", err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		t.Fatalf("harness: %v", err)
	}
	prune(dir, kind)
	return final
}

// flock takes an exclusive lock on f, polling so that the test's context
// (cancelled at its deadline) can interrupt a wait on a stuck builder.
func flock(ctx context.Context, f *os.File, waiting func()) error {
	for first := true; ; first = false {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		if first {
			waiting()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// prune keeps the keepBinaries most recently used binaries of a kind, and
// drops temporary files that a killed build left behind. Lock files stay:
// removing a lock another process may hold would break the mutual exclusion.
func prune(dir, kind string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type bin struct {
		path string
		mod  time.Time
	}
	var bins []bin
	for _, e := range entries {
		name := e.Name()
		info, err := e.Info()
		if err != nil || e.IsDir() {
			continue
		}
		switch {
		case strings.HasPrefix(name, "."+kind+"-") && strings.Contains(name, ".tmp-"):
			if time.Since(info.ModTime()) > 6*time.Hour {
				os.Remove(filepath.Join(dir, name))
			}
		case strings.HasPrefix(name, kind+"-") && !strings.HasSuffix(name, ".lock"):
			bins = append(bins, bin{filepath.Join(dir, name), info.ModTime()})
		}
	}
	sort.Slice(bins, func(i, j int) bool { return bins[i].mod.After(bins[j].mod) })
	for i := keepBinaries; i < len(bins); i++ {
		os.Remove(bins[i].path)
	}
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// touch marks a cached binary as used, for prune's least-recently-used order.
func touch(p string) {
	now := time.Now()
	os.Chtimes(p, now, now)
}
