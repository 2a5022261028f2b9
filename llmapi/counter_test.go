package llmapi

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNewCounter(t *testing.T) {
	for _, name := range CounterNames() {
		c, err := NewCounter(name)
		if err != nil {
			t.Fatalf("NewCounter(%q): %v", name, err)
		}
		if c.Name() != name {
			t.Errorf("Name() = %q, want %q", c.Name(), name)
		}
		if got := c.Count(""); got != 0 {
			t.Errorf("%s: Count(\"\") = %d", name, got)
		}
	}
	_, err := NewCounter("p50k")
	if err == nil || !strings.Contains(err.Error(), "cl100k_base, o200k_base and approx") {
		t.Errorf("unknown tokenizer error = %v", err)
	}
}

func TestCountKnownValues(t *testing.T) {
	tests := []struct {
		counter, text string
		want          int
	}{
		{CL100kBase, "hello world", 2},
		{O200kBase, "hello world", 2},
		{CL100kBase, "tiktoken is great!", 6},
		{CL100kBase, "antidisestablishmentarianism", 6},
		// Special tokens in user text are ordinary text.
		{CL100kBase, "<|endoftext|>", 7},
		// Long runs are cut into 256-byte pieces; "aaaaaaaa" is one token.
		{CL100kBase, strings.Repeat("a", 8192), 1024},
		{Approx, "hello world", 2},
	}
	for _, tt := range tests {
		if got := mustCounter(t, tt.counter).Count(tt.text); got != tt.want {
			t.Errorf("%s.Count(%.20q) = %d, want %d", tt.counter, tt.text, got, tt.want)
		}
	}
}

func relErr(got, want int) float64 { return float64(got-want) / float64(want) }

// The approx heuristic must stay within 20% of cl100k_base on English and
// Chinese prose; it is also checked on the request shapes it will meet.
func TestApproxAccuracy(t *testing.T) {
	exact := WithExactBudget(mustCounter(t, CL100kBase), 0)
	en, zh := testdataText()
	samples := map[string]string{
		"english":       en,
		"chinese":       zh,
		"english long":  longText(en, 200<<10),
		"chinese long":  longText(zh, 200<<10),
		"chat json":     chatToolsBody + anthropicBody + responsesBody,
		"short english": "Please summarise the following meeting notes in three bullet points.",
		"short chinese": "请用三句话总结下面的会议纪要，并列出待办事项。",
	}
	for name, s := range samples {
		e, a := exact.Count(s), approxCounter{}.Count(s)
		t.Logf("%-13s cl100k=%6d approx=%6d error=%+5.1f%%", name, e, a, 100*relErr(a, e))
		if math.Abs(relErr(a, e)) > 0.20 {
			t.Errorf("%s: approx=%d, cl100k=%d: error %.1f%% exceeds 20%%", name, a, e, 100*relErr(a, e))
		}
	}
}

// TestBoundedAccuracy measures the error of counting DefaultExactBytes in
// windows and extrapolating, against exact counts of long texts. Asserted
// tolerance: 3% (the largest error measured was about 2%).
func TestBoundedAccuracy(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("counts megabytes exactly")
	}
	en, zh := testdataText()
	enLong, zhLong := longText(en, 400<<10), longText(zh, 400<<10)
	var many []string
	for i, p := range strings.Split(longText(en+"\n\n"+zh, 300<<10), "\n\n") {
		if p != "" && i%3 != 0 {
			many = append(many, p)
		}
	}
	cases := []struct {
		name  string
		texts []string
		tol   float64
	}{
		{"english 400KiB", []string{enLong}, 0.03},
		{"chinese 400KiB", []string{zhLong}, 0.03},
		// A prefix-only count would miss by ~2x here.
		{"english then chinese", []string{enLong[:200<<10] + zhLong[:200<<10]}, 0.03},
		{"system prompt + document", []string{en[:4000], zhLong, enLong[:100<<10]}, 0.03},
		{"many paragraphs", many, 0.03},
	}
	for _, name := range []string{CL100kBase, O200kBase} {
		bounded := mustCounter(t, name)
		exact := WithExactBudget(bounded, 0)
		for _, tc := range cases {
			var want int
			for _, s := range tc.texts {
				want += exact.Count(s)
			}
			start := time.Now()
			got := countTexts(bounded, tc.texts)
			took := time.Since(start)
			prefix := countTexts(WithExactBudget(bounded, 0), []string{joinPrefix(tc.texts, DefaultExactBytes)})
			prefixEst := int(float64(prefix) * float64(totalLen(tc.texts)) / float64(min(totalLen(tc.texts), DefaultExactBytes)))
			t.Logf("%s %-25s exact=%7d sampled=%7d error=%+5.2f%% (prefix-only %+6.1f%%) in %v",
				name, tc.name, want, got, 100*relErr(got, want), 100*relErr(prefixEst, want), took.Round(time.Millisecond))
			if math.Abs(relErr(got, want)) > tc.tol {
				t.Errorf("%s %s: sampled %d vs exact %d: error %.2f%% exceeds %.0f%%", name, tc.name, got, want, 100*relErr(got, want), 100*tc.tol)
			}
		}
	}
}

func totalLen(texts []string) int {
	n := 0
	for _, s := range texts {
		n += len(s)
	}
	return n
}

func joinPrefix(texts []string, n int) string {
	s := strings.Join(texts, "")
	return s[:alignForward(s, min(n, len(s)), 256)]
}

func TestBoundedIsBounded(t *testing.T) {
	c := mustCounter(t, CL100kBase).(*boundedCounter)
	// 4 MiB of worst-case input: one long run, then text without spaces.
	// The work is counted, not timed: the bytes the exact tokenizer is
	// given stay within the budget (plus one window's alignment).
	for name, s := range map[string]string{
		"run":   strings.Repeat("a", 4<<20),
		"words": strings.Repeat("word ", 800<<10),
		"cjk":   strings.Repeat("中", 1<<20),
	} {
		work := &workCounter{inner: c.inner}
		b := &boundedCounter{inner: work, exactBytes: c.exactBytes}
		n := b.Count(s)
		t.Logf("%s: %d bytes -> %d tokens, %d bytes in %d calls counted exactly", name, len(s), n, work.bytes, work.calls)
		if n <= 0 {
			t.Errorf("%s: count %d", name, n)
		}
		if limit := c.exactBytes + sampleWindow; work.bytes > limit {
			t.Errorf("%s: the exact tokenizer was given %d bytes, more than the budget's %d", name, work.bytes, limit)
		}
	}
}

// workCounter counts what its inner counter is given.
type workCounter struct {
	inner        Counter
	bytes, calls int
}

func (w *workCounter) Name() string { return w.inner.Name() }
func (w *workCounter) Count(text string) int {
	w.bytes += len(text)
	w.calls++
	return w.inner.Count(text)
}

func TestWithExactBudget(t *testing.T) {
	c := mustCounter(t, CL100kBase)
	if _, ok := c.(*boundedCounter); !ok {
		t.Fatalf("NewCounter(cl100k_base) is %T, want bounded", c)
	}
	if u := WithExactBudget(c, 0); u.Name() != CL100kBase {
		t.Error("unbounded name")
	} else if _, ok := u.(*boundedCounter); ok {
		t.Error("WithExactBudget(c, 0) is still bounded")
	}
	b := WithExactBudget(c, 1024).(*boundedCounter)
	if b.exactBytes != 1024 {
		t.Errorf("exactBytes = %d", b.exactBytes)
	}
	if _, ok := b.inner.(*boundedCounter); ok {
		t.Error("bounded counter wraps a bounded counter")
	}
	// A small budget still samples sensibly.
	en, _ := testdataText()
	if got, want := b.Count(en), WithExactBudget(c, 0).Count(en); math.Abs(relErr(got, want)) > 0.10 {
		t.Errorf("1 KiB budget: %d vs %d", got, want)
	}
}

func TestCounterConcurrent(t *testing.T) {
	en, zh := testdataText()
	want := map[string]int{}
	counters := map[string]Counter{}
	for _, name := range CounterNames() {
		counters[name] = mustCounter(t, name)
		want[name] = counters[name].Count(en) + counters[name].Count(zh)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := range 8 {
		for name, c := range counters {
			wg.Go(func() {
				if got := c.Count(en) + c.Count(zh); got != want[name] {
					errs <- fmt.Sprintf("goroutine %d %s: %d != %d", i, name, got, want[name])
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestAlignForward(t *testing.T) {
	s := "hello, world and 中文，文本"
	for i := 0; i <= len(s); i++ {
		j := alignForward(s, i, 256)
		if j < i || j > len(s) || j < len(s) && j > 0 && !isRuneStart(s, j) {
			t.Fatalf("alignForward(%d) = %d", i, j)
		}
	}
	if got := alignForward(s, 1, 256); got != 5 {
		t.Errorf("alignForward(1) = %d, want 5 (before the comma)", got)
	}
}

func isRuneStart(s string, i int) bool { return s[i]&0xC0 != 0x80 }

// CounterNames lists the names NewCounter accepts.
func CounterNames() []string { return []string{CL100kBase, O200kBase, Approx} }
