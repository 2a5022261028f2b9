package simulator

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// Episode is one wave: a maximal stretch of the timeline whose water is
// at least EpisodeWater, with the transitions made during it.
type Episode struct {
	From, To    time.Duration // first and last sample at or above EpisodeWater
	Peak        float64
	PeakAt      time.Duration
	MaxLevel    int
	Transitions []degrade.Transition
}

// EpisodeWater is the water level that separates waves: background
// traffic keeps a few requests queued, which is not a wave.
const EpisodeWater = 0.05

// Episodes splits the run's timeline into waves. A transition made
// outside every wave goes to the wave before it.
func (res *Result) Episodes() []Episode {
	var eps []Episode
	open := false
	for _, s := range res.Timeline {
		switch {
		case s.Water >= EpisodeWater && !open:
			eps = append(eps, Episode{From: s.At, To: s.At, Peak: s.Water, PeakAt: s.At})
			open = true
		case s.Water >= EpisodeWater:
			e := &eps[len(eps)-1]
			e.To = s.At
			if s.Water > e.Peak {
				e.Peak, e.PeakAt = s.Water, s.At
			}
		default:
			open = false
		}
	}
	for _, tr := range res.Transitions {
		at := tr.At.Sub(Epoch)
		k := len(eps) - 1
		for k > 0 && eps[k].From > at {
			k--
		}
		if k < 0 {
			continue
		}
		e := &eps[k]
		e.Transitions = append(e.Transitions, tr)
		e.MaxLevel = max(e.MaxLevel, tr.To)
		// The ladder observes every tick, the timeline every second: a
		// transition's own water may be the wave's true peak.
		if tr.Water > e.Peak {
			e.Peak, e.PeakAt = tr.Water, at
		}
	}
	return eps
}

// LevelAt returns the ladder level in effect at t.
func (res *Result) LevelAt(t time.Duration) int {
	level := 0
	for _, tr := range res.Transitions {
		if tr.At.Sub(Epoch) > t {
			break
		}
		level = tr.To
	}
	return level
}

// ClassOutcome counts the requests of one class that arrived at one level.
type ClassOutcome struct {
	N, Met, Throttled, Light int
}

// MetFraction is Met / N (NaN for no requests).
func (c ClassOutcome) MetFraction() float64 { return frac(c.Met, c.N) }

// ClassByLevel returns, per ladder level at arrival, the outcomes of the
// requests of class cls.
func (res *Result) ClassByLevel(cls string) []ClassOutcome {
	sc := res.Scenario
	out := make([]ClassOutcome, len(sc.Degrade)+1)
	for id := range res.Requests {
		r, rec := &res.Requests[id], &res.Records[id]
		if sc.Tenants[r.Tenant].Class != cls {
			continue
		}
		o := &out[res.LevelAt(r.Arrival)]
		o.N++
		if rec.Light {
			o.Light++
		}
		if rec.State == StateRejected && rec.Reason == fairqueue.ReasonClassThrottled {
			o.Throttled++
		}
		if b := sc.Budget(r.Tenant); rec.Served() && (b == 0 || rec.Wait(r) <= b) {
			o.Met++
		}
	}
	return out
}

// FormatTimeline writes a run's degrade timeline every `every` and at
// every transition, then a line per wave and per class.
func FormatTimeline(w io.Writer, res *Result, every time.Duration) {
	sc := res.Scenario
	fmt.Fprintf(w, "== %s / %s: degrade timeline (every %s, and every transition) ==\n",
		sc.Name, res.Policy, dur(every))
	table(w, timelineRows(res, every), 0, true)
	for i, e := range res.Episodes() {
		var moves []string
		for _, tr := range e.Transitions {
			sign := "-"
			if tr.Up {
				sign = "+"
			}
			moves = append(moves, sign+tr.Step)
		}
		fmt.Fprintf(w, "wave %d: %s-%s, peak water %.3f at %s, max level L%d, transitions %s\n",
			i+1, dur(e.From), dur(e.To), e.Peak, dur(e.PeakAt), e.MaxLevel, strings.Join(moves, " "))
	}
	up := 0
	for _, tr := range res.Transitions {
		if tr.Up {
			up++
		}
	}
	fmt.Fprintf(w, "transitions: %d engaged, %d released; level at the end L%d\n", up, len(res.Transitions)-up, res.LevelAt(math.MaxInt64))
	for _, c := range sc.Classes {
		formatClassByLevel(w, res, c.Name)
	}
}

// timelineRows is FormatTimeline's table; an idle stretch (empty queue at
// L0) shows only its first and last rows.
func timelineRows(res *Result, every time.Duration) [][]string {
	sc := res.Scenario
	rows := [][]string{{"t", "water", "level", "queued", "event"}}
	k := 0
	flush := func(upTo time.Duration) {
		for ; k < len(res.Transitions) && res.Transitions[k].At.Sub(Epoch) <= upTo; k++ {
			tr := res.Transitions[k]
			verb := "released"
			if tr.Up {
				verb = "engaged"
			}
			rows = append(rows, []string{dur(tr.At.Sub(Epoch)), fmt.Sprintf("%.3f", tr.Water), fmt.Sprintf("L%d", tr.To), "",
				fmt.Sprintf("%s %s: %s", tr.Step, verb, sc.Degrade[stepIndex(sc, tr.Step)].Action)})
		}
	}
	var idle []string // the last idle row not printed
	for _, s := range res.Timeline {
		if s.At%every != 0 {
			continue
		}
		flush(s.At - 1)
		row := []string{dur(s.At), fmt.Sprintf("%.3f", s.Water), fmt.Sprintf("L%d", s.Level), strconv.Itoa(s.Queued), ""}
		quiet := s.Queued == 0 && s.Level == 0
		if last := rows[len(rows)-1]; quiet && len(rows) > 1 && last[3] == "0" && last[2] == "L0" {
			idle = row // inside an idle stretch: hold back
			continue
		}
		if !quiet && idle != nil {
			rows = append(rows, idle) // the idle stretch's last row
		}
		idle = nil
		rows = append(rows, row)
	}
	if idle != nil {
		rows = append(rows, idle)
	}
	flush(math.MaxInt64)
	return rows
}

func formatClassByLevel(w io.Writer, res *Result, cls string) {
	var parts []string
	var tot ClassOutcome
	for lvl, o := range res.ClassByLevel(cls) {
		tot.N += o.N
		tot.Met += o.Met
		tot.Throttled += o.Throttled
		tot.Light += o.Light
		if o.N > 0 {
			parts = append(parts, fmt.Sprintf("L%d %s of %d", lvl, pct2(o.MetFraction()), o.N))
		}
	}
	fmt.Fprintf(w, "%-11s met budget %s of %d (by level at arrival: %s); light mode %d, throttled %d\n",
		cls, pct2(tot.MetFraction()), tot.N, strings.Join(parts, ", "), tot.Light, tot.Throttled)
}
