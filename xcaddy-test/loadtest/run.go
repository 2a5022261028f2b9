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

// waitHeader is set by fair_queue on every response it serves: its presence
// proves a request went through fair_queue, its absence that it did not.
const waitHeader = "X-Fair-Queue-Wait-Ms"

// Options shape a run.
type Options struct {
	// Rounds is the number of rounds per site; they alternate plain, fair,
	// plain, fair...
	Rounds int
	// Duration is the length of one round.
	Duration time.Duration
	// Warmup is sent to each site before the first round and not counted:
	// it opens the connections and fills caches on both paths.
	Warmup time.Duration
	// Workers is the number of requests in flight in max-rate mode (vegeta
	// workers, each sending its next request when the last is answered),
	// and the starting workers at a fixed rate (which adds up to 4x as many
	// when they are all busy).
	Workers int
	// Rate is requests per second; 0 is max-rate mode.
	Rate int
	// Tenants is the number of tenants the requests rotate through (their
	// X-Tenant-ID: t0, t1...).
	Tenants int
	// Control puts a second plain reverse_proxy site in fair_queue's place:
	// the "fair/plain" ratios then compare two identical sites, and show
	// how far the machine's noise, and running second in each pair, move
	// them without any difference in the handler.
	Control bool
	// ProfileDir, when set, receives a CPU profile of Caddy for each
	// measured round (Caddy's /debug/pprof/profile on its admin endpoint,
	// for the round's whole seconds), named <site>-<round>.pprof: `go tool
	// pprof -diff_base plain-0.pprof fair-0.pprof` shows where fair_queue's
	// extra time goes in the binary. The load tool's own profile over the
	// round (vegeta and the upstream) goes to tool-<site>-<round>.pprof.
	ProfileDir string
	// Backlog is the backlogged mode: every site gets prompts of
	// PromptBytes, the upstream answers each request UpstreamDelay after it
	// arrives, and a third site runs after fair in each round: the backlog
	// site, a fair_queue with BacklogInflight slots, where all but
	// BacklogInflight of the workers' requests wait in the queue. fair,
	// with slots for every worker, is the same request path with its
	// queue empty: backlog's CPU per request over fair's is what a backlog
	// adds to a request's cost.
	Backlog bool
	// PromptBytes is the size of the prompt in backlogged mode.
	PromptBytes int
	// UpstreamDelay is the upstream's time per request in backlogged mode.
	UpstreamDelay time.Duration
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

// BacklogOptions is what make load runs in backlogged mode: a flood of
// 32 KB prompts from 64 workers against an upstream that takes 20 ms a
// request, so that the backlog site always has 48 requests waiting. Its
// 16 slots pass up to 800 requests a second, more than two cores of
// Caddy serve of these prompts, so that the backlog and fair sites both
// run as fast as Caddy can: CPU per request compares at the same load,
// the process's fixed costs (its tickers, health checks) spread alike.
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
	// Site is SitePlain or SiteFair; Index counts the site's rounds from 0.
	Site  string
	Index int
	// Requests were sent; OK were answered 200; Errors are the rest
	// (another status or a transport error), ErrorSample one of them.
	Requests, OK, Errors int
	ErrorSample          string
	// ViaFairQueue counts responses carrying fair_queue's X-Fair-Queue-Wait-Ms.
	ViaFairQueue int
	// Elapsed is from the first request sent to the last answer received.
	Elapsed time.Duration
	// Throughput is OK responses per second of Elapsed.
	Throughput float64
	// P50 and P99 are latency quantiles over every request of the round.
	P50, P99 time.Duration
	// CaddyCPU is the Caddy process's CPU time (user + system) over the
	// round, CPUPerRequest that over Requests; both 0 when /proc is not
	// readable (not Linux).
	CaddyCPU, CPUPerRequest time.Duration
	// ToolCPUPerRequest is this process's CPU time per request: vegeta and
	// the upstream (and whatever else the process runs). At max rate on a
	// small machine they share the cores with Caddy, so the throughput
	// ratio follows the ratio of the sums of both CPU figures.
	ToolCPUPerRequest time.Duration
}

// Report is a run's rounds, in the order they ran.
type Report struct {
	Options Options
	// Warmup counts the warm-up requests sent to each site (all of them
	// also reached the upstream), and WarmupOK those answered 200.
	Warmup, WarmupOK map[string]int
	Rounds           []Round
	// CPUNote says why the CPU figures are missing, if they are.
	CPUNote string
}

// Run sends the warm-up to each site, then o.Rounds rounds per site,
// alternating plain and fair (or control), and returns their figures.
// progress (may be nil) gets one line per round as it ends. Failed
// requests are counted in the rounds, not returned: the error is for bad
// options, or ctx ending the run (the report then holds the rounds so far,
// the last one cut short).
func Run(ctx context.Context, rig *Rig, o Options, progress io.Writer) (*Report, error) {
	if o.Rounds < 1 || o.Duration <= 0 || o.Workers < 1 || o.Tenants < 1 || o.Rate < 0 ||
		o.Backlog && (o.PromptBytes < 1 || o.Workers <= BacklogInflight || o.Control) {
		return nil, fmt.Errorf("loadtest: bad options %+v", o)
	}
	body := Body
	if o.Backlog {
		body = Prompt(o.PromptBytes)
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
	sites := []struct {
		name string
		tgt  vegeta.Targeter
		cl   *http.Client
	}{
		{SitePlain, targeter(rig.PlainURL, o.Tenants, body), newClient(o.maxWorkers())},
		{SiteFair, targeter(rig.FairURL, o.Tenants, body), newClient(o.maxWorkers())},
	}
	if o.Control {
		sites[1].name, sites[1].tgt = SiteControl, targeter(rig.ControlURL, o.Tenants, body)
	}
	if o.Backlog {
		sites = append(sites, struct {
			name string
			tgt  vegeta.Targeter
			cl   *http.Client
		}{SiteBacklog, targeter(rig.BacklogURL, o.Tenants, body), newClient(o.maxWorkers())})
	}
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

// startProfile starts fetching a CPU profile of Caddy over the coming
// round into o.ProfileDir/name.pprof, and returns the func that waits for
// it. Without o.ProfileDir it does nothing. The profile covers the round's
// whole seconds (pprof takes no finer duration), at least one.
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
// connection per worker, so that connections carry over from round to
// round (vegeta's attacker ends with its attack; the client passed to it
// does not).
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
	opts := []func(*vegeta.Attacker){
		vegeta.Client(cl),
		vegeta.Workers(uint64(o.Workers)),
		vegeta.Redirects(vegeta.NoFollow),
	}
	// Max rate: a fixed set of workers, each sending as soon as it is
	// answered. At a fixed rate vegeta adds workers when all are busy; the
	// cap keeps a stalled moment of the shared machine from growing them,
	// and their connections, without bound (new connections per request
	// would measure the TCP handshake, not the handler), so an overloaded
	// round falls behind its rate instead.
	opts = append(opts, vegeta.MaxWorkers(uint64(o.maxWorkers())))
	atk := vegeta.NewAttacker(opts...)
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
// and user messages of English and Chinese sentences, as a long document or
// RAG prompt is. The same size gives the same body on every run.
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
