// Command fqload is the through-the-binary load test (make load): one
// xcaddy-built Caddy with a plain reverse_proxy site and a fair_queue site
// in front of the same fast upstream, rounds of small chat completions
// alternating between them (package loadtest), first at max rate, then at
// a fixed fraction of plain's throughput. -control puts a second plain
// site in fair_queue's place (the noise floor); -backlog runs the
// backlogged mode (loadtest.Options.Backlog). See docs/performance.md.
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
	workersSet := false
	flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
	if o.Backlog && !workersSet {
		o.Workers = loadtest.BacklogOptions().Workers // the mode's own unless set
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
