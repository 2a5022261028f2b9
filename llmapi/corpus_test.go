package llmapi

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// corpusPrompt is one request of the estimator's accuracy corpus: its
// body, and the texts it carries (for tests of the counter alone).
type corpusPrompt struct {
	name  string
	kind  string
	size  int
	body  []byte
	texts []string
}

// corpusKinds are the prompt shapes a gateway meets: chat in English, a
// Chinese document, code under review, an agent loop with tool schemas and
// tool results, and retrieval over mixed sources.
var corpusKinds = []string{"english_chat", "chinese_doc", "code_review", "agent_tools", "rag_mixed"}

// corpusSizes are the prompt sizes, in bytes of body: below, at and far
// beyond the estimator's exact budget.
var corpusSizes = []int{2 << 10, 8 << 10, 32 << 10, 128 << 10, 400 << 10}

const corpusVariants = 3

var corpusOnce struct {
	sync.Once
	prompts []corpusPrompt
	err     error
}

// promptCorpus composes the corpus from testdata/corpus (see its README),
// the same prompts on every run.
func promptCorpus(tb testing.TB) []corpusPrompt {
	tb.Helper()
	corpusOnce.Do(func() { corpusOnce.prompts, corpusOnce.err = buildCorpus() })
	if corpusOnce.err != nil {
		tb.Fatal(corpusOnce.err)
	}
	return corpusOnce.prompts
}

type corpusMaterial struct {
	en, zh, code []string // paragraphs, and code in chunks of lines
	results      []string // tool results, each a JSON document
	tools        json.RawMessage
}

func readCorpusMaterial() (*corpusMaterial, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		return string(b), err
	}
	var m corpusMaterial
	en, zh := testdataText()
	m.en, m.zh = paragraphs(en), paragraphs(zh)
	for _, f := range []string{"code_go.txt", "code_py.txt", "code_sh.txt"} {
		src, err := read(filepath.Join("corpus", f))
		if err != nil {
			return nil, err
		}
		lines := strings.Split(src, "\n")
		for i := 0; i < len(lines); i += 40 {
			m.code = append(m.code, strings.Join(lines[i:min(i+40, len(lines))], "\n"))
		}
	}
	res, err := read("corpus/results.jsonl")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(res, "\n") {
		if l != "" {
			m.results = append(m.results, l)
		}
	}
	tools, err := read("corpus/tools.json")
	if err != nil {
		return nil, err
	}
	m.tools = json.RawMessage(tools)
	return &m, nil
}

func paragraphs(s string) []string {
	var out []string
	for _, p := range strings.Split(s, "\n\n") {
		if strings.TrimSpace(p) != "" {
			out = append(out, p)
		}
	}
	return out
}

func buildCorpus() ([]corpusPrompt, error) {
	m, err := readCorpusMaterial()
	if err != nil {
		return nil, err
	}
	var out []corpusPrompt
	for ki, kind := range corpusKinds {
		for si, size := range corpusSizes {
			for v := range corpusVariants {
				rng := rand.New(rand.NewPCG(uint64(ki), uint64(si*corpusVariants+v)))
				p, err := m.compose(kind, size, rng)
				if err != nil {
					return nil, err
				}
				p.name = fmt.Sprintf("%s/%dKB/%d", kind, size>>10, v)
				out = append(out, p)
			}
		}
	}
	return out, nil
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    *string         `json:"content"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// compose builds one prompt of about size bytes.
func (m *corpusMaterial) compose(kind string, size int, rng *rand.Rand) (corpusPrompt, error) {
	p := corpusPrompt{kind: kind, size: size}
	pick := func(from []string) string { return from[rng.IntN(len(from))] }
	var msgs []chatMessage
	used := 0
	add := func(role, text string) {
		msgs = append(msgs, chatMessage{Role: role, Content: &text})
		p.texts = append(p.texts, text)
		used += len(text) + 40
	}
	// fill appends paragraphs from next to one message until it holds
	// about n bytes.
	fill := func(n int, next func() string) string {
		var b strings.Builder
		for b.Len() < n {
			if b.Len() > 0 {
				b.WriteString("\n\n")
			}
			b.WriteString(next())
		}
		s := b.String()
		for len(s) > n && n > 0 && !utf8.RuneStart(s[n]) {
			n++
		}
		return s[:min(len(s), max(n, 1))]
	}
	body := map[string]any{"model": "gpt-4o", "max_tokens": 1024}
	switch kind {
	case "english_chat":
		add("system", pick(m.en))
		for role := "user"; used < size; {
			add(role, fill(min(size-used, 200+rng.IntN(3000)), func() string { return pick(m.en) }))
			role = map[string]string{"user": "assistant", "assistant": "user"}[role]
		}
	case "chinese_doc":
		add("system", "你是一名资深的技术文档编辑。请阅读用户提供的文档，先用三句话总结，再列出其中的风险和待办事项。")
		add("user", "请处理下面这份文档：\n\n"+fill(size-used, func() string { return pick(m.zh) }))
	case "code_review":
		add("system", "You are a senior engineer reviewing a pull request. Point out bugs, races and unclear names; quote the lines you mean.")
		for used < size {
			add("user", "Please review this change:\n\n```\n"+fill(min(size-used, 1000+rng.IntN(6000)), func() string { return pick(m.code) })+"\n```")
			if used < size {
				add("assistant", pick(m.en))
			}
		}
	case "agent_tools":
		body["tools"] = m.tools
		used += len(m.tools)
		add("system", "You are the support agent of an online shop. Use the tools to look things up; never guess an order's state.")
		add("user", pick(m.en))
		for call := 0; used < size; call++ {
			id := fmt.Sprintf("call_%d", call)
			calls, _ := json.Marshal([]map[string]any{{"id": id, "type": "function",
				"function": map[string]string{"name": "search_knowledge_base", "arguments": `{"query":"refund policy","top_k":5}`}}})
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: calls})
			res := pick(m.results)
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: id, Content: &res})
			p.texts = append(p.texts, res)
			used += len(res) + 200
		}
		add("user", "Thanks. What should I tell the customer?")
	case "rag_mixed":
		add("system", "Answer from the retrieved passages only, citing each by its number. 如果资料中没有答案，请直说。")
		sources := [][]string{m.en, m.zh, m.code, m.results}
		n := 0
		add("user", "Question: how does the gateway keep one tenant's batch from starving the others?\n\nRetrieved passages:\n\n"+
			fill(size-used, func() string {
				n++
				return fmt.Sprintf("[%d] %s", n, pick(sources[rng.IntN(len(sources))]))
			}))
	default:
		return p, fmt.Errorf("unknown corpus kind %q", kind)
	}
	body["messages"] = msgs
	b, err := json.Marshal(body)
	p.body = b
	return p, err
}

// TestPromptCorpus: the corpus has every kind at every size, and each
// prompt parses with the texts it was made of.
func TestPromptCorpus(t *testing.T) {
	prompts := promptCorpus(t)
	if want := len(corpusKinds) * len(corpusSizes) * corpusVariants; len(prompts) != want {
		t.Fatalf("%d prompts, want %d", len(prompts), want)
	}
	for _, p := range prompts {
		if len(p.body) < p.size*9/10 || len(p.body) > p.size*13/10+8<<10 { // the tools alone are 7 KB
			t.Errorf("%s: %d bytes, want about %d", p.name, len(p.body), p.size)
		}
		req, err := Parse("/v1/chat/completions", p.body)
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		if req.Messages != len(p.texts)+strings.Count(string(p.body), `"role":"assistant","content":null`) {
			t.Errorf("%s: %d messages parsed, %d texts", p.name, req.Messages, len(p.texts))
		}
	}
}
