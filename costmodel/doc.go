// Package costmodel learns what requests cost an upstream from the
// requests it served: an online fit of
//
//	busy ≈ a + b·prompt + c·completion
//
// where busy is the time a request kept its upstream busy (dispatch to last
// byte), prompt and completion its token counts, a the per-request overhead
// and b, c the time of one prompt token and one completion token. The fit
// replaces guessed cost weights: the WFQ cost in output-token units
// (Fit.Cost), and the quota's token_to_qps_weight (Fit.TokenToQPSWeight).
//
// The package is pure: it imports nothing of the project, no Caddy and no
// net/http, and reads no clock. Forgetting counts requests, not seconds,
// so it needs no time: an idle gateway keeps its fit overnight, and a busy
// one adapts as fast as evidence arrives.
//
// # Algorithm
//
// Exponentially weighted least squares. Observation i of n carries weight
// λ^(n-i), λ = 1 - 1/Memory (default Memory 500: an observation's weight
// falls to 1/e after 500 more; about 2·Memory observations' worth of
// evidence, Fit.Effective = (Σw)²/Σw², backs a warm fit). The minimiser of
// Σ w·(busy - a - b·p - c·q)² is the answer.
//
// Observe keeps sufficient statistics only: the total weight W, the
// weighted means of p, q and busy, and the six weighted co-moments about
// those means (C_pp, C_pq, C_qq, C_py, C_qy, C_yy), updated by the
// weighted Welford recurrence of West (1979) with forgetting:
//
//	W ← λ·W + 1;  d = x - mean;  mean ← mean + d/W;  C ← λ·C + (1 - 1/W)·d·d'
//
// That is O(1), a dozen multiplications, no allocation, and numerically
// stable: it never forms raw sums of squares, whose difference (the
// variance) cancels catastrophically when sizes are large and vary little.
//
// Fit solves from the statistics in O(1). Centering separates the
// intercept: the slopes solve the 2x2 system
//
//	[C_pp C_pq] [b]   [C_py]
//	[C_pq C_qq] [c] = [C_qy],    a = mean_y - b·mean_p - c·mean_q
//
// scaled to unit diagonal before solving, so its condition number is
// exactly (1+|r|)/(1-|r|), r the weighted correlation of prompt and
// completion sizes, whatever the units (seconds against tokens differ by
// 10^4 to 10^8). Raw normal equations with a column of ones have a
// condition number that grows with (mean/spread)² of the sizes; centered
// and scaled, only the genuine collinearity of prompt and completion
// remains, and the guard below bounds it, so forming the 2x2 normal
// equations (which squares the condition number of the data) loses at most
// log10(MaxCondition) = 3 of float64's 16 digits. A QR or square-root
// (Givens) RLS would buy those 3 digits back at several times the cost per
// Observe; statistical noise is many orders of magnitude larger.
//
// Non-negative coefficients. Busy time does not shrink with tokens, and a
// negative overhead would make costs nonsense, so the fit is non-negative
// least squares. With three unknowns it is exact and cheap: the NNLS
// optimum is the least-squares solution restricted to the coefficients it
// leaves positive, so Fit tries the unconstrained solution and, if any
// coefficient is negative, all subsets of free coefficients (the others at
// zero; without the intercept the system uses the raw second moments
// C + W·mean·mean'), keeping the non-negative candidate with the least
// residual sum of squares (computed from the same centered statistics).
// Fit.Clamped lists the coefficients held at zero.
//
// R² is 1 - RSS/TSS with the same weights, TSS = C_yy.
//
// # Guards and guarantees
//
// Fit is Ready only when every coefficient is identifiable from the data;
// otherwise its coefficients are zero and Fit.Status says why:
//
//   - warming_up: fewer than MinSamples (100) observations;
//   - flat_prompt / flat_completion: the weighted standard deviation of
//     prompt (completion) sizes is below MinSpread (1%) of their mean;
//     with every prompt the same size, b·prompt is a constant that no data
//     can tell apart from a;
//   - collinear: prompt and completion sizes are so correlated that the
//     scaled system's condition number exceeds MaxCondition (1000,
//     |r| > 0.998): only a mix of b and c is known;
//   - no_completion_time: the non-negative fit gives completion tokens no
//     time (c = 0: busy time flat or zero), so no cost can be expressed in
//     output-token units.
//
// Observations with negative values, more than MaxTokens (2^24) tokens or
// more than MaxBusy (1 h) of busy time are counted in Fit.Rejected and
// otherwise ignored: one absurd measurement would otherwise dominate the
// fit for thousands of requests. With inputs so bounded, every quantity in
// Observe and Fit is finite, and Fit, Cost, BusyCost, Predict,
// PromptCostRatio and the weights never return NaN or Inf, whatever the
// sequence of observations (FuzzObserve, TestAdversarialSequences).
//
// Accuracy (TestRecoversAndTracksGroundTruth, 20 seeds): with busy =
// 0.5 s + 0.1 ms·prompt + 4 ms·completion, prompts uniform in [100, 8000],
// completions in [10, 400] and multiplicative noise uniform in ±5%, every
// coefficient is within 5% of the truth after 1000 requests (worst 2.3%)
// and within 5% of the new truth 2000 requests after c doubles (worst
// 3.7%). The error scales with the noise of busy times relative to each
// coefficient's share of them: with ±10% noise the overhead's worst error
// over 300 seeds reached 5.5% after 1000 requests, and a coefficient whose
// term is a small share of busy time (prompt time beside long generations)
// needs more requests or wider size variation to be pinned down.
//
// # Derived weights
//
// Cost(prompt, completion) = prompt·b/c + completion is a request's
// fitted busy time without its overhead, in units of one completion token:
// charged as the WFQ cost (cost_model learned), it makes tenants share
// upstream time rather than raw tokens. BusyCost adds the overhead,
// a/c: the whole fitted busy time in output-token units, for shares of
// busy time that count each request's fixed cost too.
//
// TokenToQPSWeight is the weight of one token in request-equivalents for
// the quota's joint meter, which charges 1 + tokens·weight per request: a
// request-equivalent is the busy time of a request with no tokens, a, and
// one token is the mean token of the observed mix, (b·p̄ + c·q̄)/(p̄ + q̄),
// so
//
//	weight = (b·p̄ + c·q̄) / (a·(p̄ + q̄))
//
// and a request of the mean sizes is charged 1 + (p̄+q̄)·weight =
// (a + b·p̄ + c·q̄)/a, exactly its fitted busy time in units of a. Seed
// 004's guessed 0.0008 says 1250 tokens weigh one request. PromptWeight
// and CompletionWeight are b/a and c/a, the two kinds of token separately.
// All three are 0 (keep the configured weight) unless the fit is Ready
// with a > 0.
package costmodel
