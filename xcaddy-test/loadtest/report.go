package loadtest

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ, which
// Linux fixes at 100 for user space whatever the kernel's tick rate.
const userHZ = 100

// processCPU is a process's CPU time so far, user + system (/proc/<pid>/stat
// fields 14 and 15), in steps of 10 ms.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count the fields from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks int64
	for _, v := range f[11:13] { // fields 14 (utime) and 15 (stime)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// selfCPU is this process's CPU time so far, user + system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Figures are one site's medians over its rounds (Requests and Errors:
// sums).
type Figures struct {
	Throughput                       float64
	P50, P99                         time.Duration
	CPUPerRequest, ToolCPUPerRequest time.Duration
	Requests, Errors                 int
}

// Summary compares the sites.
type Summary struct {
	// Fair is the site each pair runs second: fair_queue, or the control.
	Plain, Fair Figures
	// The ratios are Fair over Plain of the medians (0 when plain's is 0).
	ThroughputRatio, P50Ratio, P99Ratio, CPURatio float64
	// The Pair ratios are Fair over Plain round by round (each fair round
	// against the plain round just before it): their spread shows the noise.
	PairThroughput, PairP50, PairCPU []float64
	// Backlog is the backlog site (Options.Backlog); its CPU ratios are
	// over Fair's, the same path with the queue empty.
	Backlog         Figures
	BacklogCPURatio float64
	PairBacklogCPU  []float64
}

// Summary computes the medians and ratios.
func (r *Report) Summary() Summary {
	var s Summary
	s.Plain = figures(r.Rounds, SitePlain)
	s.Fair = figures(r.Rounds, r.Options.second())
	s.ThroughputRatio = ratio(s.Fair.Throughput, s.Plain.Throughput)
	s.P50Ratio = ratio(float64(s.Fair.P50), float64(s.Plain.P50))
	s.P99Ratio = ratio(float64(s.Fair.P99), float64(s.Plain.P99))
	s.CPURatio = ratio(float64(s.Fair.CPUPerRequest), float64(s.Plain.CPUPerRequest))
	plain, fair := roundsOf(r.Rounds, SitePlain), roundsOf(r.Rounds, r.Options.second())
	for i := range min(len(plain), len(fair)) {
		p, f := plain[i], fair[i]
		s.PairThroughput = append(s.PairThroughput, ratio(f.Throughput, p.Throughput))
		s.PairP50 = append(s.PairP50, ratio(float64(f.P50), float64(p.P50)))
		s.PairCPU = append(s.PairCPU, ratio(float64(f.CPUPerRequest), float64(p.CPUPerRequest)))
	}
	if r.Options.Backlog {
		s.Backlog = figures(r.Rounds, SiteBacklog)
		s.BacklogCPURatio = ratio(float64(s.Backlog.CPUPerRequest), float64(s.Fair.CPUPerRequest))
		backlog := roundsOf(r.Rounds, SiteBacklog)
		for i := range min(len(fair), len(backlog)) {
			s.PairBacklogCPU = append(s.PairBacklogCPU, ratio(float64(backlog[i].CPUPerRequest), float64(fair[i].CPUPerRequest)))
		}
	}
	return s
}

func roundsOf(rs []Round, site string) []Round {
	var out []Round
	for _, r := range rs {
		if r.Site == site {
			out = append(out, r)
		}
	}
	return out
}

func figures(rs []Round, site string) Figures {
	var f Figures
	var tp, p50, p99, cpu, tool []float64
	for _, r := range roundsOf(rs, site) {
		tp = append(tp, r.Throughput)
		p50 = append(p50, float64(r.P50))
		p99 = append(p99, float64(r.P99))
		cpu = append(cpu, float64(r.CPUPerRequest))
		tool = append(tool, float64(r.ToolCPUPerRequest))
		f.Requests += r.Requests
		f.Errors += r.Errors
	}
	f.Throughput = median(tp)
	f.P50 = time.Duration(median(p50))
	f.P99 = time.Duration(median(p99))
	f.CPUPerRequest = time.Duration(median(cpu))
	f.ToolCPUPerRequest = time.Duration(median(tool))
	return f
}

// median of xs (the mean of the middle two for an even count); xs is
// sorted in place.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func formatRound(r Round) string {
	return fmt.Sprintf("%-5s #%d  %7d req  %5d err  %8.0f req/s  p50 %8s  p99 %8s  caddy cpu %7s/req (%.2f cores)",
		r.Site, r.Index+1, r.Requests, r.Errors, r.Throughput, us(r.P50), us(r.P99), us(r.CPUPerRequest), cores(r))
}

func cores(r Round) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return r.CaddyCPU.Seconds() / r.Elapsed.Seconds()
}

// us formats a duration in microseconds with one decimal.
func us(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 1, 64) + "µs"
}

// Print writes the rounds, the medians and the ratios as tables.
func (r *Report) Print(w io.Writer) {
	o := r.Options
	mode := "max rate"
	if o.Rate > 0 {
		mode = fmt.Sprintf("fixed rate %d req/s", o.Rate)
	}
	second := o.second()
	if o.Control {
		fmt.Fprintln(w, "CONTROL: the second site is a plain reverse_proxy like the first; its ratios show the noise floor")
	}
	fmt.Fprintf(w, "%s, %d workers, %d tenants, %d rounds x %s per site, alternating plain/%s (warm-up %s per site: plain %d/%d, %s %d/%d answered 200)\n",
		mode, o.Workers, o.Tenants, o.Rounds, o.Duration, second, o.Warmup,
		r.WarmupOK[SitePlain], r.Warmup[SitePlain], second, r.WarmupOK[second], r.Warmup[second])
	if o.Backlog {
		fmt.Fprintf(w, "BACKLOGGED: %d-byte prompts, upstream %s a request; the backlog site (fair_queue, %d slots) runs third in each round, with the rest of the workers' requests waiting in its queue\n",
			len(Prompt(o.PromptBytes)), o.UpstreamDelay, BacklogInflight)
	}
	if r.CPUNote != "" {
		fmt.Fprintln(w, r.CPUNote)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tsite\trequests\terrors\tvia fair_queue\treq/s\tp50\tp99\tcaddy cpu/req\tcaddy cores\ttool cpu/req\t")
	for _, rd := range r.Rounds {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%.2f\t%s\t\n",
			rd.Index+1, rd.Site, rd.Requests, rd.Errors, rd.ViaFairQueue, rd.Throughput, us(rd.P50), us(rd.P99), us(rd.CPUPerRequest), cores(rd), us(rd.ToolCPUPerRequest))
	}
	tw.Flush()
	for _, rd := range r.Rounds {
		if rd.ErrorSample != "" {
			fmt.Fprintf(w, "%s #%d: first error: %s\n", rd.Site, rd.Index+1, rd.ErrorSample)
		}
	}

	s := r.Summary()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "median over rounds\treq/s\tp50\tp99\tcaddy cpu/req\ttool cpu/req\trequests\terrors\t")
	for _, x := range []struct {
		name string
		f    Figures
	}{{SitePlain, s.Plain}, {second, s.Fair}, {SiteBacklog, s.Backlog}} {
		if x.name == SiteBacklog && !o.Backlog {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%d\t%d\t\n", x.name, x.f.Throughput, us(x.f.P50), us(x.f.P99), us(x.f.CPUPerRequest), us(x.f.ToolCPUPerRequest), x.f.Requests, x.f.Errors)
	}
	fmt.Fprintf(tw, "%s/plain\t%.3f\t%.3f\t%.3f\t%.3f\t\t\t\t\n", second, s.ThroughputRatio, s.P50Ratio, s.P99Ratio, s.CPURatio)
	if o.Backlog {
		fmt.Fprintf(tw, "backlog/fair\t\t\t\t%.3f\t\t\t\t\n", s.BacklogCPURatio)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%s/plain round by round (%s round i over the plain round just before it):\n", second, second)
	fmt.Fprintf(w, "  throughput %s\n", pairs(s.PairThroughput))
	fmt.Fprintf(w, "  p50        %s\n", pairs(s.PairP50))
	fmt.Fprintf(w, "  cpu/req    %s\n", pairs(s.PairCPU))
	if o.Backlog {
		fmt.Fprintf(w, "backlog/fair cpu/req round by round (the backlogged request over the same path idle): %s\n", pairs(s.PairBacklogCPU))
	}
}

// pairs formats ratios taken round by round: the list, its median and its
// range.
func pairs(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 3, 64)
	}
	spread := "-"
	if len(xs) > 0 {
		spread = fmt.Sprintf("%.3f-%.3f", slices.Min(xs), slices.Max(xs))
	}
	return fmt.Sprintf("[%s]  median %.3f  range %s", strings.Join(parts, " "), median(slices.Clone(xs)), spread)
}
