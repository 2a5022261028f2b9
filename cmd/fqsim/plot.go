package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue/simulator"
)

// plotRun writes a run's charts to dir as SVG: each tenant's wait CDF, and
// each tenant's share of the served tokens over time (10 s windows). It
// returns the files written.
func plotRun(dir string, res *simulator.Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, res.Scenario.Name+"-"+res.Policy)
	cdf, err := waitCDF(res)
	if err != nil {
		return nil, err
	}
	shares, err := sharesOverTime(res, 10*time.Second)
	if err != nil {
		return nil, err
	}
	var files []string
	for name, p := range map[string]*plot.Plot{"-wait-cdf.svg": cdf, "-shares.svg": shares} {
		f := base + name
		if err := p.Save(8*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}

// waitCDF plots, per tenant, the fraction of its served requests that
// waited at most x seconds.
func waitCDF(res *simulator.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s / %s: queue wait, CDF per tenant", res.Scenario.Name, res.Policy)
	p.X.Label.Text = "wait (s)"
	p.Y.Label.Text = "fraction of served requests"
	p.Y.Min, p.Y.Max = 0, 1
	waits := make([][]float64, len(res.Scenario.Tenants))
	for i := range res.Requests {
		q, rec := &res.Requests[i], &res.Records[i]
		if rec.Served() {
			waits[q.Tenant] = append(waits[q.Tenant], (rec.Dispatch - q.Arrival).Seconds())
		}
	}
	var lines []any
	for t, ws := range waits {
		if len(ws) == 0 {
			continue
		}
		sort.Float64s(ws)
		xys := make(plotter.XYs, 0, len(ws))
		for k, w := range ws {
			xys = append(xys, plotter.XY{X: w, Y: float64(k+1) / float64(len(ws))})
		}
		lines = append(lines, res.Scenario.Tenants[t].Name, xys)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	p.Legend.Top = false
	return p, nil
}

// sharesOverTime plots each tenant's share of the tokens served in each
// window.
func sharesOverTime(res *simulator.Result, window time.Duration) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s / %s: share of served tokens per %v", res.Scenario.Name, res.Policy, window)
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "share"
	p.Y.Min, p.Y.Max = 0, 1
	n := len(res.Scenario.Tenants)
	var end time.Duration
	for i := range res.Records {
		end = max(end, res.Records[i].Dispatch)
	}
	buckets := int(end/window) + 1
	served, totals := make([][]float64, buckets), make([]float64, buckets)
	for b := range served {
		served[b] = make([]float64, n)
	}
	for i := range res.Requests {
		q, rec := &res.Requests[i], &res.Records[i]
		if rec.Served() {
			served[rec.Dispatch/window][q.Tenant] += float64(q.Actual())
			totals[rec.Dispatch/window] += float64(q.Actual()) // whole tokens: exact in any order
		}
	}
	var lines []any
	for t := 0; t < n; t++ {
		xys := make(plotter.XYs, 0, buckets)
		for b, total := range totals {
			if total > 0 {
				xys = append(xys, plotter.XY{X: (time.Duration(b) * window).Seconds(), Y: served[b][t] / total})
			}
		}
		if len(xys) > 0 {
			lines = append(lines, res.Scenario.Tenants[t].Name, xys)
		}
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	return p, nil
}
