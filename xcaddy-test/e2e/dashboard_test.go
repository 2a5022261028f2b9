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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/fetch"
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

// The dashboard's operator and password, behind basic_auth as docs/dashboard.md
// mounts it.
const (
	dashUser     = "ops"
	dashPassword = "s3cret-Pa55"
	// longTenant is longer than any chart has room for.
	longTenant = "customer-support-assistant-production-eu-west-1"
)

// dashTmpl is one of two gateways sharing a Redis (cluster): quotas of
// every kind, the undeclared tenants' per caller, a long tenant name,
// the dashboard behind basic_auth.
const dashTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	handle_path /fair-queue/* {
		basic_auth {
			{{.User}} {{.Hash}}
		}
		fair_queue_dashboard {
			refresh 500ms
		}
	}
	handle {
		fair_queue {
			name dash
			max_inflight 2
			max_queue 10
			cluster {
				redis     {{.Redis}}
				instances 2
				timeout   250ms
			}
			tenant alpha weight 3 class interactive
			tenant beta  weight 1 class interactive max_queue 1
			tenant gamma weight 1 class realtime {
				quota tokens_per_min 120 burst_allow 0
			}
			tenant {{.Long}} weight 1 class interactive {
				quota qps 3 token_to_qps_weight auto
			}
			default_tenant weight 1 class batch {
				quota qps 20
			}
			degrade {
				hold 500ms
				L1 trigger 0.3 recover 0.1 light_mode batch max_tokens 8
			}
			reverse_proxy {{.Upstreams}}
		}
	}
}
`

// dashState is the part of the dashboard's api/state the test compares
// with the page.
type dashState struct {
	Window      string  `json:"window"`
	WindowSecs  float64 `json:"window_seconds"`
	SpanSecs    float64 `json:"span_seconds"`
	Jain        float64 `json:"jain"`
	JainTenants int     `json:"jain_tenants"`
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
			OverheadSeconds        float64 `json:"overhead_seconds"`
			PromptTokenSeconds     float64 `json:"prompt_token_seconds"`
			CompletionTokenSeconds float64 `json:"completion_token_seconds"`
			R2                     float64 `json:"r2"`
		} `json:"cost_model"`
		LearnedWeightTenants []string `json:"learned_weight_tenants"`
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
		ETA struct {
			Count     int64   `json:"count"`
			MeanRatio float64 `json:"mean_ratio"`
		} `json:"eta"`
		Quota struct {
			QPSLimit          float64 `json:"qps_limit"`
			TokensPerMinLimit float64 `json:"tokens_per_min_limit"`
			JointLimit        float64 `json:"joint_limit"`
			PerCaller         bool    `json:"per_caller"`
			Hits              map[string]struct {
				Delayed int64 `json:"delayed"`
				Refused int64 `json:"refused"`
			} `json:"hits"`
		} `json:"quota"`
	} `json:"tenants"`
	Transitions []json.RawMessage `json:"transitions"`
}

// getAuth GETs url with the dashboard's credentials (none when user is "").
func getAuth(t *testing.T, url, user, password string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := defaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func fetchState(t *testing.T, url string) (dashState, []byte) {
	t.Helper()
	resp, body := getAuth(t, url, dashUser, dashPassword)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	var st dashState
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
	return st, body
}

// hashPassword hashes a basic_auth password with the built Caddy.
func hashPassword(t *testing.T, password string) string {
	t.Helper()
	cbin, _ := bins(t)
	out, err := exec.Command(cbin, "hash-password", "--plaintext", password).Output()
	if err != nil {
		t.Fatalf("caddy hash-password: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestDashboardInBrowser loads the dashboard of the xcaddy-built binary in
// headless Chromium, behind basic_auth, after real load on two gateways
// sharing a Redis (five tenants, refusals by tenant queue cap and by each
// kind of quota, the ladder engaged and released). It opens the page both
// ways an operator does — answering the browser's credentials prompt, and
// with the credentials in the URL, each in a locale of its own — and checks
// that the page runs without console errors, that its numbers are the ones
// its JSON endpoint gives, and that it reads right: fair shares WFQ owed,
// every quota meter with its limit, the ETA columns explained, the cost
// model in words, one time format (the locale's), a title naming the
// queue, a window label that says what the history covers, long tenant
// names cut with an ellipsis and whole on hover, and quantile labels that
// do not overlap. Screenshots are written to $FQ_ARTIFACTS (or the test's
// temporary directory); docs/dashboard.png is the prompt one.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	rs := harness.StartRedis(t)
	hash := hashPassword(t, dashPassword)
	fakes := startFakes(t, 2, "dash", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: 2 * time.Millisecond})
	var gws []*harness.Caddy
	var bases []string
	for range 2 {
		p := harness.Ports(t, "Admin", "Site")
		gws = append(gws, startCaddy(t, dashTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
			"Upstreams": addrs(fakes...), "User": dashUser, "Hash": hash, "Long": longTenant, "Redis": rs.URL()}))
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]))
	}
	for _, c := range gws {
		waitMetric(t, c, "the gateway to reach Redis", func(s harness.Series) bool {
			return s.Sum("caddy_fair_queue_cluster_redis_up", "queue", "dash") == 1
		})
	}
	base := bases[0]
	stateURL := base + "/fair-queue/api/state?queue=dash&window=1h"

	// Load, each worker alternating between the gateways: two closed-loop
	// tenants above capacity (beta's one-request queue refuses some), a
	// token quota refusing gamma, a request quota (and its joint meter)
	// holding the long-named tenant, and undeclared tenants under _unknown.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, refused atomic.Int64
	// Prompts and outputs of several lengths, which the cost model needs
	// to tell time per prompt token from time per request.
	drive := func(tenant string, workers, maxTokens int, pause time.Duration) {
		for w := range workers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					r := send(ctx, defaultClient, bases[(w+i)%len(bases)], chatReq{Tenant: tenant,
						TestID: fmt.Sprintf("dash-%s-%d-%d", tenant, w, i), Prompt: strings.Repeat("word ", 1+6*(i%5)),
						MaxTokens: maxTokens + 4*(i%3), IgnoreEOS: true})
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
	drive("alpha", 8, 24, 0)
	drive("beta", 4, 24, 20*time.Millisecond)
	drive("gamma", 1, 24, 300*time.Millisecond)
	drive(longTenant, 2, 16, 50*time.Millisecond)
	drive("stranger-1", 1, 8, 100*time.Millisecond)
	drive("stranger-2", 1, 8, 100*time.Millisecond)
	harness.WaitFor(t, "the ladder to engage and refusals of beta and gamma", func() (bool, string) {
		st, _ := fetchState(t, stateURL)
		byCode := map[string]int64{}
		for _, tn := range st.Tenants {
			for code, n := range tn.Outcomes {
				byCode[tn.Name+"/"+code] += n
			}
		}
		ok := len(st.Transitions) > 0 && byCode["gamma/quota_exceeded"] > 0 && byCode["beta/tenant_queue_full"] > 0 &&
			byCode["_unknown/served"] > 0 && byCode[longTenant+"/served"] > 0
		return ok, fmt.Sprintf("%d transitions, outcomes %v", len(st.Transitions), byCode)
	})
	// Load until the gateway's own history covers eight seconds of it, so
	// the charts have a history to draw.
	harness.WaitFor(t, "eight seconds of the load in the dashboard's history", func() (bool, string) {
		st, _ := fetchState(t, base+"/fair-queue/api/state?queue=dash&window=5m")
		return st.SpanSecs >= 8, fmt.Sprintf("%.1f s covered", st.SpanSecs)
	})
	stop()
	wg.Wait()
	t.Logf("load: %d answers, %d refused", sent.Load(), refused.Load())
	// Quiet: nothing queued or in flight, the ladder released, so the 1h
	// numbers stand still while the page and the test read them.
	harness.WaitFor(t, "the gateway to drain and the ladder to release", func() (bool, string) {
		st, _ := fetchState(t, stateURL)
		return st.Gateway.Queued == 0 && st.Gateway.Inflight == 0 && len(st.Transitions) >= 2 && st.Gateway.Water == 0,
			fmt.Sprintf("queued %d inflight %d transitions %d", st.Gateway.Queued, st.Gateway.Inflight, len(st.Transitions))
	})

	// basic_auth guards page and state; the dashboard's own headers come
	// with them.
	for _, path := range []string{"/fair-queue/", "/fair-queue/api/state"} {
		if resp, _ := getAuth(t, base+path, "", ""); resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s without credentials: %d %v, want 401 with a challenge", path, resp.StatusCode, resp.Header)
		}
	}
	resp, _ := getAuth(t, base+"/fair-queue/", dashUser, dashPassword)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("the page with credentials: %d %v; want 200 with nosniff and the CSP", resp.StatusCode, resp.Header)
	}

	dir := os.Getenv("FQ_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, way := range []struct {
		name, locale   string
		urlCredentials bool
		hourCycle      *regexp.Regexp // what every time shown must look like
	}{
		// en-US: a 12-hour clock, "3:04:05 PM" (a narrow no-break space before PM).
		{"prompt", "en_US", false, regexp.MustCompile(`^\d{1,2}:\d{2}(:\d{2})?[\s\x{a0}\x{202f}][AP]M$`)},
		// de-DE: a 24-hour clock, "15:04:05".
		{"url-credentials", "de_DE", true, regexp.MustCompile(`^\d{1,2}:\d{2}(:\d{2})?$`)},
	} {
		t.Run(way.name, func(t *testing.T) {
			url := base + "/fair-queue/"
			if way.urlCredentials {
				url = strings.Replace(url, "http://", "http://"+dashUser+":"+dashPassword+"@", 1)
			}
			checkDashboardPage(t, chromium, url, stateURL, way.locale, way.hourCycle, !way.urlCredentials,
				filepath.Join(dir, "dashboard-"+way.name+".png"))
		})
	}
}

// pageCell is one number on the page: its text and the raw value it shows.
type pageCell struct {
	Text  string `json:"text"`
	Value string `json:"value"`
}

// pageLabel is a tenant name drawn in a chart: the text shown, the whole
// name of its tooltip, its width and the room it had.
type pageLabel struct {
	Chart  string  `json:"chart"`
	Tenant string  `json:"tenant"`
	Shown  string  `json:"shown"`
	Full   string  `json:"full"`
	Width  float64 `json:"width"`
	Room   float64 `json:"room"`
}

// pageQuotaRow is one meter of the quota table.
type pageQuotaRow struct {
	Tenant  string `json:"tenant"`
	Meter   string `json:"meter"`
	Limit   string `json:"limit"`
	Value   string `json:"limit_value"`
	Occ     string `json:"occupancy"`
	Now     string `json:"now"`
	Delayed string `json:"delayed"`
	Refused string `json:"refused"`
}

// pageView is what the test reads off the rendered page.
type pageView struct {
	Status  string                         `json:"status"`
	Window  string                         `json:"window"`
	Title   string                         `json:"title"`
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
	// The words: the window label, the column tooltips and legends, the
	// cost model.
	WindowLabel   string            `json:"window_label"`
	HeadTitles    map[string]string `json:"head_titles"`
	TenantsLegend string            `json:"tenants_legend"`
	QuotaLegend   string            `json:"quota_legend"`
	CostModel     map[string]string `json:"cost_model"`
	Times         []string          `json:"times"`
	Labels        []pageLabel       `json:"labels"`
	// NameCells: the table cells of the long name, with their tooltip
	// and whether the style cuts them.
	NameCells []struct {
		Title   string `json:"title"`
		Clipped bool   `json:"clipped"`
	} `json:"name_cells"`
	// QuantileOverlaps lists the histograms whose p50/p95/p99 labels
	// overlap.
	QuantileOverlaps []string       `json:"quantile_overlaps"`
	QuantileLabels   int            `json:"quantile_labels"`
	QuotaRows        []pageQuotaRow `json:"quota_rows"`
}

const readPage = `(() => {
  const cells = (root) => {
    const out = {};
    for (const c of root.querySelectorAll("[data-field]")) out[c.dataset.field] = {text: c.textContent, value: c.dataset.value || ""};
    return out;
  };
  const own = (e) => e.firstChild && e.firstChild.nodeType === Node.TEXT_NODE ? e.firstChild.nodeValue : e.textContent;
  const tiles = {};
  for (const id of ["gw-capacity", "gw-healthy", "gw-queued", "gw-inflight", "gw-water", "jain", "gw-tokenweight"]) {
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
  const heads = {};
  for (const th of document.querySelectorAll("#tenants thead th")) heads[th.textContent] = th.title || "";
  const cm = {};
  for (const id of ["cm-overhead", "cm-prompt", "cm-completion", "cm-fit", "gw-tokenweight-use"]) cm[id] = document.getElementById(id).textContent;
  cm.completion_value = document.getElementById("cm-completion").dataset.value;
  const times = [];
  for (const e of document.querySelectorAll("[data-time]")) times.push(own(e));
  const labels = [];
  const bands = {"chart-shares": (640 - 44 - 12) / document.querySelectorAll("#chart-shares rect.bar.share").length - 6, "chart-outcomes": 100};
  for (const e of document.querySelectorAll("text.tenant-label")) {
    const chart = e.closest("svg").id;
    labels.push({chart, tenant: e.dataset.tenant, shown: own(e), full: e.querySelector("title").textContent,
      width: e.getComputedTextLength(), room: bands[chart]});
  }
  const nameCells = [];
  for (const td of document.querySelectorAll("td.name")) {
    if (!td.title.startsWith(` + "`" + longTenant + "`" + `)) continue;
    nameCells.push({title: td.title, clipped: getComputedStyle(td).textOverflow === "ellipsis" && td.scrollWidth > td.clientWidth});
  }
  const overlaps = [];
  let qlabels = 0;
  for (const s of document.querySelectorAll("#wait-histograms svg")) {
    const boxes = [...s.querySelectorAll("text.marker-label")].map((e) => e.getBBox());
    qlabels += boxes.length;
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      if (a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height) overlaps.push(s.dataset.tenant);
    }
  }
  const quota = [];
  for (const tr of document.querySelectorAll("#quota tbody tr[data-meter]")) {
    const td = (f) => { const e = tr.querySelector('[data-field="' + f + '"]'); return e ? e.textContent : ""; };
    const lim = tr.querySelector("td.limit");
    quota.push({tenant: tr.dataset.tenant, meter: tr.dataset.meter, limit: lim.textContent, limit_value: lim.dataset.value,
      occupancy: td("occupancy"), now: td("now"), delayed: td("quota.hits." + tr.dataset.meter + ".delayed"),
      refused: td("quota.hits." + tr.dataset.meter + ".refused")});
  }
  return {
    status: document.getElementById("status").dataset.state,
    window: document.body.dataset.window || "",
    title: document.title,
    tiles, tenants, outcomes, hist_sums: hist,
    water_path: water ? water.getAttribute("d").split(/[ML]/).filter(Boolean).length : 0,
    trigger_lines: document.querySelectorAll("#chart-water line.line-trigger").length,
    recover_lines: document.querySelectorAll("#chart-water line.line-recover").length,
    cap_paths: document.querySelectorAll("#chart-capacity path.series").length,
    share_bars: document.querySelectorAll("#chart-shares rect.bar.share").length,
    fair_bars: document.querySelectorAll("#chart-shares rect.bar.fair").length,
    timeline_marks: document.querySelectorAll("#chart-timeline .mark").length,
    transition_rows: document.querySelectorAll("#transitions tbody tr[data-kind]").length,
    window_label: document.getElementById("window-label").textContent,
    head_titles: heads,
    tenants_legend: document.getElementById("tenants-legend").textContent,
    quota_legend: document.getElementById("quota-legend").textContent,
    cost_model: cm, times, labels, name_cells: nameCells, quantile_overlaps: overlaps, quantile_labels: qlabels,
    quota_rows: quota,
  };
})()`

// browser starts a headless Chromium tab in locale, with a listener that
// collects console errors, exceptions and error log entries.
func browser(t *testing.T, chromium, locale string) (context.Context, func() []string) {
	t.Helper()
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
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithListener(listener))
	t.Cleanup(cancelBrowser)
	if _, err := chromedp.Call(bctx, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: locale}); err != nil {
		t.Fatalf("setting the locale: %v", err)
	}
	return bctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

// answerPrompts answers every basic-auth challenge of the tab with the
// dashboard's credentials, as a person typing them at the prompt, through
// the DevTools Fetch domain (which pauses every request: the others go on
// unchanged), and counts the challenges.
func answerPrompts(t *testing.T, bctx context.Context) *atomic.Int64 {
	t.Helper()
	var challenges atomic.Int64
	paused := chromedp.Events(bctx, fetch.RequestPaused)
	auth := chromedp.Events(bctx, fetch.AuthRequired)
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(bctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}
	}()
	go func() {
		for ev, err := range auth {
			if err != nil {
				return
			}
			challenges.Add(1)
			_, _ = chromedp.Call(bctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID,
				AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials,
					Username: dashUser, Password: dashPassword}})
		}
	}()
	on := true
	if _, err := chromedp.Call(bctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &on}); err != nil {
		t.Fatalf("enabling the Fetch domain: %v", err)
	}
	return &challenges
}

// checkDashboardPage opens url in a fresh browser in locale, answering
// the credentials prompt when prompt is set, and checks the page against
// stateURL's JSON; timeRe is what every time shown must match.
func checkDashboardPage(t *testing.T, chromium, url, stateURL, locale string, timeRe *regexp.Regexp, prompt bool, shot string) {
	bctx, problems := browser(t, chromium, locale)
	var challenges *atomic.Int64
	if prompt {
		challenges = answerPrompts(t, bctx)
	}
	bctx, cancelTimeout := context.WithTimeout(bctx, harness.Scale(2*time.Minute))
	defer cancelTimeout()

	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("loading the dashboard: %v (%v)", err, problems())
	}
	// 1. The first poll ends either way: the page drew its state, or it
	// says why it could not.
	first, err := chromedp.Run(bctx, chromedp.Poll[string](`(() => {
		const s = document.getElementById("status");
		return s && s.dataset.state !== "loading" ? s.dataset.state + ": " + s.textContent : "";
	})()`, chromedp.WithPollingTimeout(harness.PollTimeout)))
	if err != nil || !strings.HasPrefix(first, "ok: ") {
		t.Fatalf("the page's first poll: %q %v (%v)", first, err, problems())
	}
	if err := chromedp.Do(bctx, chromedp.WaitVisible("#tenants tbody tr[data-tenant]"), chromedp.Click("#win-1h")); err != nil {
		t.Fatalf("the tenants table: %v", err)
	}
	if prompt && challenges.Load() == 0 {
		t.Errorf("the page loaded without a credentials challenge: basic_auth is not in front of it")
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
		chromedp.WithPollingTimeout(harness.PollTimeout))); err != nil {
		t.Fatalf("waiting for the page to poll the 1h window: %v", err)
	}
	view, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](readPage))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	st, raw := fetchState(t, stateURL)

	// 1. The page polls its state, with the credentials it was opened
	// with, whichever way they came.
	if view.Status != "ok" || view.Window != "1h" {
		t.Errorf("page status %q window %q, want ok and 1h", view.Status, view.Window)
	}

	// The numbers shown are the endpoint's.
	expectShown(t, "capacity", view.Tiles["gw-capacity"], float64(st.Gateway.Capacity), 1, 0)
	expectShown(t, "healthy upstreams", view.Tiles["gw-healthy"], float64(st.Gateway.Healthy), 1, 0)
	expectShown(t, "Jain's index", view.Tiles["jain"], st.Jain, 1, 0.0005)
	if st.Gateway.Capacity != 4 || st.Gateway.Healthy != 2 {
		t.Errorf("endpoint: capacity %d healthy %d, want 4 (2 x 2) and 2", st.Gateway.Capacity, st.Gateway.Healthy)
	}
	if len(view.Tenants) != len(st.Tenants) || len(st.Tenants) != 5 {
		t.Errorf("page shows %d tenants, endpoint %d, want alpha, beta, gamma, the long one and _unknown", len(view.Tenants), len(st.Tenants))
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
	if view.TriggerLines != len(st.Gateway.Ladder) || view.RecoverLines != len(st.Gateway.Ladder) ||
		view.CapPaths != 2 || view.ShareBars != len(st.Tenants) || view.FairBars != len(st.Tenants) ||
		view.TimelineMark != len(st.Transitions) || view.Transitions != len(st.Transitions) {
		t.Errorf("charts: %+v; endpoint: %d ladder steps, %d tenants, %d transitions", view,
			len(st.Gateway.Ladder), len(st.Tenants), len(st.Transitions))
	}

	// 2. Fair shares are WFQ's: each tenant's part of what was owed; the
	// undeclared tenants, who used capacity the others left, are not shown
	// as taking more than their share. The page says what fair share means.
	var sumShare, sumFair float64
	for _, tn := range st.Tenants {
		sumShare += tn.Share
		sumFair += tn.FairShare
		t.Logf("observed: %s share %.3f fair share %.3f (%v requests)", tn.Name, tn.Share, tn.FairShare, tn.Requests)
	}
	if math.Abs(sumShare-1) > 1e-9 || math.Abs(sumFair-1) > 1e-9 || st.JainTenants != 5 {
		t.Errorf("shares sum to %v, fair shares to %v, Jain over %d tenants; want 1, 1 and 5", sumShare, sumFair, st.JainTenants)
	}
	t.Logf("observed: Jain's index %.3f", st.Jain)
	if st.Jain < 0.9 {
		t.Errorf("Jain's index %.3f under WFQ; want >= 0.9", st.Jain)
	}
	if !strings.Contains(view.HeadTitles["fair share"], "owed") || !strings.Contains(view.TenantsLegend, "nothing waiting is owed what it used") {
		t.Errorf("fair share unexplained: column title %q, legend %q", view.HeadTitles["fair share"], view.TenantsLegend)
	}

	// 3. Every meter that binds, with its limit: the long tenant's qps 3
	// and the joint meter it implies (at the learned weight, said so),
	// gamma's tokens, the undeclared tenants' per caller, without an
	// occupancy that would add callers up; averages said to be averages.
	rows := map[string]pageQuotaRow{}
	for _, r := range view.QuotaRows {
		rows[r.Tenant+"/"+r.Meter] = r
	}
	for key, want := range map[string]string{
		longTenant + "/qps":   "3.00 req/s",
		longTenant + "/joint": "3.00 req-eq/s at ",
		"gamma/tokens":        "120 tokens/min",
		"_unknown/qps":        "each caller: 20.00 req/s",
		"_unknown/joint":      "each caller: 20.00 req-eq/s",
	} {
		r, ok := rows[key]
		if !ok || !strings.Contains(r.Limit, want) {
			t.Errorf("quota %s: row %+v; want its limit %q", key, r, want)
		}
	}
	if r := rows[longTenant+"/joint"]; !strings.Contains(r.Limit, "(learned)") {
		t.Errorf("the long tenant's joint meter %q does not say its weight is the learned one (cost model ready: %v)",
			r.Limit, st.Gateway.CostModel.Ready)
	}
	for _, key := range []string{"_unknown/qps", "_unknown/joint"} {
		if r := rows[key]; r.Occ != "— (per caller)" {
			t.Errorf("quota %s occupancy %q, want none (per caller)", key, r.Occ)
		}
	}
	if _, ok := rows["gamma/qps"]; ok {
		t.Errorf("gamma has no request quota, but the page shows one")
	}
	if r := rows["gamma/tokens"]; r.Refused == "0" || (r.Now != "at rest" && !strings.HasPrefix(r.Now, "in debt: at rest in ")) {
		t.Errorf("gamma's token meter %+v: want its refusals and its standing now", r)
	}
	for _, tn := range st.Tenants {
		for meter, hits := range tn.Quota.Hits {
			r, ok := rows[tn.Name+"/"+meter]
			if !ok || r.Delayed != strconv.FormatInt(hits.Delayed, 10) || r.Refused != strconv.FormatInt(hits.Refused, 10) {
				t.Errorf("%s %s: %+v delayed/refused on the endpoint, the page row %+v", tn.Name, meter, hits, r)
			}
		}
	}
	if !strings.Contains(view.QuotaLegend, "averages") || !strings.Contains(view.QuotaLegend, "at this instant") {
		t.Errorf("quota legend %q does not say which numbers are averages and which are now", view.QuotaLegend)
	}

	// 4. The ETA columns are explained, and a tenant its quota holds was
	// promised the quota's delay.
	for _, h := range []string{"ETA promised / actual", "ETA typical miss ×"} {
		if view.HeadTitles[h] == "" {
			t.Errorf("column %q has no explanation", h)
		}
	}
	if !strings.Contains(view.TenantsLegend, "its quota's delay when the quota holds it") {
		t.Errorf("tenants legend %q does not say the ETA counts a quota's delay", view.TenantsLegend)
	}
	for _, tn := range st.Tenants {
		if tn.ETA.Count > 0 {
			t.Logf("observed: %s ETA promised/actual %.3f over %d", tn.Name, tn.ETA.MeanRatio, tn.ETA.Count)
		}
	}

	// 5. The cost model in words, and which token_to_qps_weight applies.
	cm := st.Gateway.CostModel
	if cm.Ready {
		for id, want := range map[string]string{
			"cm-overhead":   strconv.FormatFloat(1000*cm.OverheadSeconds, 'f', 1, 64) + " ms per request",
			"cm-prompt":     strconv.FormatFloat(1e6*cm.PromptTokenSeconds, 'f', 2, 64) + " ms per 1k prompt tokens",
			"cm-completion": strconv.FormatFloat(1000*cm.CompletionTokenSeconds, 'f', 2, 64) + " ms per output token",
			"cm-fit":        "R² " + strconv.FormatFloat(cm.R2, 'f', 3, 64),
		} {
			if !strings.Contains(view.CostModel[id], want) {
				t.Errorf("cost model %s: page shows %q, want %q", id, view.CostModel[id], want)
			}
		}
	} else {
		t.Errorf("the cost model is not ready after the load (%d requests): the words are not checked", sentHint(st))
	}
	if view.CostModel["completion_value"] != strconv.FormatFloat(cm.CompletionTokenSeconds, 'g', -1, 64) &&
		view.CostModel["completion_value"] != fmt.Sprint(cm.CompletionTokenSeconds) {
		t.Errorf("cost model: page holds %q, endpoint %v", view.CostModel["completion_value"], cm.CompletionTokenSeconds)
	}
	if len(st.Gateway.LearnedWeightTenants) != 1 || st.Gateway.LearnedWeightTenants[0] != longTenant ||
		!strings.Contains(view.CostModel["gw-tokenweight-use"], "applies to the joint quota of "+longTenant) {
		t.Errorf("learned weight: endpoint %v, page says %q; want it applied to %s", st.Gateway.LearnedWeightTenants,
			view.CostModel["gw-tokenweight-use"], longTenant)
	}

	// 6. One time format, the locale's; a title naming the queue; the
	// window label saying what the history covers; long names cut, whole
	// on hover; quantile labels apart.
	if len(view.Times) < 10 {
		t.Errorf("only %d times on the page: %q", len(view.Times), view.Times)
	}
	for _, tm := range view.Times {
		if !timeRe.MatchString(tm) {
			t.Errorf("time %q is not in the %s locale's format (%s)", tm, locale, timeRe)
		}
	}
	if view.Title != "Fair queue “dash” — dashboard" {
		t.Errorf("title %q does not name the queue", view.Title)
	}
	if st.SpanSecs < st.WindowSecs && (strings.Contains(view.WindowLabel, "last") || !strings.Contains(view.WindowLabel, "the history covers")) {
		t.Errorf("window label %q: the history covers %.0f s of %.0f", view.WindowLabel, st.SpanSecs, st.WindowSecs)
	}
	long := 0
	for _, l := range view.Labels {
		if l.Full != l.Tenant || l.Width > l.Room+0.5 {
			t.Errorf("label %+v: want the whole name as tooltip, within its room", l)
		}
		if l.Tenant == longTenant {
			long++
			if !strings.HasSuffix(l.Shown, "…") || !strings.HasPrefix(longTenant, strings.TrimSuffix(l.Shown, "…")) {
				t.Errorf("long name in %s shown as %q, want a prefix and an ellipsis", l.Chart, l.Shown)
			}
		}
	}
	if long != 2 {
		t.Errorf("the long name is drawn %d times, want in the shares and the outcomes charts", long)
	}
	if len(view.NameCells) < 2 {
		t.Errorf("the long name's table cells: %+v, want one in the tenants table and one in the quota table", view.NameCells)
	}
	for _, c := range view.NameCells {
		if c.Title != longTenant || !c.Clipped {
			t.Errorf("long name cell %+v: want its whole name on hover, cut with an ellipsis", c)
		}
	}
	if view.QuantileLabels == 0 || len(view.QuantileOverlaps) > 0 {
		t.Errorf("%d quantile labels; overlapping in %v", view.QuantileLabels, view.QuantileOverlaps)
	}

	// The 5 minute window: the gateway's series is per second there, so
	// the water line has as many points as seconds were sampled.
	if err := chromedp.Do(bctx, chromedp.Click("#win-5m")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](
		`document.body.dataset.window === "5m" && document.querySelector("#chart-water path.series.water") !== null`,
		chromedp.WithPollingTimeout(harness.PollTimeout))); err != nil {
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
	if view5.Status != "ok" {
		t.Errorf("status %q after the 5m poll", view5.Status)
	}

	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	for _, p := range problems() {
		t.Errorf("browser: %s", p)
	}
	if t.Failed() {
		t.Logf("endpoint: %s", raw)
	}
}

// sentHint is how many requests the endpoint counted, for a message.
func sentHint(st dashState) int {
	n := 0.0
	for _, tn := range st.Tenants {
		n += tn.Requests
	}
	return int(n)
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
