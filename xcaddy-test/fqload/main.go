// Command fqload is the through-the-binary load test (make load): it builds
// Caddy with the plugin via xcaddy (cached by source hash, as the end-to-end
// tests do), starts one Caddy with a plain reverse_proxy site and a
// fair_queue site in front of the same fast upstream, and alternates rounds
// of small chat completions between them with vegeta. It prints each round
// and the medians and fair/plain ratios of throughput, p50, p99 and Caddy's
// CPU time per request (see package loadtest).
//
// By default it runs the rounds at max rate (a fixed number of workers,
// each sending as soon as it is answered), then again at a fixed rate of a
// quarter of the plain site's median max-rate throughput, where latency is
// the request's own rather than the queueing of a saturated box (at max
// rate with a fixed number of workers, p50 is about workers / throughput).
// With -control a second plain site stands in for fair_queue, to see the
// noise floor of the ratios on the machine at hand.
//
// With -backlog it runs the backlogged mode instead (loadtest.Options.Backlog):
// a flood of 32 KB prompts against an upstream that takes 20 ms a request,
// through plain, fair_queue with its queue empty, and a fair_queue whose
// queue always holds most of the requests, rounds alternating; the report
// adds the backlogged request's CPU over the idle one's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/loadtest"
)

func main() {
	def := loadtest.DefaultOptions()
	var o loadtest.Options
	flag.IntVar(&o.Rounds, "rounds", def.Rounds, "rounds per site (they alternate plain, fair, plain...)")
	flag.DurationVar(&o.Duration, "duration", def.Duration, "length of one round")
	flag.DurationVar(&o.Warmup, "warmup", def.Warmup, "unmeasured load on each site before the first round")
	flag.IntVar(&o.Workers, "workers", def.Workers, "requests in flight at max rate")
	flag.IntVar(&o.Rate, "rate", 0, "requests per second for the first phase; 0: max rate")
	flag.IntVar(&o.Tenants, "tenants", def.Tenants, "tenants the requests rotate through")
	flag.BoolVar(&o.Control, "control", false, "put a second plain reverse_proxy site in fair_queue's place: the ratios then show the noise floor")
	flag.StringVar(&o.ProfileDir, "profile", "", "directory for CPU profiles of each max-rate round: Caddy's (<site>-<round>.pprof) and the load tool's (tool-<site>-<round>.pprof); compare with go tool pprof -diff_base")
	fixedFrac := flag.Float64("fixed-frac", 0.25, "after a max-rate phase, run a fixed-rate phase at this fraction of plain's median throughput; 0: skip")
	flag.BoolVar(&o.Backlog, "backlog", false, "backlogged mode: long prompts, a slow upstream, and a third site whose queue is never empty (no fixed-rate phase)")
	flag.IntVar(&o.PromptBytes, "prompt-bytes", loadtest.BacklogOptions().PromptBytes, "prompt size in backlogged mode")
	flag.DurationVar(&o.UpstreamDelay, "upstream-delay", loadtest.BacklogOptions().UpstreamDelay, "the upstream's time per request in backlogged mode")
	caddyBin := flag.String("caddy", "", "Caddy binary with the plugin; default: build it with xcaddy from this checkout (cached)")
	flag.Parse()
	if o.Backlog {
		// The mode's own worker count unless the command line sets one.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["workers"] {
			o.Workers = loadtest.BacklogOptions().Workers
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The harness logs little when all goes well (a build starting), and
	// the processes' output when something fails.
	err := harness.Standalone(ctx, "fqload", os.Stderr, func(t testing.TB) {
		bin := *caddyBin
		if bin == "" {
			fmt.Fprintln(os.Stderr, "fqload: building Caddy with the plugin (xcaddy, cached by source hash; minutes when cold)")
			bin = harness.BuildCaddy(t)
		}
		rig := loadtest.Start(t, bin, o.MaxInflight())
		fmt.Printf("Caddy %s (pid %d): plain %s, control %s, fair_queue %s, upstream %s\n\n",
			bin, rig.Caddy.PID(), rig.PlainURL, rig.ControlURL, rig.FairURL, rig.Upstream.Addr())

		rep, err := loadtest.Run(ctx, rig, o, os.Stderr)
		report(t, rep, err)
		if o.Rate != 0 || *fixedFrac <= 0 || o.Backlog {
			return
		}
		fixed := o
		fixed.Rate = int(*fixedFrac * rep.Summary().Plain.Throughput)
		if fixed.Rate < 1 {
			t.Fatalf("plain's median throughput %.0f req/s leaves no fixed rate", rep.Summary().Plain.Throughput)
		}
		fixed.Warmup = 0 // the connections and caches are warm
		fixed.ProfileDir = ""
		fmt.Printf("\n--- fixed rate: %.2f x plain's median max-rate throughput ---\n", *fixedFrac)
		rep, err = loadtest.Run(ctx, rig, fixed, os.Stderr)
		report(t, rep, err)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// report prints a phase's report, the rounds that ran if it was cut short
// (an interrupt), and fails on its error.
func report(t testing.TB, rep *loadtest.Report, err error) {
	if rep != nil && len(rep.Rounds) > 0 {
		fmt.Println()
		rep.Print(os.Stdout)
	}
	if err != nil {
		t.Fatal(err)
	}
}
