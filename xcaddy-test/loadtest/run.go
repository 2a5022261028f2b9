package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The sites, as Round.Site names them. Each pair of rounds runs plain
// first, then fair (or control, in control mode).
const (
	SitePlain   = "plain"
	SiteFair    = "fair"
	SiteControl = "control"
	SiteBacklog = "backlog"
)

// waitHeader is on every response fair_queue serves, and on no other.
const waitHeader = "X-Fair-Queue-Wait-Ms"

// Options shape a run.
type Options struct {
	Rounds   int           // per site; they alternate plain, fair, plain...
	Duration time.Duration // of one round
	// Warmup is sent to each site before the first round, not counted: it
	// opens the connections and fills caches on both paths.
	Warmup time.Duration
	// Workers is the requests in flight at max rate (vegeta workers, each
	// sending when its last request is answered), and the starting workers
	// at a fixed rate (up to 4x as many when all are busy).
	Workers int
	Rate    int // requests per second; 0: max rate
	Tenants int // the requests' X-Tenant-ID rotates over t0, t1...
	// Control puts a second plain reverse_proxy site in fair_queue's place:
	// the ratios then show the machine's noise floor.
	Control bool
	// ProfileDir, when set, receives a CPU profile of Caddy for each
	// measured round, <site>-<round>.pprof (from its admin endpoint), and
	// the load tool's own, tool-<site>-<round>.pprof.
	ProfileDir string
	// Backlog is the backlogged mode: prompts of PromptBytes, an upstream
	// taking UpstreamDelay a request, and a third site after fair in each
	// round, the backlog site, where all but BacklogInflight of the
	// workers' requests wait in the queue. fair is the same path with its
	// queue empty: backlog's CPU per request over fair's is what a backlog
	// adds to a request's cost.
	Backlog       bool
	PromptBytes   int
	UpstreamDelay time.Duration
}

func (o Options) valid() bool {
	return o.Rounds >= 1 && o.Duration > 0 && o.Workers >= 1 && o.Tenants >= 1 && o.Rate >= 0 &&
		(!o.Backlog || o.PromptBytes >= 1 && o.Workers > BacklogInflight && !o.Control)
}

// second is the site each pair runs after plain.
func (o Options) second() string {
	if o.Control {
		return SiteControl
	}
	return SiteFair
}

// DefaultOptions is what make load runs.
func DefaultOptions() Options {
	return Options{Rounds: 6, Duration: 5 * time.Second, Warmup: time.Second, Workers: 8, Tenants: 4}
}

// BacklogOptions is what make load runs in backlogged mode: 32 KB prompts
// from 64 workers, an upstream taking 20 ms, so the backlog site always
// has 48 requests waiting. Its 16 slots pass up to 800 requests a second,
// more than two cores of Caddy serve: the backlog and fair sites both run
// as fast as Caddy can, so CPU per request compares at the same load.
func BacklogOptions() Options {
	o := DefaultOptions()
	o.Backlog, o.Workers, o.PromptBytes, o.UpstreamDelay = true, 64, 32<<10, 20*time.Millisecond
	return o
}

// MaxInflight is the fair_queue max_inflight that Start needs for o: above
// every request the load may keep in flight, so none waits in the queue.
func (o Options) MaxInflight() int {
	return max(2*o.maxWorkers(), 256)
}

// maxWorkers is the most requests a round keeps in flight.
func (o Options) maxWorkers() int {
	if o.Rate == 0 {
		return o.Workers
	}
	return 4 * o.Workers
}

// Body is the small request every round sends: a short chat completion.
var Body = []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"Say hello in five words."}],"max_tokens":32}`)

// Round is one round's figures.
type Round struct {
	Site  string
	Index int // the site's rounds from 0
	// Errors are the requests not answered 200 (another status or a
	// transport error), ErrorSample one of them.
	Requests, OK, Errors int
	ErrorSample          string
	ViaFairQueue         int           // answers carrying waitHeader
	Elapsed              time.Duration // first request sent to last answer
	Throughput           float64       // OK per second of Elapsed
	P50, P99             time.Duration // over every request
	// CaddyCPU is Caddy's CPU time (user + system) over the round,
	// CPUPerRequest that per request; 0 when /proc is not readable.
	CaddyCPU, CPUPerRequest time.Duration
	// ToolCPUPerRequest is this process's (vegeta and the upstream, which
	// share the cores with Caddy at max rate).
	ToolCPUPerRequest time.Duration
}

// Report is a run's rounds, in the order they ran.
type Report struct {
	Options Options
	// Warmup counts the warm-up requests sent to each site, WarmupOK those
	// answered 200.
	Warmup, WarmupOK map[string]int
	Rounds           []Round
	CPUNote          string // why the CPU figures are missing, if they are
}

// site is one site of a run: its targets and its client for the whole run.
type site struct {
	name string
	tgt  vegeta.Targeter
	cl   *http.Client
}

// Run sends the warm-up to each site, then o.Rounds rounds per site,
// alternating, and returns their figures; progress (may be nil) gets a line
// per round. Failed requests are counted in the rounds: the error is for
// bad options, or ctx ending the run (the report holds the rounds so far).
func Run(ctx context.Context, rig *Rig, o Options, progress io.Writer) (*Report, error) {
	if !o.valid() {
		return nil, fmt.Errorf("loadtest: bad options %+v", o)
	}
	if o.Backlog {
		rig.Upstream.SetDelay(o.UpstreamDelay)
		defer rig.Upstream.SetDelay(0)
	}
	if progress == nil {
		progress = io.Discard
	}
	pid := rig.Caddy.PID()
	rep := &Report{Options: o, Warmup: map[string]int{}, WarmupOK: map[string]int{}}
	if _, err := processCPU(pid); err != nil {
		rep.CPUNote = fmt.Sprintf("no CPU figures: %v", err)
	}
	sites := o.sites(rig)
	for _, s := range sites {
		defer s.cl.CloseIdleConnections()
		if o.Warmup > 0 {
			r := attack(ctx, s.cl, s.tgt, o, o.Warmup, s.name+"-warmup", pid)
			rep.Warmup[s.name] = r.Requests
			rep.WarmupOK[s.name] = r.OK
		}
	}
	for i := range o.Rounds {
		for _, s := range sites {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			prof := startProfile(ctx, rig, o, fmt.Sprintf("%s-%d", s.name, i))
			r := attack(ctx, s.cl, s.tgt, o, o.Duration, s.name, pid)
			if err := prof(); err != nil {
				return rep, err
			}
			r.Site, r.Index = s.name, i
			rep.Rounds = append(rep.Rounds, r)
			fmt.Fprintln(progress, formatRound(r))
		}
	}
	return rep, nil
}

// sites are o's sites, in the order each round runs them.
func (o Options) sites(rig *Rig) []site {
	body := Body
	if o.Backlog {
		body = Prompt(o.PromptBytes)
	}
	newSite := func(name, url string) site {
		return site{name, targeter(url, o.Tenants, body), newClient(o.maxWorkers())}
	}
	sites := []site{newSite(SitePlain, rig.PlainURL), newSite(SiteFair, rig.FairURL)}
	if o.Control {
		sites[1] = newSite(SiteControl, rig.ControlURL)
	}
	if o.Backlog {
		sites = append(sites, newSite(SiteBacklog, rig.BacklogURL))
	}
	return sites
}

// startProfile starts profiling Caddy and this process over the coming
// round into o.ProfileDir (nothing without it), and returns the func that
// ends it. Caddy's covers the round's whole seconds, at least one.
func startProfile(ctx context.Context, rig *Rig, o Options, name string) func() error {
	if o.ProfileDir == "" {
		return func() error { return nil }
	}
	secs := max(int(o.Duration/time.Second), 1)
	self, err := os.Create(filepath.Join(o.ProfileDir, "tool-"+name+".pprof"))
	if err != nil {
		return func() error { return err }
	}
	if err := pprof.StartCPUProfile(self); err != nil {
		self.Close()
		return func() error { return err }
	}
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", rig.Caddy.AdminURL(), secs)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("loadtest: profile %s: %w", name, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("loadtest: profile %s: %s", name, resp.Status)
			}
			f, err := os.Create(filepath.Join(o.ProfileDir, name+".pprof"))
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return fmt.Errorf("loadtest: profile %s: %w", name, err)
			}
			return f.Close()
		}()
	}()
	return func() error {
		pprof.StopCPUProfile()
		return errors.Join(self.Close(), <-done)
	}
}

// targeter rotates the request body through the tenants.
func targeter(base string, tenants int, body []byte) vegeta.Targeter {
	tgts := make([]vegeta.Target, tenants)
	for i := range tgts {
		tgts[i] = vegeta.Target{
			Method: http.MethodPost,
			URL:    base + "/v1/chat/completions",
			Body:   body,
			Header: http.Header{
				"Content-Type": {"application/json"},
				"X-Tenant-Id":  {fmt.Sprintf("t%d", i)},
			},
		}
	}
	return vegeta.NewStaticTargeter(tgts...)
}

// newClient is one site's client for the whole run, keeping an idle
// connection per worker, so connections carry over from round to round.
func newClient(workers int) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil, // loopback only, whatever the environment says
			MaxIdleConns:        workers,
			MaxIdleConnsPerHost: workers,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
}

// attack runs one round against a site and measures it.
func attack(ctx context.Context, cl *http.Client, tgt vegeta.Targeter, o Options, d time.Duration, name string, pid int) Round {
	// At a fixed rate vegeta adds workers when all are busy; the cap keeps
	// a stalled moment of the shared machine from growing them, and their
	// connections, without bound (new connections would measure the TCP
	// handshake, not the handler): an overloaded round falls behind instead.
	atk := vegeta.NewAttacker(vegeta.Client(cl), vegeta.Workers(uint64(o.Workers)),
		vegeta.Redirects(vegeta.NoFollow), vegeta.MaxWorkers(uint64(o.maxWorkers())))
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()

	var (
		r         Round
		lat       []time.Duration
		first     time.Time
		last      time.Time
		cpu0, err = processCPU(pid)
		self0     = selfCPU()
	)
	for res := range atk.Attack(tgt, vegeta.Rate{Freq: o.Rate, Per: time.Second}, d, name) {
		r.Requests++
		lat = append(lat, res.Latency)
		if first.IsZero() || res.Timestamp.Before(first) {
			first = res.Timestamp
		}
		if end := res.End(); end.After(last) {
			last = end
		}
		if res.Code == http.StatusOK && res.Error == "" {
			r.OK++
		} else {
			r.Errors++
			if r.ErrorSample == "" {
				r.ErrorSample = fmt.Sprintf("status %d %s %.200s", res.Code, res.Error, res.Body)
			}
		}
		if _, ok := res.Headers[http.CanonicalHeaderKey(waitHeader)]; ok {
			r.ViaFairQueue++
		}
	}
	self1 := selfCPU()
	if cpu1, err1 := processCPU(pid); err == nil && err1 == nil && r.Requests > 0 {
		r.CaddyCPU = cpu1 - cpu0
		r.CPUPerRequest = r.CaddyCPU / time.Duration(r.Requests)
	}
	if r.Requests > 0 {
		r.ToolCPUPerRequest = (self1 - self0) / time.Duration(r.Requests)
	}
	r.Elapsed = last.Sub(first)
	if r.Elapsed > 0 {
		r.Throughput = float64(r.OK) / r.Elapsed.Seconds()
	}
	r.P50, r.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return r
}

// quantile is the nearest-rank quantile q of ds (sorted in place).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// Prompt is a chat completion request of about size bytes: a system prompt
// and user messages of English and Chinese sentences, like a long RAG
// prompt. The same size gives the same body on every run.
func Prompt(size int) []byte {
	en := strings.Fields("the gateway queue tenant request model server token budget wait fair share weight " +
		"upstream slot latency throughput batch realtime interactive prompt response stream usage quota limit " +
		"capacity health reload config operator metric dashboard estimate cost backlog dispatch deadline retry " +
		"of to and in for with on by from that which is are was be as at it this an a its their each every")
	zh := []rune("网关排队租户请求模型服务令牌预算等待公平份额权重上游槽位延迟吞吐批量实时交互提示响应流式用量配额限制容量健康配置运维指标估算成本积压调度截止重试的了在是和与对为")
	rng := rand.New(rand.NewPCG(uint64(size), 30))
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []message{{"system", "You are a helpful assistant. Answer from the documents below; cite them by number."}}
	for n := 0; n < size; {
		var doc strings.Builder
		for doc.Len() < min(size-n, 4096) {
			if rng.IntN(4) == 0 {
				for range 8 + rng.IntN(30) {
					doc.WriteRune(zh[rng.IntN(len(zh))])
				}
				doc.WriteString("。")
			} else {
				for i := range 6 + rng.IntN(20) {
					if i > 0 {
						doc.WriteByte(' ')
					}
					doc.WriteString(en[rng.IntN(len(en))])
				}
				doc.WriteString(". ")
			}
			if rng.IntN(6) == 0 {
				doc.WriteString("\n\n")
			}
		}
		msgs = append(msgs, message{"user", doc.String()})
		n += doc.Len()
	}
	b, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 256, "messages": msgs})
	if err != nil {
		panic(err) // strings and ints only
	}
	return b
}
