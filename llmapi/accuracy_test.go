package llmapi

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

// TestEstimateAccuracy: on the prompt corpus (five kinds of prompt, 2 to
// 400 KB), the estimator's prompt cost is within 3% of the exact count at
// the 95th percentile (exact: tiktoken-go's count), for both encodings; over the prompts too long to
// count exactly within its work, and over all of them. No prompt is off
// by more than 5%.
func TestEstimateAccuracy(t *testing.T) {
	if raceEnabled {
		t.Skip("counts megabytes exactly; runs without the race detector (scripts/test.sh)")
	}
	for _, name := range []string{CL100kBase, O200kBase} {
		est, err := NewEstimator(name)
		if err != nil {
			t.Fatal(err)
		}
		exact := tiktokenCounter{t, name} // the reference itself, not the gateway's BPE
		var all, sampled []float64
		byKind := map[string]float64{}
		for _, p := range promptCorpus(t) {
			req, err := Parse("/v1/chat/completions", p.body)
			if err != nil {
				t.Fatal(err)
			}
			got, want := Estimate(req, est, 0).Prompt, Estimate(req, exact, 0).Prompt
			e := math.Abs(relErr(got, want))
			all = append(all, e)
			if !countsExactly(est.(*sampledCounter), p.texts) {
				sampled = append(sampled, e)
			}
			byKind[p.kind] = max(byKind[p.kind], e)
			if e > 0.05 {
				t.Errorf("%s %s: estimate %d, exact %d: %+.2f%%", name, p.name, got, want, 100*relErr(got, want))
			}
		}
		for what, errs := range map[string][]float64{"all prompts": all, "sampled prompts": sampled} {
			sort.Float64s(errs)
			p95 := errs[int(math.Ceil(0.95*float64(len(errs))))-1]
			t.Logf("%s, %s (%d): p50 %.2f%%, p95 %.2f%%, max %.2f%%", name, what, len(errs), 100*errs[len(errs)/2], 100*p95, 100*errs[len(errs)-1])
			if p95 > 0.03 {
				t.Errorf("%s, %s: p95 relative error %.2f%%, want at most 3%%", name, what, 100*p95)
			}
		}
		for _, k := range corpusKinds {
			t.Logf("%s %-13s max error %.2f%%", name, k, 100*byKind[k])
		}
		if len(sampled) < len(all)/2 {
			t.Errorf("%s: only %d of %d prompts were sampled: the corpus does not test sampling", name, len(sampled), len(all))
		}
	}
}

// countsExactly reports whether s counts texts exactly.
func countsExactly(s *sampledCounter, texts []string) bool {
	rough, work := 0, 0
	for _, t := range texts {
		rough += s.exact.roughTokens(t)
		_, _, w := s.exact.countWork(t, noRank)
		work += w
	}
	return rough/16 <= s.work/8 && work <= s.work
}

// BenchmarkEstimateCorpus is the estimator's cost on the corpus's
// 32 KB and 400 KB prompts, one of each kind: wall and CPU time per
// estimate, allocations, and its error against the exact count.
func BenchmarkEstimateCorpus(b *testing.B) {
	for _, name := range []string{CL100kBase, O200kBase} {
		est, err := NewEstimator(name)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range promptCorpus(b) {
			if p.size != 32<<10 && p.size != 400<<10 || p.name[len(p.name)-1] != '0' {
				continue
			}
			req, err := Parse("/v1/chat/completions", p.body)
			if err != nil {
				b.Fatal(err)
			}
			want := Estimate(req, mustBPE(b, name), 0).Prompt
			b.Run(name+"/"+p.name[:len(p.name)-2], func(b *testing.B) {
				b.SetBytes(int64(len(p.body)))
				b.ReportAllocs()
				var got Cost
				loopCPU(b, func() { got = Estimate(req, est, 0) })
				b.ReportMetric(100*relErr(got.Prompt, want), "error-%")
			})
		}
	}
}

// TestEstimatorWorkIsBounded: however long or odd the prompt (one run of
// a letter, of Chinese without punctuation, of spaces; a million tiny
// messages; random bytes), the estimator does at most twice DefaultWork
// vocabulary lookups and the rest of two pieces, and gives a count within
// 10% of the exact one.
func TestEstimatorWorkIsBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("counts megabytes exactly; runs without the race detector (scripts/test.sh)")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	random := make([]byte, 1<<20)
	for i := range random {
		random[i] = byte(rng.IntN(256))
	}
	en, zh := testdataText()
	cases := map[string][]string{
		"run":       {strings.Repeat("a", 4<<20)},
		"cjk run":   {strings.Repeat("中", 1<<20)},
		"spaces":    {strings.Repeat(" ", 1<<20) + "x"},
		"words":     {strings.Repeat("word ", 800<<10)},
		"tiny":      strings.Split(strings.Repeat("a", 1<<20), ""),
		"random":    {string(random)},
		"long text": {longText(en+"\n\n"+zh, 4<<20)},
	}
	limit := 2 * (DefaultWork + 3*maxPieceBytes) // each phase may finish the piece it is in
	for _, name := range []string{CL100kBase, O200kBase} {
		est, err := NewEstimator(name)
		if err != nil {
			t.Fatal(err)
		}
		s := est.(*sampledCounter)
		for what, texts := range cases {
			n, work := s.count(texts)
			want := countTexts(WithExactBudget(mustCounter(t, name), 0), texts)
			if work > limit || math.Abs(relErr(n, want)) > 0.10 {
				t.Errorf("%s %s: %d tokens (exact %d) after %d lookups, want within 10%% and %d lookups", name, what, n, want, work, limit)
			}
		}
	}
}
