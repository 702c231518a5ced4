// Teacher-forced scoring of held-out token windows: the core of `moetier eval`
// (docs/eval.md).
//
// Windows: the ids are cut into non-overlapping windows of `length` tokens
// from id 0 (window w is ids[w*length, (w+1)*length)); a trailing partial
// window is dropped. Each window runs on its own from position 0 with a fresh
// KV cache, and is scored on its length - 1 next-token predictions: the
// logits at position t predict ids[t+1]. This is the rule of
// scripts/train_model.py's float32 reference (models/moetier-tiny/
// reference_eval.json).
//
// Per prediction: NLL = logsumexp(logits) - logits[target] (computed in
// double from the f32 logits), and it is correct when the target is the
// argmax (the first maximum, as torch.argmax).
//
// Standard errors treat windows as the independent units (tokens within a
// window are correlated): for a ratio mean m = sum(y_w) / sum(n_w),
// SE^2 = W / (W - 1) * sum((y_w - m n_w)^2) / (sum n_w)^2, which for windows of
// equal size is the sample standard deviation of the per-window means over
// sqrt(W). Paired differences (arm B - arm A on the same windows) use the same
// formula on y_w = y_B,w - y_A,w. W < 2 gives NaN.
//
// Thread-safety: the functions hold no state; one call drives one provider
// from one thread (the kernels use the thread pool inside).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "experts/provider.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace moetier {

struct WindowScore {
  double nll_sum = 0;     // sum over the window's predictions of -log p(target), nats
  int64_t correct = 0;    // predictions whose argmax is the target
  int64_t predicted = 0;  // predictions scored (window length - 1)
};

// Scores logits [n, vocab] against tokens [n]: row t predicts tokens[t + 1]
// (rows 0..n-2 are scored; the last row is not). Throws Error for a target
// outside [0, vocab) or a logits size other than n * vocab.
WindowScore score_logits(std::span<const float> logits, int64_t vocab,
                         std::span<const int32_t> tokens);

// One window [n >= 2] from position 0 of the session (capacity >= n; it is
// rewound first, its contents overwritten).
WindowScore score_window(Session& session, std::span<const int32_t> tokens);

// Whole windows of `length` in n_ids ids, at most max_windows (<= 0: no limit).
int64_t eval_window_count(int64_t n_ids, int64_t length, int64_t max_windows);

struct EvalOptions {
  int64_t window = 512;     // tokens per window (>= 2)
  int64_t max_windows = 0;  // <= 0: every whole window
  // Called after each window with (windows done, windows in all).
  std::function<void(int64_t, int64_t)> progress;
};

// Scores every window of ids (see the top of this file). Throws Error when
// ids hold less than one window.
std::vector<WindowScore> score_windows(const Model& model, ExpertProvider& experts,
                                       std::span<const int32_t> ids, const EvalOptions& opt);

struct ScoreSummary {
  int64_t windows = 0, predicted = 0, correct = 0;
  double nll_sum = 0;
  double mean_nll = 0, mean_nll_se = 0;  // nats per predicted token
  double perplexity = 0;                 // exp(mean_nll)
  double top1 = 0, top1_se = 0;          // share of correct predictions
};

ScoreSummary summarize(std::span<const WindowScore> windows);

// Arm b minus arm a on the same windows (a and b must have the same number of
// windows and the same predictions per window; throws Error otherwise).
struct PairedDifference {
  int64_t windows = 0, predicted = 0;
  double mean_nll = 0, mean_nll_se = 0;  // b - a, nats per token
  double top1 = 0, top1_se = 0;          // b - a, share of tokens
};

PairedDifference paired_difference(std::span<const WindowScore> a, std::span<const WindowScore> b);

// The ratio-estimator standard error of sum(y) / sum(n) over units (see above);
// NaN for fewer than two units.
double ratio_standard_error(std::span<const double> y, std::span<const double> n);

}  // namespace moetier
