package llmapi

// Cost is a request's estimated token cost.
type Cost struct {
	Prompt int
	Output int
}

// Total is the cost the scheduler charges: prompt plus output tokens.
func (c Cost) Total() int { return c.Prompt + c.Output }

// Estimate returns req's cost: its prompt counted with c (a nil c counts
// approximately), and its output cap, or defaultMaxTokens when the client
// set none, since a request without a cap may generate up to the server's
// limit. Embeddings produce no output, and a body-less request (a model
// list, a health check) costs nothing: callers that charge a minimum apply
// it themselves.
//
// Counting is bounded by c's exact budget (see WithExactBudget), so the
// work per request is bounded however long the prompt.
func Estimate(req *Request, c Counter, defaultMaxTokens int) Cost {
	if req == nil || req.noBody {
		return Cost{}
	}
	if c == nil {
		c = approxCounter{}
	}
	p := req.TokenIDs + req.Images*ImageTokens + req.Names + req.Messages*MessageOverhead
	if req.Messages > 0 {
		p += ReplyPriming
	}
	if len(req.Texts) > 0 {
		p += countTexts(c, req.Texts)
	}
	out := req.MaxOutput
	if out <= 0 {
		out = max(defaultMaxTokens, 0)
	}
	if req.Kind == KindEmbeddings {
		out = 0
	}
	return Cost{Prompt: p, Output: out}
}
