package simulator

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Format writes res as an aligned text block: a header line, one row per
// tenant (or group), and the overall figures.
func (res *Result) Format(w io.Writer) {
	sc := res.Scenario
	fmt.Fprintf(w, "== %s / %s (seed %d) ==\n", sc.Name, res.Policy, res.Seed)
	head := []string{"tenant", "weight", "class", "reqs", "wait p50", "p95", "p99",
		"limit p95", "at limit", "in order", "met budget", "tok/s", "makespan"}
	rows := [][]string{head}
	for _, r := range res.Rows {
		weight := "mixed"
		if !math.IsNaN(r.Weight) {
			weight = strconv.FormatFloat(r.Weight, 'g', -1, 64)
		}
		met := "-"
		if !math.IsNaN(r.MetBudget) {
			met = pct(r.MetBudget)
		}
		reqs := strconv.Itoa(r.N)
		if n := r.Expired + r.Rejected; n > 0 {
			reqs += fmt.Sprintf(" (%d lost)", n)
		}
		rows = append(rows, []string{r.Name, weight, r.Class, reqs,
			dur(r.WaitP50), dur(r.WaitP95), dur(r.WaitP99), dur(r.LimitP95),
			pct(r.AtLimit), pct(r.AtOrderLimit), met, thousands(r.TokPerSec), dur(r.Makespan)})
	}
	table(w, rows, 3)
	o := res.Overall
	fmt.Fprintf(w, "overall   %s requests, %s tok/s, makespan %s, contended %s",
		thousands(float64(o.Requests)), thousands(o.TokPerSec), dur(o.Makespan), dur(o.Contended))
	if o.Expired+o.Rejected > 0 {
		fmt.Fprintf(w, ", expired %d, rejected %d", o.Expired, o.Rejected)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "fairness  Jain %s mean, %s min over %d windows of %s",
		f3(o.Jain), f3(o.JainMin), o.JainWindows, dur(sc.window()))
	if math.IsNaN(o.MaxDiff) {
		fmt.Fprintln(w, "; max service diff n/a (no tracked equal-weight pair)")
	} else {
		fmt.Fprintf(w, "; max service diff %s tok = %.2fx largest request (%s tok)\n",
			thousands(o.MaxDiff), o.MaxDiff/float64(o.MaxCost), thousands(float64(o.MaxCost)))
	}
	if res.ViolationCount > 0 {
		fmt.Fprintf(w, "VIOLATIONS %d (first %d):\n", res.ViolationCount, len(res.Violations))
		for _, v := range res.Violations {
			fmt.Fprintf(w, "  %s\n", v)
		}
	}
}

// String returns Format's output.
func (res *Result) String() string {
	var b strings.Builder
	res.Format(&b)
	return b.String()
}

// table writes rows with columns padded to their widest cell; the first
// `left` columns are left-aligned (names), the rest right-aligned (numbers).
func table(w io.Writer, rows [][]string, left int) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-len(c))
			if i < left {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// dur formats a duration with precision that suits its size.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	case d < 100*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func f3(f float64) string {
	if math.IsNaN(f) {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", f)
}

// thousands formats f rounded to an integer with thousands separators.
func thousands(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "n/a"
	}
	s := strconv.FormatInt(int64(math.Round(f)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Summary describes a workload in one line.
func (w *Workload) Summary() string {
	sc := w.Scenario
	return fmt.Sprintf("%s: %s\n%d upstreams x %d slots, %d tenants, %d open-loop requests, seed %d",
		sc.Name, sc.Description, sc.Upstreams, sc.Slots, len(sc.Tenants), len(w.Requests), w.Seed)
}
