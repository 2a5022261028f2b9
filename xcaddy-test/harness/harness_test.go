package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// chat sends a small chat completion to a fake and returns the response.
func chat(t *testing.T, url, tenant, testID string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"one two"}],"max_tokens":3,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tenant-ID", tenant)
	req.Header.Set("X-Test-Id", testID)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestTwoFakes(t *testing.T) {
	bin := BuildFake(t)
	a := StartFake(t, FakeOptions{Bin: bin, Name: "alpha", Slots: 1, Args: []string{"-ttft=0", "-per-token=0"}})
	b := StartFake(t, FakeOptions{Bin: bin, Down: true})
	if a.Port() == b.Port() || a.Name() == b.Name() || !strings.HasPrefix(b.Name(), "fake") {
		t.Fatalf("fakes share a port or a name: %s=%s %s=%s", a.Name(), a.Addr(), b.Name(), b.Addr())
	}

	for _, f := range []*Fake{a, b} {
		code, hdr, body := chat(t, f.URL(), "acme", "two-fakes")
		if code != 200 || hdr.Get("X-Fake-Upstream") != f.Name() {
			t.Errorf("%s: %d %q %s", f.Name(), code, hdr.Get("X-Fake-Upstream"), body)
		}
		var resp struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil || resp.Usage.CompletionTokens != 3 {
			t.Errorf("%s: body %s: %v", f.Name(), body, err)
		}
		reqs := f.Requests()
		if len(reqs) != 1 || reqs[0].Tenant != "acme" || reqs[0].TestID != "two-fakes" ||
			reqs[0].Outcome != "ok" || reqs[0].OutputTokens != 3 || reqs[0].PromptTokens != 2 ||
			!strings.Contains(reqs[0].Body, `"one two"`) {
			t.Errorf("%s: requests %+v", f.Name(), reqs)
		}
		if st := f.Stats(); st.Received != 1 || st.Completed != 1 {
			t.Errorf("%s: stats %+v", f.Name(), st)
		}
		m := Metrics(t, f.URL()+"/metrics")
		if got := m.Sum("fake_llm_completed_total"); got != 1 {
			t.Errorf("%s: fake_llm_completed_total %v; have %v", f.Name(), got, m.Names())
		}
		if got := m[Key("fake_llm_requests_total", "path", "/v1/chat/completions")]; got != 1 {
			t.Errorf("%s: requests_total %v", f.Name(), got)
		}
	}

	// Health switching, as a gateway's active health check sees it.
	health := func(f *Fake) int {
		code, _, err := httpStatus("GET", f.URL()+"/health", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if health(a) != 200 || health(b) != 503 || b.Stats().Healthy {
		t.Errorf("initial health: %d %d", health(a), health(b))
	}
	b.SetHealth(true)
	a.SetHealth(false)
	if health(a) != 503 || health(b) != 200 {
		t.Errorf("switched health: %d %d", health(a), health(b))
	}
	a.SetHealth(true)

	// Pause fills the single slot and queues the next request behind it.
	a.Reset()
	a.Pause()
	var wg sync.WaitGroup
	results := make(chan int, 2)
	for i := range 2 {
		wg.Go(func() {
			// Not chat(): t.Fatal must stay on the test goroutine.
			req, _ := http.NewRequest("POST", a.URL()+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":1}`))
			req.Header.Set("X-Test-Id", fmt.Sprint("q", i))
			resp, err := client.Do(req)
			if err != nil {
				results <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results <- resp.StatusCode
		})
		WaitFor(t, fmt.Sprint("request ", i), func() (bool, string) {
			st := a.Stats()
			return st.Received == uint64(i+1) && st.Running == 1 && st.Waiting == i, fmt.Sprintf("%+v", st)
		})
	}
	a.Resume()
	wg.Wait()
	close(results)
	for code := range results {
		if code != 200 {
			t.Errorf("paused request: %d", code)
		}
	}
	reqs := a.Requests()
	if len(reqs) != 2 || reqs[0].TestID != "q0" || reqs[0].StartSeq >= reqs[1].StartSeq {
		t.Errorf("queued requests did not start in order: %+v", reqs)
	}

	// A killed fake stops answering; a restarted one comes back on the same
	// port with fresh state.
	port := a.Port()
	a.Kill()
	if _, _, err := httpStatus("GET", a.URL()+"/health", "", nil); err == nil {
		t.Error("a killed fake still answers")
	}
	a.Restart()
	if a.Port() != port || health(a) != 200 {
		t.Errorf("restart: port %d (was %d), health %d", a.Port(), port, health(a))
	}
	if st := a.Stats(); st.Received != 0 {
		t.Errorf("restarted fake kept state: %+v", st)
	}
	if code, hdr, _ := chat(t, a.URL(), "acme", "after-restart"); code != 200 || hdr.Get("X-Fake-Upstream") != "alpha" {
		t.Errorf("after restart: %d %q", code, hdr.Get("X-Fake-Upstream"))
	}
	if !strings.Contains(a.Logs(), "restart") {
		t.Errorf("logs do not show the restart:\n%s", a.Logs())
	}
}

func TestPortsAndRender(t *testing.T) {
	p := Ports(t, "Admin", "Site", "Other")
	seen := map[int]bool{}
	for _, port := range p {
		if port <= 0 || seen[port] {
			t.Fatalf("ports %v", p)
		}
		seen[port] = true
	}
	got := Render(t, `{ admin 127.0.0.1:{{.Admin}} }
http://127.0.0.1:{{.Site}} {
	respond "{http.request.header.X-Tenant-ID}"
}`, p)
	want := fmt.Sprintf(`{ admin 127.0.0.1:%d }
http://127.0.0.1:%d {
	respond "{http.request.header.X-Tenant-ID}"
}`, p["Admin"], p["Site"])
	if got != want {
		t.Errorf("Render:\n%s\nwant:\n%s", got, want)
	}
}

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSourceKey(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"go.mod":                "module example.com/m\n",
		"go.sum":                "",
		"a.go":                  "package m\n",
		"a_test.go":             "package m\n",
		"README.md":             "docs\n",
		"sub/b.go":              "package sub\n\nimport _ \"embed\"\n\n//go:embed data.txt\nvar data string\n",
		"sub/data.txt":          "embedded\n",
		"sub/testdata/t.go":     "package t\n",
		"xcaddy-test/x/x.go":    "package x\n",
		".hidden/h.go":          "package h\n",
		"nested/go.mod":         "module example.com/nested\n",
		"nested/n.go":           "package nested\n",
		"fakellm/main.go":       "package main\n",
		"fakellm/main_test.go":  "package main\n",
		"fakellm/more/extra.go": "package more\n",
	})
	files, err := sourceFiles(root, []string{"xcaddy-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.go", "fakellm/main.go", "fakellm/more/extra.go", "go.mod", "go.sum", "sub/b.go", "sub/data.txt"}
	if !slices.Equal(files, want) {
		t.Errorf("hashed files %q, want %q", files, want)
	}
	files, err = sourceFiles(root, nil, []string{"fakellm"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"fakellm/main.go", "fakellm/more/extra.go", "go.mod", "go.sum"}; !slices.Equal(files, want) {
		t.Errorf("hashed files of fakellm %q, want %q", files, want)
	}

	keyOf := func() string {
		t.Helper()
		k, err := sourceKey(root, []string{"xcaddy-test"}, "salt")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	base := keyOf()
	if keyOf() != base {
		t.Fatal("the key is not deterministic")
	}
	for _, edit := range []struct {
		file    string
		changes bool
	}{
		{"a_test.go", false},
		{"README.md", false},
		{"xcaddy-test/x/x.go", false},
		{"nested/n.go", false},
		{"a.go", true},
		{"sub/data.txt", true},
		{"go.sum", true},
	} {
		writeFiles(t, root, map[string]string{edit.file: "// edited\n"})
		k := keyOf()
		if (k != base) != edit.changes {
			t.Errorf("editing %s: key changed %t, want %t", edit.file, k != base, edit.changes)
		}
		base = k
	}
	for _, env := range [][2]string{{"XCADDY_RACE_DETECTOR", "1"}, {"GOFLAGS", "-trimpath"}} {
		t.Setenv(env[0], env[1])
		k := keyOf()
		if k == base {
			t.Errorf("the key ignores %s", env[0])
		}
		base = k
	}
}

func TestCachedBuildBuildsOnce(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("FAIRQUEUE_CADDY_CACHE", dir)
	var builds atomic.Int32
	building, release := make(chan struct{}), make(chan struct{})
	build := func(ctx context.Context, out string, log io.Writer) error {
		if builds.Add(1) == 1 {
			close(building)
			<-release
		}
		return os.WriteFile(out, []byte("#!/bin/sh\n"), 0o644)
	}

	// Several callers at once, like parallel test processes (flock locks
	// belong to each open file, so goroutines exclude each other the same
	// way): whatever the interleaving, one build happens and all get it.
	var wg sync.WaitGroup
	paths := make([]string, 4)
	wg.Go(func() { paths[0] = cachedBuild(t, "thing", "k1", build) })
	<-building
	for i := 1; i < len(paths); i++ {
		wg.Go(func() { paths[i] = cachedBuild(t, "thing", "k1", build) })
	}
	close(release)
	wg.Wait()
	if builds.Load() != 1 {
		t.Errorf("%d builds, want 1", builds.Load())
	}
	want := filepath.Join(dir, "thing-k1")
	for _, p := range paths {
		if p != want {
			t.Errorf("path %q, want %q", p, want)
		}
	}
	if fi, err := os.Stat(want); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("binary %v %v: want an executable", fi, err)
	}

	// Only the most recently used keepBinaries builds stay.
	for i := range keepBinaries + 2 {
		cachedBuild(t, "thing", fmt.Sprint("n", i), build)
		old := time.Now().Add(time.Duration(i-10) * time.Hour)
		os.Chtimes(filepath.Join(dir, fmt.Sprint("thing-n", i)), old, old)
	}
	cachedBuild(t, "thing", "k1", build) // touched: most recent
	cachedBuild(t, "thing", "fresh", build)
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			left = append(left, e.Name())
		}
	}
	if want := []string{"thing-fresh", "thing-k1", fmt.Sprint("thing-n", keepBinaries+1)}; !slices.Equal(left, want) {
		t.Errorf("cache holds %q, want %q", left, want)
	}
}

func TestSeries(t *testing.T) {
	const text = `# TYPE caddy_fair_queue_admitted_total counter
caddy_fair_queue_admitted_total{tenant="a",class="realtime"} 3
caddy_fair_queue_admitted_total{tenant="b",class="batch"} 4
caddy_fair_queue_admitted_total{tenant="odd \"q\" \\ x",class="batch"} 1
# TYPE caddy_fair_queue_queued gauge
caddy_fair_queue_queued 7
# TYPE caddy_fair_queue_wait_seconds histogram
caddy_fair_queue_wait_seconds_bucket{tenant="a",le="0.5"} 1
caddy_fair_queue_wait_seconds_bucket{tenant="a",le="1"} 2
caddy_fair_queue_wait_seconds_bucket{tenant="a",le="+Inf"} 3
caddy_fair_queue_wait_seconds_sum{tenant="a"} 2.5
caddy_fair_queue_wait_seconds_count{tenant="a"} 3
# TYPE rpc summary
rpc{quantile="0.5"} 0.25
rpc_sum 10
rpc_count 40
`
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	s := seriesOf(fams)
	for k, want := range map[string]float64{
		`caddy_fair_queue_admitted_total{class="realtime",tenant="a"}`:                    3,
		Key("caddy_fair_queue_admitted_total", "tenant", "b", "class", "batch"):           4,
		Key("caddy_fair_queue_admitted_total", "tenant", `odd "q" \ x`, "class", "batch"): 1,
		"caddy_fair_queue_queued":                                    7,
		`caddy_fair_queue_wait_seconds_bucket{le="0.5",tenant="a"}`:  1,
		`caddy_fair_queue_wait_seconds_bucket{le="+Inf",tenant="a"}`: 3,
		`caddy_fair_queue_wait_seconds_sum{tenant="a"}`:              2.5,
		`caddy_fair_queue_wait_seconds_count{tenant="a"}`:            3,
		`rpc{quantile="0.5"}`:                                        0.25,
		"rpc_count":                                                  40,
	} {
		if got, ok := s[k]; !ok || got != want {
			t.Errorf("%s = %v (present %t), want %v", k, got, ok, want)
		}
	}
	for _, tc := range []struct {
		pairs []string
		want  float64
	}{
		{nil, 8},
		{[]string{"class", "batch"}, 5},
		{[]string{"class", "batch", "tenant", "b"}, 4},
		{[]string{"tenant", `odd "q" \ x`}, 1},
		{[]string{"tenant", "nobody"}, 0},
	} {
		if got := s.Sum("caddy_fair_queue_admitted_total", tc.pairs...); got != tc.want {
			t.Errorf("Sum(%q) = %v, want %v", tc.pairs, got, tc.want)
		}
	}
	if got := s.Sum("caddy_fair_queue_wait_seconds_count"); got != 3 {
		t.Errorf("Sum(count) = %v", got)
	}
	if want := []string{"caddy_fair_queue_admitted_total", "caddy_fair_queue_queued",
		"caddy_fair_queue_wait_seconds_bucket", "caddy_fair_queue_wait_seconds_count",
		"caddy_fair_queue_wait_seconds_sum", "rpc", "rpc_count", "rpc_sum"}; !slices.Equal(s.Names(), want) {
		t.Errorf("Names() = %q", s.Names())
	}
}

func TestAddresses(t *testing.T) {
	admin, listeners, err := addresses([]byte(`{
		"admin": {"listen": "localhost:3001"},
		"apps": {"http": {"servers": {
			"srv0": {"listen": [":8080", "tcp/0.0.0.0:9000-9002", "unix//tmp/x.sock"]},
			"srv1": {"listen": ["127.0.0.1:8081", "[::1]:8082"]}
		}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(listeners)
	want := []string{"127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:9000", "[::1]:8082"}
	if admin != "localhost:3001" || !slices.Equal(listeners, want) {
		t.Errorf("admin %q listeners %q, want localhost:3001 %q", admin, listeners, want)
	}
	for _, cfg := range []string{
		`{"apps": {}}`,
		`{"admin": {"disabled": true}}`,
	} {
		if _, _, err := addresses([]byte(cfg)); err == nil || !strings.Contains(err.Error(), "admin") {
			t.Errorf("%s: error %v, want one about the admin address", cfg, err)
		}
	}
}

// FreePort hands out distinct ports a listener can bind, below the
// kernel's ephemeral range where it is known.
func TestFreePort(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if low := ephemeralLow(); low > minPort+1000 && (p < minPort || p >= low) {
			t.Errorf("port %d outside [%d, %d), below the ephemeral range", p, minPort, low)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		ln.Close()
	}
}
