package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

// Files checked by TestGrafanaAndAlerts.
var (
	grafanaDashboardFile = filepath.Join("examples", "grafana-dashboard.json")
	alertRulesFile       = filepath.Join("examples", "alerts.yml")
	alertRuleTestsFile   = filepath.Join("examples", "alerts_test.yml")
)

// metricPrefix starts the name of every metric the plugin exports.
const metricPrefix = metricsNamespace + "_" + metricsSubsystem + "_"

// exportedSeries maps every series name a scrape of the plugin can hold to
// its label names: each metric of MetricNames, and for a histogram its
// _bucket (with le), _sum and _count series instead of the bare name.
func exportedSeries(t *testing.T) map[string][]string {
	t.Helper()
	histograms := map[string]bool{}
	for _, c := range collectors {
		if _, ok := c.(*prometheus.HistogramVec); ok {
			for _, n := range describeNames(c) {
				histograms[n] = true
			}
		}
	}
	labels := map[string][]string{}
	for _, c := range collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descLabels.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read name and labels from %s", d)
			}
			var ls []string
			if m[2] != "" {
				ls = strings.Split(m[2], ",")
			}
			labels[m[1]] = ls
		}
	}
	names := MetricNames()
	if len(names) != len(labels) {
		t.Fatalf("MetricNames lists %d metrics, the collectors describe %d", len(names), len(labels))
	}
	series := map[string][]string{}
	for _, n := range names {
		ls, ok := labels[n]
		if !ok {
			t.Fatalf("MetricNames lists %s, which no collector describes", n)
		}
		if histograms[n] {
			series[n+"_bucket"] = append(slices.Clone(ls), "le")
			series[n+"_sum"] = ls
			series[n+"_count"] = ls
			continue
		}
		series[n] = ls
	}
	return series
}

func describeNames(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	var names []string
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// descLabels reads the name and variable labels out of a Desc's String
// (constraint-wrapped labels, c(name), are not used here).
var descLabels = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

// TestGrafanaAndAlerts checks examples/grafana-dashboard.json and
// examples/alerts.yml against the metrics the plugin exports: every
// metric a PromQL expression selects is an exported series (histograms
// only through _bucket/_sum/_count), every label it matches on, groups
// by or joins on exists on those series, every label a legend or an alert
// annotation prints exists, every exported metric has a panel, and every
// alert names its queue, and its tenant when it is about one. With
// promtool on PATH it also runs `promtool check rules` and the rule unit
// tests of examples/alerts_test.yml.
func TestGrafanaAndAlerts(t *testing.T) {
	series := exportedSeries(t)

	t.Run("dashboard", func(t *testing.T) {
		exprs := dashboardExprs(t)
		if len(exprs) < 20 {
			t.Fatalf("the dashboard has %d queries; expected a full board", len(exprs))
		}
		used := map[string]bool{}
		for _, e := range exprs {
			a := checkPromQL(t, e.where, e.expr, series)
			for _, m := range a.metrics {
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m.name, "_bucket"), "_sum"), "_count")] = true
			}
			for _, l := range templateLabels(e.legend, `\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`) {
				if !a.mayCarry(l, series) {
					t.Errorf("%s: legend %q prints label %s, which the query's result cannot carry", e.where, e.legend, l)
				}
			}
		}
		for _, n := range MetricNames() {
			if !used[n] {
				t.Errorf("exported metric %s has no panel on the dashboard", n)
			}
		}
	})

	t.Run("alerts", func(t *testing.T) {
		groups := alertGroups(t)
		var n int
		for _, g := range groups {
			for _, r := range g.Rules {
				n++
				where := fmt.Sprintf("%s alert %s", alertRulesFile, r.Alert)
				if r.Alert == "" || r.Record != "" {
					t.Errorf("%s: group %s holds a rule that is not an alert (%q)", alertRulesFile, g.Name, r.Record)
					continue
				}
				a := checkPromQL(t, where, r.Expr, series)
				if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
					t.Errorf("%s: severity %q, want critical, warning or info", where, r.Labels["severity"])
				}
				summary := r.Annotations["summary"]
				if summary == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: needs a summary and a description", where)
				}
				want := []string{"queue"}
				if strings.HasSuffix(g.Name, "-tenants") {
					want = append(want, "tenant")
				}
				printed := templateLabels(summary, `\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
				for _, l := range want {
					if !slices.Contains(printed, l) {
						t.Errorf("%s: summary %q does not name the %s ({{ $labels.%s }})", where, summary, l, l)
					}
				}
				for _, text := range r.Annotations {
					for _, l := range templateLabels(text, `\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`) {
						if !a.mayCarry(l, series) {
							t.Errorf("%s: annotation prints $labels.%s, which the expression's result cannot carry", where, l)
						}
					}
				}
			}
		}
		if n < 5 {
			t.Errorf("%d alerts; expected the starved, wait-budget, refusals, degrade and upstream alerts", n)
		}
	})

	t.Run("promtool", func(t *testing.T) {
		promtool, err := exec.LookPath("promtool")
		if err != nil {
			t.Log("promtool is not on PATH (Debian: apt-get install prometheus); `promtool check rules` and the rule unit tests were not run")
			return
		}
		for _, args := range [][]string{
			{"check", "rules", alertRulesFile},
			{"test", "rules", alertRuleTestsFile},
		} {
			out, err := exec.Command(promtool, args...).CombinedOutput()
			if err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			} else {
				t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
			}
		}
	})
}

// dashboardExpr is one PromQL expression of the dashboard.
type dashboardExpr struct {
	where, expr, legend string
}

// dashboardExprs collects every query of the dashboard: panel targets
// (rows' nested panels too), annotation queries and template variables.
func dashboardExprs(t *testing.T) []dashboardExpr {
	t.Helper()
	raw, err := os.ReadFile(grafanaDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Type    string   `json:"type"`
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		UID         string  `json:"uid"`
		Title       string  `json:"title"`
		Panels      []panel `json:"panels"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s: %v", grafanaDashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("%s: needs a uid and a title", grafanaDashboardFile)
	}
	var out []dashboardExpr
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d is used twice", grafanaDashboardFile, p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", grafanaDashboardFile, p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, dashboardExpr{
					where:  fmt.Sprintf("%s panel %q query %s", grafanaDashboardFile, p.Title, tg.RefID),
					expr:   tg.Expr,
					legend: tg.LegendFormat,
				})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, a := range dash.Annotations.List {
		if a.Expr != "" {
			out = append(out, dashboardExpr{where: fmt.Sprintf("%s annotation %q", grafanaDashboardFile, a.Name), expr: a.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Errorf("%s: variable %s: query is neither an object nor a string", grafanaDashboardFile, v.Name)
			}
		}
		out = append(out, dashboardExpr{where: fmt.Sprintf("%s variable %s", grafanaDashboardFile, v.Name), expr: q.Query})
	}
	return out
}

// alertGroup is a Prometheus rule group, as much of it as is checked.
type alertGroup struct {
	Name  string `yaml:"name"`
	Rules []struct {
		Alert       string            `yaml:"alert"`
		Record      string            `yaml:"record"`
		Expr        string            `yaml:"expr"`
		For         string            `yaml:"for"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"rules"`
}

func alertGroups(t *testing.T) []alertGroup {
	t.Helper()
	raw, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []alertGroup `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("%s: %v", alertRulesFile, err)
	}
	if len(file.Groups) == 0 {
		t.Fatalf("%s: no rule groups", alertRulesFile)
	}
	return file.Groups
}

func templateLabels(text, pattern string) []string {
	var out []string
	for _, m := range regexp.MustCompile(pattern).FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// pqToken is a PromQL token. Kinds: 'i' identifier, 's' string, 'n'
// number or duration, 'v' Grafana variable, 'r' a [range] or [subquery]
// (its contents are durations and variables only), 'o' operator, and the
// punctuation characters ( ) { } , themselves.
type pqToken struct {
	kind byte
	text string
}

// promqlTokens splits a PromQL expression (with Grafana's $variables) into
// tokens. It knows PromQL's lexical grammar, not its syntax: what it
// cannot lex is an error, what it lexes is then checked by checkPromQL.
func promqlTokens(expr string) ([]pqToken, error) {
	var toks []pqToken
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			toks = append(toks, pqToken{'i', expr[i:j]})
			i = j
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdent(expr[j]) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("lone $ at %d", i)
			}
			toks = append(toks, pqToken{'v', expr[i:j]})
			i = j
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, pqToken{'s', expr[i : j+1]})
			i = j + 1
		case '0' <= c && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdent(expr[j]) && expr[j] != ':' || expr[j] == '.') {
				j++
			}
			toks = append(toks, pqToken{'n', expr[i:j]})
			i = j
		case c == '[':
			k := strings.IndexByte(expr[i:], ']')
			if k < 0 {
				return nil, fmt.Errorf("unterminated [ at %d", i)
			}
			inner := expr[i+1 : i+k]
			if !rangeContents.MatchString(inner) {
				return nil, fmt.Errorf("range [%s] is not a duration, a variable or a subquery", inner)
			}
			toks = append(toks, pqToken{'r', expr[i : i+k+1]})
			i += k + 1
		case strings.IndexByte("(){},", c) >= 0:
			toks = append(toks, pqToken{c, string(c)})
			i++
		case strings.IndexByte("=!~<>+-*/%^@", c) >= 0:
			j := i
			for j < len(expr) && strings.IndexByte("=!~<>", expr[j]) >= 0 && j-i < 2 {
				j++
			}
			if j == i {
				j = i + 1
			}
			toks = append(toks, pqToken{'o', expr[i:j]})
			i = j
		default:
			return nil, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
	return toks, nil
}

var rangeContents = regexp.MustCompile(`^\s*(\$\{?\w+\}?|[0-9]+[smhdwy0-9]*)(\s*:\s*(\$\{?\w+\}?|[0-9]+[smhdwy0-9]*)?)?\s*$`)

// PromQL words that are not metric names.
var (
	pqAggregators = setOf("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar",
		"topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio")
	pqFunctions = setOf("rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
		"histogram_quantile", "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max",
		"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
		"last_over_time", "quantile_over_time", "stddev_over_time", "present_over_time",
		"absent", "absent_over_time", "time", "timestamp", "vector", "scalar", "sort", "sort_desc",
		"predict_linear", "exp", "ln", "log2", "log10", "sqrt",
		// Grafana's template-variable query function.
		"label_values")
	pqLabelListWords = setOf("by", "without", "on", "ignoring", "group_left", "group_right")
	pqWords          = setOf("and", "or", "unless", "offset", "bool", "inf", "nan")
)

func setOf(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

// pqAnalysis is what checkPromQL found in an expression.
type pqAnalysis struct {
	metrics []pqMetric
	// kept are the labels an aggregation or a join can pass to the
	// result: those of by (...) and group_left/right (...), and those a
	// without (...) leaves of the series it aggregates.
	kept []string
	// aggregated are the token ranges (open, close) of every
	// aggregation's argument: a series inside one reaches the result only
	// through its by or without.
	aggregated [][2]int
}

type pqMetric struct {
	name string
	pos  int // token index
}

// mayCarry reports whether the result of the expression can carry label
// l: a series outside every aggregation has it, or an aggregation or a
// join keeps it. It is a necessary condition, not a type check.
func (a pqAnalysis) mayCarry(l string, series map[string][]string) bool {
	if slices.Contains(a.kept, l) {
		return true
	}
	for _, m := range a.metrics {
		inside := slices.ContainsFunc(a.aggregated, func(r [2]int) bool { return m.pos > r[0] && m.pos < r[1] })
		if !inside && slices.Contains(series[m.name], l) {
			return true
		}
	}
	return false
}

// checkPromQL tokenizes expr and reports, as test errors, every
// identifier in a metric's place that is not an exported series, and every
// label that does not exist where it is used: in a selector's matchers, on
// the selected series; in by (...), on every series the aggregation
// covers; in without, on, ignoring and group_left/right, on some series of
// the expression. Grafana's label_values(selector, label) is checked the
// same way.
func checkPromQL(t reporter, where, expr string, series map[string][]string) pqAnalysis {
	t.Helper()
	var a pqAnalysis
	if strings.TrimSpace(expr) == "" {
		t.Errorf("%s: empty expression", where)
		return a
	}
	toks, err := promqlTokens(expr)
	if err != nil {
		t.Errorf("%s: %v in %q", where, err, expr)
		return a
	}
	// Matching parentheses, for the scope of aggregations.
	match := map[int]int{}
	var stack []int
	for i, tk := range toks {
		switch tk.kind {
		case '(':
			stack = append(stack, i)
		case ')':
			if len(stack) == 0 {
				t.Errorf("%s: unbalanced ) in %q", where, expr)
				return a
			}
			o := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			match[o], match[i] = i, o
		}
	}
	if len(stack) != 0 {
		t.Errorf("%s: unbalanced ( in %q", where, expr)
		return a
	}
	hasLabel := func(metric, l string) bool {
		return l == "__name__" || slices.Contains(series[metric], l)
	}
	metricsIn := func(from, to int) []pqMetric {
		var ms []pqMetric
		for _, m := range a.metrics {
			if m.pos > from && m.pos < to {
				ms = append(ms, m)
			}
		}
		return ms
	}
	// labelList reads the identifiers of a ( ... ) list starting at open
	// and returns them with the index of the closing parenthesis.
	labelList := func(open int) ([]string, int) {
		if open >= len(toks) || toks[open].kind != '(' {
			t.Errorf("%s: label list expected at token %d of %q", where, open, expr)
			return nil, open
		}
		var ls []string
		for _, tk := range toks[open+1 : match[open]] {
			if tk.kind == 'i' {
				ls = append(ls, tk.text)
			} else if tk.kind != ',' {
				t.Errorf("%s: unexpected %q in a label list of %q", where, tk.text, expr)
			}
		}
		return ls, match[open]
	}

	// First pass: classify identifiers; collect metrics and check their
	// matchers. Label lists are skipped here and checked below.
	type clause struct {
		word   string
		labels []string
		at     int // token index of the word
		end    int // closing parenthesis of the list
	}
	var clauses []clause
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		if tk.kind != 'i' {
			continue
		}
		w := tk.text
		switch {
		case pqLabelListWords[w]:
			if (w == "group_left" || w == "group_right") && (i+1 >= len(toks) || toks[i+1].kind != '(') {
				continue // no label list
			}
			ls, end := labelList(i + 1)
			clauses = append(clauses, clause{w, ls, i, end})
			i = end
		case pqWords[w]:
		case pqAggregators[w] || pqFunctions[w]:
			if pqAggregators[w] {
				// sum (...), or sum by|without (...) (...)
				open := i + 1
				if open+1 < len(toks) && toks[open].kind == 'i' && (toks[open].text == "by" || toks[open].text == "without") && toks[open+1].kind == '(' {
					open = match[open+1] + 1
				}
				if open < len(toks) && toks[open].kind == '(' {
					a.aggregated = append(a.aggregated, [2]int{open, match[open]})
				} else {
					t.Errorf("%s: aggregation %s without an argument in %q", where, w, expr)
				}
			}
			if w == "label_values" {
				// label_values(selector, label): the label is the last
				// identifier of the call.
				end := match[i+1]
				if end-1 > i+1 && toks[end-1].kind == 'i' {
					clauses = append(clauses, clause{"label_values", []string{toks[end-1].text}, i, end})
				}
			}
		case i+1 < len(toks) && toks[i+1].kind == '(':
			t.Errorf("%s: unknown function %s in %q", where, w, expr)
		case clauseLabel(toks, i):
			// a label in label_values' last argument; checked with it
		default:
			if !strings.HasPrefix(w, metricPrefix) {
				t.Errorf("%s: %s is not a metric of this plugin (%s*) in %q", where, w, metricPrefix, expr)
				continue
			}
			if _, ok := series[w]; !ok {
				t.Errorf("%s: metric %s is not exported (MetricNames, histograms as _bucket/_sum/_count) in %q", where, w, expr)
				continue
			}
			a.metrics = append(a.metrics, pqMetric{w, i})
			if i+1 < len(toks) && toks[i+1].kind == '{' {
				j := i + 2
				for ; j < len(toks) && toks[j].kind != '}'; j++ {
					if toks[j].kind == 'i' && j+1 < len(toks) && toks[j+1].kind == 'o' {
						if !hasLabel(w, toks[j].text) {
							t.Errorf("%s: %s has no label %s (labels %v) in %q", where, w, toks[j].text, series[w], expr)
						}
					}
				}
				i = j // past the matchers
			}
		}
	}

	// Second pass: label lists.
	for _, c := range clauses {
		switch c.word {
		case "by", "without":
			var scope []pqMetric
			switch {
			case c.at > 0 && toks[c.at-1].kind == 'i' && pqAggregators[toks[c.at-1].text]:
				// sum by (l) (expr)
				open := c.end + 1
				if open >= len(toks) || toks[open].kind != '(' {
					continue // reported with the aggregation
				}
				scope = metricsIn(open, match[open])
			case c.at > 0 && toks[c.at-1].kind == ')':
				// sum (expr) by (l)
				scope = metricsIn(match[c.at-1], c.at-1)
			default:
				t.Errorf("%s: %s clause not attached to an aggregation in %q", where, c.word, expr)
				continue
			}
			if c.word == "by" {
				a.kept = append(a.kept, c.labels...)
				for _, l := range c.labels {
					for _, m := range scope {
						if !hasLabel(m.name, l) {
							t.Errorf("%s: aggregates by %s, which %s lacks (labels %v), in %q", where, l, m.name, series[m.name], expr)
						}
					}
				}
				continue
			}
			for _, l := range c.labels {
				if !slices.ContainsFunc(scope, func(m pqMetric) bool { return hasLabel(m.name, l) }) {
					t.Errorf("%s: without (%s) drops a label no aggregated series has, in %q", where, l, expr)
				}
			}
			for _, m := range scope {
				for _, l := range series[m.name] {
					if !slices.Contains(c.labels, l) {
						a.kept = append(a.kept, l)
					}
				}
			}
		default:
			if c.word == "group_left" || c.word == "group_right" {
				a.kept = append(a.kept, c.labels...)
			}
			for _, l := range c.labels {
				if !slices.ContainsFunc(a.metrics, func(m pqMetric) bool { return hasLabel(m.name, l) }) {
					t.Errorf("%s: %s (%s) names a label no series of the expression has, in %q", where, c.word, l, expr)
				}
			}
		}
	}
	if len(a.metrics) == 0 {
		t.Errorf("%s: selects no metric of this plugin: %q", where, expr)
	}
	return a
}

// clauseLabel reports whether identifier i is the label argument of
// label_values(selector, label).
func clauseLabel(toks []pqToken, i int) bool {
	return i >= 1 && toks[i-1].kind == ',' && i+1 < len(toks) && toks[i+1].kind == ')' &&
		slices.ContainsFunc(toks[:i], func(tk pqToken) bool { return tk.kind == 'i' && tk.text == "label_values" })
}

// reporter is the part of testing.T checkPromQL reports through, so a
// test of the checker can record what it reports.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// recorder is a reporter that keeps the reports.
type recorder struct{ msgs []string }

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// TestGrafanaPromQLChecker shows the checker catches what it is for, on
// expressions known to be wrong, and accepts the forms the files use.
func TestGrafanaPromQLChecker(t *testing.T) {
	series := exportedSeries(t)
	bad := map[string]string{
		"unknown metric":             `rate(caddy_fair_queue_requests_totl[5m])`,
		"foreign metric":             `rate(http_requests_total[5m])`,
		"bare histogram name":        `rate(caddy_fair_queue_wait_seconds[5m])`,
		"matcher on a missing label": `caddy_fair_queue_capacity{tenant="a"}`,
		"by a missing label":         `sum by (outcome) (caddy_fair_queue_queue_depth)`,
		"le on a non-bucket series":  `histogram_quantile(0.5, sum by (le) (rate(caddy_fair_queue_wait_seconds_sum[5m])))`,
		"postfix by":                 `sum(caddy_fair_queue_water_level) by (tenant)`,
		"on a missing label":         `caddy_fair_queue_capacity / on (step) caddy_fair_queue_water_level`,
		"label_values missing label": `label_values(caddy_fair_queue_capacity, tenant)`,
		"unknown function":           `rat(caddy_fair_queue_requests_total[5m])`,
		"unbalanced":                 `sum(rate(caddy_fair_queue_requests_total[5m])`,
		"bad range":                  `rate(caddy_fair_queue_requests_total[five])`,
		"no metric":                  `vector(1)`,
	}
	for name, expr := range bad {
		rec := &recorder{}
		checkPromQL(rec, name, expr, series)
		if len(rec.msgs) == 0 {
			t.Errorf("%s: checker accepted %q", name, expr)
		}
	}
	good := []string{
		`histogram_quantile(0.95, sum by (queue, tenant, le) (rate(caddy_fair_queue_wait_seconds_bucket{queue=~"$queue"}[$__rate_interval])))`,
		`sum(rate(caddy_fair_queue_requests_total{outcome!="served"}[5m])) by (tenant, outcome)`,
		`caddy_fair_queue_tenant_weight / on (queue) group_left sum by (queue) (caddy_fair_queue_tenant_weight)`,
		`label_values(caddy_fair_queue_requests_total{queue=~"$queue"}, tenant)`,
		`max_over_time(caddy_fair_queue_healthy_upstreams[1h:1m]) # comment`,
	}
	for _, expr := range good {
		rec := &recorder{}
		checkPromQL(rec, "good", expr, series)
		if len(rec.msgs) != 0 {
			t.Errorf("checker rejected %q: %s", expr, rec.msgs)
		}
	}
	carry := []struct {
		expr, label string
		want        bool
	}{
		{`caddy_fair_queue_inflight`, "tenant", true},
		{`sum by (queue) (caddy_fair_queue_inflight)`, "queue", true},
		{`sum by (queue) (caddy_fair_queue_inflight)`, "tenant", false},
		{`sum(caddy_fair_queue_inflight)`, "queue", false},
		{`sum without (tenant) (caddy_fair_queue_inflight)`, "queue", true},
		{`sum without (tenant) (caddy_fair_queue_inflight)`, "tenant", false},
		{`caddy_fair_queue_tenant_weight / on (queue) group_left sum by (queue) (caddy_fair_queue_tenant_weight)`, "tenant", true},
		{`sum by (queue, tenant) (rate(caddy_fair_queue_requests_total[5m])) > 0 and on (queue) caddy_fair_queue_degrade_level > 0`, "tenant", true},
		{`caddy_fair_queue_capacity`, "tenant", false},
	}
	for _, c := range carry {
		rec := &recorder{}
		a := checkPromQL(rec, "carry", c.expr, series)
		if len(rec.msgs) != 0 {
			t.Errorf("checker rejected %q: %s", c.expr, rec.msgs)
		}
		if got := a.mayCarry(c.label, series); got != c.want {
			t.Errorf("mayCarry(%s) of %q = %v, want %v", c.label, c.expr, got, c.want)
		}
	}
}
