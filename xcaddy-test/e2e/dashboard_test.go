package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// chromiumPath finds Debian's chromium. The browser test is part of the
// suite: without a browser it fails, it does not skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatal("chromium not found (/usr/bin/chromium or on PATH): the dashboard browser test needs Debian's " +
		"chromium package; install it with `apt-get install -y chromium` (scripts/test.sh does this)")
	return ""
}

// dashState is the part of the dashboard's api/state the test compares
// with the page.
type dashState struct {
	Window      string            `json:"window"`
	Series      []json.RawMessage `json:"series"` // per second up to 5m
	Jain        float64           `json:"jain"`
	JainTenants int               `json:"jain_tenants"`
	Gateway     struct {
		Capacity int     `json:"capacity"`
		Healthy  int     `json:"healthy_upstreams"`
		Queued   int     `json:"queued"`
		Inflight int     `json:"inflight"`
		Water    float64 `json:"water"`
		Ladder   []struct {
			Name string `json:"name"`
		} `json:"ladder"`
		CostModel struct {
			Ready                  bool    `json:"ready"`
			CompletionTokenSeconds float64 `json:"completion_token_seconds"`
		} `json:"cost_model"`
	} `json:"gateway"`
	Tenants []struct {
		Name          string           `json:"name"`
		Requests      float64          `json:"requests"`
		Served        float64          `json:"served"`
		SuccessRate   float64          `json:"success_rate"`
		Share         float64          `json:"share"`
		FairShare     float64          `json:"fair_share"`
		Boosts        float64          `json:"boosts"`
		Outcomes      map[string]int64 `json:"outcomes"`
		WaitHistogram []int64          `json:"wait_histogram"`
		Wait          struct {
			Count float64 `json:"count"`
			P50   float64 `json:"p50"`
			P95   float64 `json:"p95"`
			P99   float64 `json:"p99"`
		} `json:"wait"`
	} `json:"tenants"`
	Transitions []json.RawMessage `json:"transitions"`
}

func fetchState(t *testing.T, url string) (dashState, []byte) {
	t.Helper()
	resp, err := defaultClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	var st dashState
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
	return st, body
}

// pageCell is one number on the page: its text and the raw value it shows.
type pageCell struct {
	Text  string `json:"text"`
	Value string `json:"value"`
}

// pageView is what the test reads off the rendered page.
type pageView struct {
	Status  string                         `json:"status"`
	Window  string                         `json:"window"`
	Tiles   map[string]pageCell            `json:"tiles"`
	Tenants map[string]map[string]pageCell `json:"tenants"`
	// Outcomes: tenant -> outcome code -> count drawn.
	Outcomes map[string]map[string]float64 `json:"outcomes"`
	// HistSums: tenant -> sum of the histogram bars' counts.
	HistSums     map[string]float64 `json:"hist_sums"`
	WaterPath    int                `json:"water_path"`
	TriggerLines int                `json:"trigger_lines"`
	RecoverLines int                `json:"recover_lines"`
	CapPaths     int                `json:"cap_paths"`
	ShareBars    int                `json:"share_bars"`
	FairBars     int                `json:"fair_bars"`
	TimelineMark int                `json:"timeline_marks"`
	Transitions  int                `json:"transition_rows"`
	QuotaRows    int                `json:"quota_rows"`
}

const readPage = `(() => {
  const cells = (root) => {
    const out = {};
    for (const c of root.querySelectorAll("[data-field]")) out[c.dataset.field] = {text: c.textContent, value: c.dataset.value || ""};
    return out;
  };
  const tiles = {};
  for (const id of ["gw-capacity", "gw-healthy", "gw-queued", "gw-inflight", "gw-water", "jain", "gw-costmodel"]) {
    const e = document.getElementById(id);
    tiles[id] = {text: e.textContent, value: e.dataset.value || ""};
  }
  const tenants = {};
  for (const tr of document.querySelectorAll("#tenants tbody tr[data-tenant]")) tenants[tr.dataset.tenant] = cells(tr);
  const outcomes = {};
  for (const r of document.querySelectorAll("#chart-outcomes rect.outcome")) {
    (outcomes[r.dataset.tenant] = outcomes[r.dataset.tenant] || {})[r.dataset.outcome] = Number(r.dataset.value);
  }
  const hist = {};
  for (const f of document.querySelectorAll("#wait-histograms figure[data-tenant]")) {
    let s = 0;
    for (const b of f.querySelectorAll("rect.hist-bar")) s += Number(b.dataset.value);
    hist[f.dataset.tenant] = s;
  }
  const water = document.querySelector("#chart-water path.series.water");
  return {
    status: document.getElementById("status").dataset.state,
    window: document.body.dataset.window || "",
    tiles, tenants, outcomes, hist_sums: hist,
    water_path: water ? water.getAttribute("d").split(/[ML]/).filter(Boolean).length : 0,
    trigger_lines: document.querySelectorAll("#chart-water line.line-trigger").length,
    recover_lines: document.querySelectorAll("#chart-water line.line-recover").length,
    cap_paths: document.querySelectorAll("#chart-capacity path.series").length,
    share_bars: document.querySelectorAll("#chart-shares rect.bar.share").length,
    fair_bars: document.querySelectorAll("#chart-shares rect.bar.fair").length,
    timeline_marks: document.querySelectorAll("#chart-timeline .mark").length,
    transition_rows: document.querySelectorAll("#transitions tbody tr[data-kind]").length,
    quota_rows: document.querySelectorAll("#quota tbody tr[data-tenant]").length,
  };
})()`

// TestDashboardInBrowser loads the dashboard of the xcaddy-built binary in
// headless Chromium after real load (three tenants, refusals by tenant
// queue cap and by quota, the ladder engaged and released): the page runs
// without console errors or exceptions, its charts are drawn, and the
// numbers it shows are the ones its JSON endpoint gives. A screenshot is
// written to $FQ_ARTIFACTS (or the test's temporary directory).
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	fakes := startFakes(t, 2, "dash", harness.FakeOptions{Slots: 2, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	handle_path /fair-queue/* {
		fair_queue_dashboard {
			refresh 500ms
		}
	}
	handle {
		fair_queue {
			name dash
			max_inflight 2
			max_queue 10
			tenant alpha weight 3 class interactive
			tenant beta  weight 1 class interactive max_queue 1
			tenant gamma weight 1 class realtime {
				quota tokens_per_min 120 burst_allow 0
			}
			default_tenant weight 1 class batch
			degrade {
				hold 500ms
				L1 trigger 0.3 recover 0.1 light_mode batch max_tokens 8
			}
			reverse_proxy {{.Upstreams}}
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	stateURL := base + "/fair-queue/api/state?queue=dash&window=1h"

	// Load: two closed-loop tenants above capacity (beta's one-request
	// queue refuses some), a quota tenant refused by its token rate, and
	// undeclared tenants under _unknown.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, refused atomic.Int64
	drive := func(tenant string, workers, maxTokens int, pause time.Duration) {
		for w := range workers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					r := send(ctx, defaultClient, base, chatReq{Tenant: tenant, TestID: fmt.Sprintf("dash-%s-%d-%d", tenant, w, i),
						MaxTokens: maxTokens, IgnoreEOS: true})
					if ctx.Err() != nil {
						return
					}
					sent.Add(1)
					if r.Status != http.StatusOK {
						refused.Add(1)
						if r.Status != http.StatusTooManyRequests && r.Status != http.StatusServiceUnavailable {
							t.Errorf("unexpected answer: %v", r)
						}
					}
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			})
		}
	}
	drive("alpha", 5, 24, 0)
	drive("beta", 3, 24, 20*time.Millisecond)
	drive("gamma", 1, 24, 300*time.Millisecond)
	drive("stranger-1", 1, 8, 100*time.Millisecond)
	drive("stranger-2", 1, 8, 100*time.Millisecond)
	waitFor(t, "the ladder to engage and refusals of beta and gamma", func() (bool, string) {
		st, _ := fetchState(t, stateURL)
		byCode := map[string]int64{}
		for _, tn := range st.Tenants {
			for code, n := range tn.Outcomes {
				byCode[tn.Name+"/"+code] += n
			}
		}
		ok := len(st.Transitions) > 0 && byCode["gamma/quota_exceeded"] > 0 && byCode["beta/tenant_queue_full"] > 0 &&
			byCode["_unknown/served"] > 0
		return ok, fmt.Sprintf("%d transitions, outcomes %v", len(st.Transitions), byCode)
	})
	// Load until the gateway's own 5-minute series holds eight seconds of
	// it, so the charts have a history to draw.
	waitFor(t, "eight seconds of the load in the dashboard's 5m series", func() (bool, string) {
		st, _ := fetchState(t, base+"/fair-queue/api/state?queue=dash&window=5m")
		return len(st.Series) >= 8, fmt.Sprintf("%d points", len(st.Series))
	})
	stop()
	wg.Wait()
	t.Logf("load: %d answers, %d refused", sent.Load(), refused.Load())
	// Quiet: nothing queued or in flight, the ladder released, so the 1h
	// numbers stand still while the page and the test read them.
	waitFor(t, "the gateway to drain and the ladder to release", func() (bool, string) {
		st, _ := fetchState(t, stateURL)
		return st.Gateway.Queued == 0 && st.Gateway.Inflight == 0 && len(st.Transitions) >= 2 && st.Gateway.Water == 0,
			fmt.Sprintf("queued %d inflight %d transitions %d", st.Gateway.Queued, st.Gateway.Inflight, len(st.Transitions))
	})

	// The browser.
	var mu sync.Mutex
	var problems []string
	listener := func(ev any) {
		var msg string
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				msg = fmt.Sprintf("console.%s: %s", e.Type, strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			msg = "exception: " + e.ExceptionDetails.Text
			if ex := e.ExceptionDetails.Exception; ex != nil {
				msg += " " + ex.Description
			}
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				msg = fmt.Sprintf("log error: %s %s", e.Entry.Text, e.Entry.URL)
			}
		}
		if msg != "" {
			mu.Lock()
			problems = append(problems, msg)
			mu.Unlock()
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.Headless,
		chromedp.NoSandbox, chromedp.WindowSize(1400, 1000), chromedp.Flag("disable-gpu", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithListener(listener))
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, harness.Scale(2*time.Minute))
	defer cancelTimeout()

	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/fair-queue/"),
		chromedp.WaitVisible("#tenants tbody tr[data-tenant]"),
		chromedp.Click("#win-1h"),
	); err != nil {
		t.Fatalf("loading the dashboard: %v", err)
	}
	// Two polls of the 1h window after the click: the page shows the
	// settled state.
	polls, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.dataset.polls`))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(polls)
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](fmt.Sprintf(
		`document.body.dataset.window === "1h" && Number(document.body.dataset.polls) >= %d`, n+2),
		chromedp.WithPollingTimeout(pollTimeout))); err != nil {
		t.Fatalf("waiting for the page to poll the 1h window: %v", err)
	}
	view, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](readPage))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	st, raw := fetchState(t, stateURL)

	// The numbers shown are the endpoint's.
	if view.Status != "ok" || view.Window != "1h" {
		t.Errorf("page status %q window %q, want ok and 1h", view.Status, view.Window)
	}
	expectShown(t, "capacity", view.Tiles["gw-capacity"], float64(st.Gateway.Capacity), 1, 0)
	expectShown(t, "healthy upstreams", view.Tiles["gw-healthy"], float64(st.Gateway.Healthy), 1, 0)
	expectShown(t, "Jain's index", view.Tiles["jain"], st.Jain, 1, 0.0005)
	// The learned cost model (the page shows it in ms, with the others).
	if v, err := strconv.ParseFloat(view.Tiles["gw-costmodel"].Value, 64); err != nil || v != st.Gateway.CostModel.CompletionTokenSeconds {
		t.Errorf("cost model: page holds %q, endpoint %v", view.Tiles["gw-costmodel"].Value, st.Gateway.CostModel.CompletionTokenSeconds)
	}
	if st.Gateway.CostModel.Ready && !strings.Contains(view.Tiles["gw-costmodel"].Text,
		strconv.FormatFloat(1000*st.Gateway.CostModel.CompletionTokenSeconds, 'f', 2, 64)) {
		t.Errorf("cost model: page shows %q, endpoint %v s per output token", view.Tiles["gw-costmodel"].Text, st.Gateway.CostModel.CompletionTokenSeconds)
	}
	if st.Gateway.Capacity != 4 || st.Gateway.Healthy != 2 {
		t.Errorf("endpoint: capacity %d healthy %d, want 4 (2 x 2) and 2", st.Gateway.Capacity, st.Gateway.Healthy)
	}
	if len(view.Tenants) != len(st.Tenants) || len(st.Tenants) != 4 {
		t.Errorf("page shows %d tenants, endpoint %d, want alpha, beta, gamma and _unknown", len(view.Tenants), len(st.Tenants))
	}
	for _, tn := range st.Tenants {
		row := view.Tenants[tn.Name]
		if row == nil {
			t.Errorf("tenant %s not on the page", tn.Name)
			continue
		}
		what := func(f string) string { return tn.Name + " " + f }
		expectShown(t, what("requests"), row["requests"], tn.Requests, 1, 0)
		expectShown(t, what("served"), row["served"], tn.Served, 1, 0)
		expectShown(t, what("boosts"), row["boosts"], tn.Boosts, 1, 0)
		if tn.Requests > 0 {
			expectShown(t, what("success rate"), row["success_rate"], tn.SuccessRate, 100, 0.05)
		}
		expectShown(t, what("wait p50"), row["wait.p50"], tn.Wait.P50, 1000, 0.05)
		expectShown(t, what("wait p95"), row["wait.p95"], tn.Wait.P95, 1000, 0.05)
		expectShown(t, what("wait p99"), row["wait.p99"], tn.Wait.P99, 1000, 0.05)
		expectShown(t, what("share"), row["share"], tn.Share, 100, 0.05)
		expectShown(t, what("fair share"), row["fair_share"], tn.FairShare, 100, 0.05)
		for code, n := range tn.Outcomes {
			if got := view.Outcomes[tn.Name][code]; got != float64(n) {
				t.Errorf("%s outcome %s: chart shows %v, endpoint %d", tn.Name, code, got, n)
			}
		}
		if got := view.HistSums[tn.Name]; got != tn.Wait.Count {
			t.Errorf("%s wait histogram: bars hold %v, endpoint counts %v served waits", tn.Name, got, tn.Wait.Count)
		}
	}
	// Charts drawn from the data.
	if view.TriggerLines != len(st.Gateway.Ladder) || view.RecoverLines != len(st.Gateway.Ladder) ||
		view.CapPaths != 2 || view.ShareBars != len(st.Tenants) || view.FairBars != len(st.Tenants) ||
		view.TimelineMark != len(st.Transitions) || view.Transitions != len(st.Transitions) || view.QuotaRows != len(st.Tenants) {
		t.Errorf("charts: %+v; endpoint: %d ladder steps, %d tenants, %d transitions", view,
			len(st.Gateway.Ladder), len(st.Tenants), len(st.Transitions))
	}

	// Back to 5 minutes: the gateway's series is per second there, so the
	// water line has as many points as seconds were sampled.
	if err := chromedp.Do(bctx, chromedp.Click("#win-5m")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](
		`document.body.dataset.window === "5m" && document.querySelector("#chart-water path.series.water") !== null`,
		chromedp.WithPollingTimeout(pollTimeout))); err != nil {
		t.Fatalf("waiting for the page to poll the 5m window: %v", err)
	}
	view5, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](readPage))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	if view5.WaterPath < 5 || view5.CapPaths != 2 {
		t.Errorf("5m charts: water line of %d points, %d capacity lines; want a point per second of load and 2 lines",
			view5.WaterPath, view5.CapPaths)
	}

	// The screenshot, at the 5m window.
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("FQ_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("browser: %s", p)
	}
	if t.Failed() {
		t.Logf("endpoint: %s", raw)
	}
}

// expectShown checks a number on the page: its raw value is the endpoint's,
// and its text shows that value times scale to within tol (the display's
// rounding).
func expectShown(t *testing.T, what string, c pageCell, want, scale, tol float64) {
	t.Helper()
	v, err := strconv.ParseFloat(c.Value, 64)
	if err != nil || v != want {
		t.Errorf("%s: page holds %q, endpoint %v", what, c.Value, want)
		return
	}
	text := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(c.Text), "%"))
	shown, err := strconv.ParseFloat(text, 64)
	if err != nil || math.Abs(shown-want*scale) > tol+1e-9 {
		t.Errorf("%s: page shows %q, endpoint %v (x%v)", what, c.Text, want, scale)
	}
}
