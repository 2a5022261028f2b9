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
// Forgetting counts requests, not seconds: an idle gateway keeps its fit,
// a busy one adapts as fast as evidence arrives.
//
// # Algorithm
//
// Exponentially weighted least squares: observation i of n weighs
// λ^(n-i), λ = 1 - 1/Memory (default 500); Fit.Effective = (Σw)²/Σw².
//
// Observe keeps sufficient statistics only: the total weight W, the
// weighted means of p, q and busy, and the six co-moments about them,
// updated by West's (1979) weighted Welford recurrence with forgetting:
//
//	W ← λ·W + 1;  d = x - mean;  mean ← mean + d/W;  C ← λ·C + (1 - 1/W)·d·d'
//
// O(1), no allocation, and stable: raw sums of squares would cancel
// catastrophically when sizes are large and vary little.
//
// Fit solves in O(1). Centering separates the intercept; the slopes solve
//
//	[C_pp C_pq] [b]   [C_py]
//	[C_pq C_qq] [c] = [C_qy],    a = mean_y - b·mean_p - c·mean_q
//
// scaled to unit diagonal, so the condition number is (1+|r|)/(1-|r|),
// r the correlation of prompt and completion sizes, whatever the units.
// The collinearity guard bounds it, so the 2x2 normal equations lose at
// most 3 of float64's 16 digits, far below the statistical noise.
//
// The fit is non-negative least squares (busy time does not shrink with
// tokens): Fit tries the unconstrained solution and, if a coefficient is
// negative, every subset of free coefficients (without the intercept using
// the raw moments C + W·mean·mean'), keeping the non-negative candidate
// with the least residual sum of squares. Fit.Clamped lists those held at
// zero. R² is 1 - RSS/TSS with the same weights.
//
// # Guards and guarantees
//
// Fit is Ready only when every coefficient is identifiable; otherwise its
// coefficients are zero and Fit.Status says why:
//
//   - warming_up: fewer than MinSamples (100) observations;
//   - flat_prompt / flat_completion: the sizes' weighted standard deviation
//     is below MinSpread (1%) of their mean, so b or c cannot be told from a;
//   - collinear: the scaled condition number exceeds MaxCondition (1000,
//     |r| > 0.998): only a mix of b and c is known;
//   - no_completion_time: c = 0, so no cost has output-token units.
//
// Observations with negative values, more than MaxTokens (2^24) tokens or
// more than MaxBusy (1 h) are counted in Fit.Rejected and ignored, lest one
// absurd measurement dominate thousands of requests. With inputs so
// bounded, nothing in Observe and Fit is NaN or Inf, whatever the sequence
// (FuzzObserve, TestAdversarialSequences).
//
// Accuracy (TestRecoversAndTracksGroundTruth): with ±5% noise every
// coefficient is within 5% of the truth after 1000 requests and of a new
// truth 2000 requests after it changes. A coefficient whose term is a small
// share of busy time needs more requests or wider size variation.
//
// # Derived weights
//
// Cost = prompt·b/c + completion is the fitted busy time without overhead,
// in completion tokens: as the WFQ cost (cost_model learned) tenants share
// upstream time rather than raw tokens.
//
// TokenToQPSWeight is one token in request-equivalents for the quota's
// joint meter (1 + tokens·weight per request), a request-equivalent being
// the overhead a:
//
//	weight = (b·p̄ + c·q̄) / (a·(p̄ + q̄))
//
// so a request of the mean sizes is charged exactly its fitted busy time in
// units of a. It is 0 (keep the configured weight) unless Ready with a > 0.
package costmodel
