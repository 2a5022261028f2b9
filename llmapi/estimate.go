package llmapi

import "math"

// CostLimit is where token counts saturate (output caps, caps times n,
// countless images, Cost totals) rather than overflow. It is far beyond
// any context window and fits an int on every platform.
const CostLimit = math.MaxInt32

// Cost is a request's estimated token cost. Prompt and Output are at most
// CostLimit each.
type Cost struct {
	Prompt int
	Output int
}

// Total is the cost the scheduler charges: prompt plus output tokens,
// saturating at CostLimit.
func (c Cost) Total() int { return saturate(clamp(c.Prompt) + clamp(c.Output)) }

// clamp returns n within [0, CostLimit], as an int64 that a few sums and
// products of such values cannot overflow.
func clamp(n int) int64 { return int64(min(max(n, 0), CostLimit)) }

func saturate(n int64) int { return int(max(min(n, CostLimit), 0)) }

// Estimate returns req's cost: its prompt counted with c (nil counts
// approximately), and its output cap (defaultMaxTokens when unset) times
// the choices generated (n, best_of). Embeddings produce no output and a
// body-less request costs nothing. Both parts saturate at CostLimit. The
// body req was parsed from must not have changed; counting is bounded by
// c's exact budget (see WithExactBudget).
func Estimate(req *Request, c Counter, defaultMaxTokens int) Cost {
	if req == nil || req.noBody {
		return Cost{}
	}
	if c == nil {
		c = approxCounter{}
	}
	var p int64
	switch {
	case req.walked && req.nTexts <= len(req.texts):
		// The common request: Parse met all of its texts, so there is
		// nothing to walk or pool.
		var strs [inlineTexts]string
		p, _ = promptTokens(req, req.texts[:req.nTexts], c, strs[:0])
	default:
		sc := getScratch()
		var texts []textRef
		if req.allTexts() {
			texts = append(append(sc.texts[:0], req.texts[:]...), req.more...)
			sc.texts = texts
		} else {
			texts = req.gatherTexts(sc, (req.nTexts+maxTexts-1)/maxTexts)
		}
		p, sc.strs = promptTokens(req, texts, c, sc.strs[:0])
		sc.release()
	}
	out := clamp(req.MaxOutput)
	if out == 0 {
		out = clamp(defaultMaxTokens)
	}
	out *= max(clamp(req.Choices), 1)
	if req.Kind == KindEmbeddings {
		out = 0
	}
	return Cost{Prompt: saturate(p), Output: saturate(out)}
}

// promptTokens is the prompt cost of the counts in r and of texts (r's
// texts or a sample of them, then scaled up by bytes). The strings counted
// are appended to strs, and returned for reuse.
func promptTokens(r *Request, texts []textRef, c Counter, strs []string) (int64, []string) {
	p := clamp(r.TokenIDs) + clamp(r.Images)*ImageTokens + clamp(r.Names) + clamp(r.Messages)*MessageOverhead
	if r.Messages > 0 {
		p += ReplyPriming
	}
	if len(texts) == 0 {
		return p, strs
	}
	strs = textStrings(strs, texts)
	n := clamp(countTexts(c, strs))
	if len(texts) < r.nTexts {
		var sampled int64
		for _, t := range texts {
			sampled += int64(len(t.raw))
		}
		n = int64(min(float64(n)*float64(r.textBytes)/float64(max(sampled, 1)), CostLimit))
	}
	return p + n, strs
}
