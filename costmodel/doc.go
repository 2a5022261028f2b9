// Package costmodel learns what requests cost an upstream from the
// requests it served: an online fit of
//
//	busy ≈ a + b·prompt + c·completion
//
// where busy is the time a request kept its upstream busy (dispatch to last
// byte), a the per-request overhead and b, c the time of one prompt and one
// completion token. The fit replaces guessed cost weights: the WFQ cost in
// output-token units (Fit.Cost) and the quota's token_to_qps_weight
// (Fit.TokenToQPSWeight).
//
// The package is pure: no project imports, no Caddy, no net/http, no clock.
// Forgetting counts requests, not seconds: an idle gateway keeps its fit.
//
// # Algorithm
//
// Exponentially weighted least squares: observation i of n weighs
// λ^(n-i), λ = 1 - 1/Memory; Fit.Effective = (Σw)²/Σw². Observe keeps
// only the total weight, the weighted means of p, q and busy and their six
// co-moments, updated by West's (1979) weighted Welford recurrence:
//
//	W ← λ·W + 1;  d = x - mean;  mean ← mean + d/W;  C ← λ·C + (1 - 1/W)·d·d'
//
// O(1) and stable, where raw sums of squares would cancel catastrophically.
// Centering separates the intercept; the slopes solve
//
//	[C_pp C_pq] [b]   [C_py]
//	[C_pq C_qq] [c] = [C_qy],    a = mean_y - b·mean_p - c·mean_q
//
// scaled to unit diagonal, so the condition number is (1+|r|)/(1-|r|) for
// r the correlation of prompt and completion sizes, whatever the units.
//
// The fit is non-negative least squares (busy time does not shrink with
// tokens): if a coefficient is negative, Fit tries every subset of free
// coefficients and keeps the non-negative candidate with the least
// residual; Fit.Clamped lists those held at zero.
//
// # Guards
//
// Fit is Ready only when every coefficient is identifiable; otherwise its
// coefficients are zero and Fit.Status says why (warming_up, flat_prompt,
// flat_completion, collinear, no_completion_time). Observations out of
// range (Config.MaxTokens, MaxBusy) are counted in Fit.Rejected and
// ignored, lest one absurd measurement dominate; with inputs so bounded,
// nothing in Observe and Fit is NaN or Inf.
//
// # Derived weights
//
// Cost = prompt·b/c + completion is the fitted busy time without overhead,
// in completion tokens. TokenToQPSWeight is one token in request-equivalents
// for the quota's joint meter, a request-equivalent being the overhead a:
//
//	weight = (b·p̄ + c·q̄) / (a·(p̄ + q̄))
//
// so a request of the mean sizes is charged exactly its fitted busy time.
package costmodel
