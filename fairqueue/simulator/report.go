package simulator

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Format writes res as a text block: a row per tenant (or group), then
// the overall figures.
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
		reqs := strconv.Itoa(r.N)
		if n := r.Expired + r.Rejected; n > 0 {
			reqs += fmt.Sprintf(" (%d lost)", n)
		}
		rows = append(rows, []string{r.Name, weight, r.Class, reqs,
			dur(r.WaitP50), dur(r.WaitP95), dur(r.WaitP99), dur(r.LimitP95),
			pct(r.AtLimit), pct(r.AtOrderLimit), orDash(r.MetBudget, pct), thousands(r.TokPerSec), dur(r.Makespan)})
	}
	table(w, rows, 3, false)
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

// table writes rows with columns padded to their widest cell; the first
// `left` columns (and with lastLeft the last) are left-aligned, the rest
// right-aligned.
func table(w io.Writer, rows [][]string, left int, lastLeft bool) {
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
			if i < left || lastLeft && i == len(r)-1 {
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
	var b strings.Builder
	if rest, neg := strings.CutPrefix(s, "-"); neg {
		b.WriteByte('-')
		s = rest
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Summary describes a workload in one line.
func (w *Workload) Summary() string {
	sc := w.Scenario
	return fmt.Sprintf("%s: %s\n%d upstreams x %d slots, %d tenants, %d open-loop requests, seed %d",
		sc.Name, sc.Description, sc.Upstreams, sc.Slots, len(sc.Tenants), len(w.Requests), w.Seed)
}

// FormatBudgets writes the wait-budget comparison of several policies'
// runs of one workload.
func FormatBudgets(w io.Writer, results []*Result) {
	if len(results) == 0 {
		return
	}
	sc := results[0].Scenario
	fmt.Fprintf(w, "== %s: wait budgets (seed %d) ==\n", sc.Name, results[0].Seed)
	rows := [][]string{{"policy", "tenant", "class", "reqs", "met budget", "starved", "fast-failed",
		"expired", "boosts", "eta n", "eta err p50", "|err| p50", "|err| p90", "tok/s"}}
	for _, res := range results {
		for _, r := range res.Rows {
			rows = append(rows, []string{res.Policy, r.Name, r.Class, strconv.Itoa(r.N), orDash(r.MetBudget, pct2),
				strconv.Itoa(r.Starved), strconv.Itoa(r.FastFailed), strconv.Itoa(r.Expired),
				strconv.Itoa(r.Boosted), strconv.Itoa(r.ETAN), pctOrNA(r.ETAErrP50), durOrNA(r.ETAAbsP50, r.ETAN),
				durOrNA(r.ETAAbsP90, r.ETAN), thousands(r.TokPerSec)})
		}
		o := res.Overall
		rows = append(rows, []string{res.Policy, "(all)", "", strconv.Itoa(o.Requests), "",
			strconv.Itoa(o.Starved), strconv.Itoa(o.FastFailed), strconv.Itoa(o.Expired),
			strconv.Itoa(o.Boosted), strconv.Itoa(o.ETAN), pctOrNA(o.ETAErrP50), "", "", thousands(o.TokPerSec)})
	}
	table(w, rows, 3, false)
	byName := map[string]*Result{}
	for _, res := range results {
		byName[res.Policy] = res
		fmt.Fprintf(w, "%-24s boosted in flight: max %d (limit %d at full capacity), boost budget violations %d",
			res.Policy, res.MaxBoostedInflight, res.BoostLimit, res.BoostViolations)
		if res.ViolationCount > 0 {
			fmt.Fprintf(w, "; VIOLATIONS %d: %s", res.ViolationCount, strings.Join(res.Violations, "; "))
		}
		fmt.Fprintln(w)
	}
	if on, off := byName[WFQBudgets], byName[WFQNoBoost]; on != nil && off != nil {
		fmt.Fprintf(w, "throughput, boost on vs off: %s vs %s tok/s (%+.2f%%)\n", thousands(on.Overall.TokPerSec),
			thousands(off.Overall.TokPerSec), 100*(on.Overall.TokPerSec/off.Overall.TokPerSec-1))
	}
	if on, off := byName[WFQBudgets], byName[WFQNoFastFail]; on != nil && off != nil {
		p := FastFailPrecision(on, off)
		fmt.Fprintf(w, "fast-fail precision: %s of %d refused missed their budget with fast-fail off "+
			"(%d expired, %d dispatched late, %d refused otherwise; %d made it)\n",
			pctOrNA(p.Precision()), p.Refused, p.Expired, p.Late, p.Other, p.Made)
		FormatEarly(w, "early refusal", Early(on, off))
	}
}

// Precision is the fast-fail precision of one run against the same
// workload run with fast-fail off: of the open-loop requests the first
// refused with ReasonBudgetExceeded, how many Expired, were dispatched
// Late, were refused for another reason (Other) or Made their budget
// without fast-fail.
type Precision struct {
	Refused, Expired, Late, Other, Made int
}

// Missed counts the refused requests that missed their budget without
// fast-fail.
func (p Precision) Missed() int { return p.Expired + p.Late + p.Other }

// Precision is Missed / Refused (NaN when nothing was refused).
func (p Precision) Precision() float64 {
	if p.Refused == 0 {
		return math.NaN()
	}
	return float64(p.Missed()) / float64(p.Refused)
}

// FastFailPrecision compares the requests ff refused with what became of
// them in off. Only open-loop requests are the same, by ID, in both runs.
func FastFailPrecision(ff, off *Result) Precision {
	var p Precision
	n := min(len(ff.Records), len(off.Records))
	for id := 0; id < n; id++ {
		rec := &ff.Records[id]
		if rec.State != StateRejected || rec.Reason != fairqueue.ReasonBudgetExceeded {
			continue
		}
		r := &off.Requests[id]
		if r.Arrival != ff.Requests[id].Arrival || r.Tenant != ff.Requests[id].Tenant {
			continue // a closed-loop request: not the same request
		}
		p.Refused++
		o := &off.Records[id]
		switch o.State {
		case StateExpired:
			p.Expired++
		case StateRejected:
			p.Other++
		default:
			if b := off.Scenario.Budget(r.Tenant); b > 0 && o.Wait(r) > b {
				p.Late++
			} else {
				p.Made++
			}
		}
	}
	return p
}

func stepIndex(sc *Scenario, name string) int {
	for i, s := range sc.Degrade {
		if s.Name == name {
			return i
		}
	}
	return 0
}

func pct2(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }

// orDash formats f, or "-" when it is NaN (not applicable).
func orDash(f float64, format func(float64) string) string {
	if math.IsNaN(f) {
		return "-"
	}
	return format(f)
}

func pctOrNA(f float64) string {
	if math.IsNaN(f) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*f)
}

func durOrNA(d time.Duration, n int) string {
	if n == 0 {
		return "n/a"
	}
	return dur(d)
}

// HealthEffect is what one health change did to one tenant's
// admissions: the median predicted wait and the share fast-failed, in the
// window before and after it.
type HealthEffect struct {
	At                        time.Duration
	Healthy                   int
	Tenant                    string
	ETABefore, ETAAfter       time.Duration
	NBefore, NAfter           int
	RefusedBefore, RefusedAft float64
}

// Ratio is ETAAfter / ETABefore (NaN without predictions on either side).
func (h HealthEffect) Ratio() float64 {
	if h.NBefore == 0 || h.NAfter == 0 || h.ETABefore == 0 {
		return math.NaN()
	}
	return float64(h.ETAAfter) / float64(h.ETABefore)
}

// HealthEffects measures every health change for all tenants pooled
// ("(all)"), then for each tenant.
func (res *Result) HealthEffects(window time.Duration) []HealthEffect {
	sc := res.Scenario
	var out []HealthEffect
	for _, h := range sc.Health {
		for i := -1; i < len(sc.Tenants); i++ {
			name := "(all)"
			if i >= 0 {
				name = sc.Tenants[i].Name
			}
			// Index 0 is the window before the change, 1 the one after.
			var preds [2][]time.Duration
			var n, refused [2]int
			for id := range res.Requests {
				r, rec := &res.Requests[id], &res.Records[id]
				if i >= 0 && r.Tenant != i || r.Arrival < h.At-window || r.Arrival >= h.At+window {
					continue
				}
				side := 0
				if r.Arrival >= h.At {
					side = 1
				}
				n[side]++
				if rec.State == StateRejected && rec.Reason == fairqueue.ReasonBudgetExceeded {
					refused[side]++
				}
				if rec.HasPrediction {
					preds[side] = append(preds[side], rec.Predicted)
				}
			}
			slices.Sort(preds[0])
			slices.Sort(preds[1])
			out = append(out, HealthEffect{At: h.At, Healthy: h.Healthy, Tenant: name,
				NBefore: len(preds[0]), NAfter: len(preds[1]),
				ETABefore: percentile(preds[0], 0.5), ETAAfter: percentile(preds[1], 0.5),
				RefusedBefore: frac(refused[0], n[0]), RefusedAft: frac(refused[1], n[1])})
		}
	}
	return out
}

func frac(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// FormatHealth writes HealthEffects for each window as one table.
func FormatHealth(w io.Writer, res *Result, windows ...time.Duration) {
	fmt.Fprintf(w, "== %s / %s: admissions before and after each health change ==\n",
		res.Scenario.Name, res.Policy)
	rows := [][]string{{"t", "healthy", "tenant", "window", "eta p50 before", "after", "ratio", "fast-failed before", "after"}}
	var effects [][]HealthEffect
	for _, win := range windows {
		effects = append(effects, res.HealthEffects(win))
	}
	for i := range effects[0] {
		for k, win := range windows {
			e := effects[k][i]
			ratio := "n/a"
			if r := e.Ratio(); !math.IsNaN(r) {
				ratio = fmt.Sprintf("%.2fx", r)
			}
			rows = append(rows, []string{dur(e.At), strconv.Itoa(e.Healthy), e.Tenant, dur(win),
				fmt.Sprintf("%s (n=%d)", durOrNA(e.ETABefore, e.NBefore), e.NBefore),
				fmt.Sprintf("%s (n=%d)", durOrNA(e.ETAAfter, e.NAfter), e.NAfter), ratio,
				pctOrNA(e.RefusedBefore), pctOrNA(e.RefusedAft)})
		}
	}
	table(w, rows, 3, false)
}
