package harness

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Series maps each scraped series, written as in the Prometheus text format
// with labels sorted by name (`name{a="1",b="2"}`, or just `name`), to its
// value. Histograms and summaries appear as their _bucket/_sum/_count and
// quantile series.
type Series map[string]float64

// Metrics scrapes a Prometheus text endpoint (Caddy serves one at the admin
// endpoint's /metrics) and returns every series.
func Metrics(t testing.TB, url string) Series {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Ask for the classic text format, not OpenMetrics or protobuf.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("harness: scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("harness: scraping %s: status %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("harness: parsing %s: %v", url, err)
	}
	return seriesOf(fams)
}

func seriesOf(fams map[string]*dto.MetricFamily) Series {
	s := Series{}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				s[key(name, labels)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s[key(name, labels)] = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				s[key(name, labels)] = m.GetUntyped().GetValue()
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					s[key(name+"_bucket", with(labels, "le", formatFloat(b.GetUpperBound())))] = float64(b.GetCumulativeCount())
				}
				s[key(name+"_bucket", with(labels, "le", "+Inf"))] = float64(h.GetSampleCount())
				s[key(name+"_sum", labels)] = h.GetSampleSum()
				s[key(name+"_count", labels)] = float64(h.GetSampleCount())
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					s[key(name, with(labels, "quantile", formatFloat(q.GetQuantile())))] = q.GetValue()
				}
				s[key(name+"_sum", labels)] = sm.GetSampleSum()
				s[key(name+"_count", labels)] = float64(sm.GetSampleCount())
			}
		}
	}
	return s
}

func with(labels map[string]string, k, v string) map[string]string {
	m := maps.Clone(labels)
	m[k] = v
	return m
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// key writes a series the way Series indexes it.
func key(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%s="%s"`, k, labelEscaper.Replace(labels[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// Key writes the Series key of a series from its name and label pairs, in
// any order: Key("x", "b", "2", "a", "1") is `x{a="1",b="2"}`.
func Key(name string, labelPairs ...string) string {
	return key(name, pairs(labelPairs))
}

// Sum adds up the series of metric name whose labels include every given
// pair (name, value, name, value...), e.g. across all tenants or upstreams;
// with no pairs, every series of the metric. Absent series count as 0, like
// a counter that was never incremented.
func (s Series) Sum(name string, labelPairs ...string) float64 {
	var want []string
	for k, v := range pairs(labelPairs) {
		want = append(want, fmt.Sprintf(`,%s="%s",`, k, labelEscaper.Replace(v)))
	}
	var sum float64
	for k, v := range s {
		n, labels, _ := strings.Cut(k, "{")
		// Between commas, a label is matched whole: a value's quotes are
		// escaped, so `="` never starts inside one.
		labels = "," + strings.TrimSuffix(labels, "}") + ","
		match := n == name
		for _, w := range want {
			match = match && strings.Contains(labels, w)
		}
		if match {
			sum += v
		}
	}
	return sum
}

// Names returns the distinct metric names present, sorted, to help when an
// assertion looks for a series that is not there.
func (s Series) Names() []string {
	set := map[string]bool{}
	for k := range s {
		n, _, _ := strings.Cut(k, "{")
		set[n] = true
	}
	return slices.Sorted(maps.Keys(set))
}

func pairs(kv []string) map[string]string {
	if len(kv)%2 != 0 {
		panic("harness: label pairs must come as name, value")
	}
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}
