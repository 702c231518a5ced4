// Teacher-forced window scoring and its statistics (see eval.h).
#include "runtime/eval.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace moetier {

WindowScore score_logits(std::span<const float> logits, int64_t vocab,
                         std::span<const int32_t> tokens) {
  const int64_t n = int64_t(tokens.size());
  check(vocab > 0 && int64_t(logits.size()) == n * vocab,
        "score_logits: {} logits for {} tokens of vocabulary {}", logits.size(), n, vocab);
  WindowScore s;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const int32_t target = tokens[size_t(t + 1)];
    check(target >= 0 && target < vocab, "score_logits: target id {} outside [0, {})", target,
          vocab);
    const float* row = logits.data() + t * vocab;  // [vocab]
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;  // first maximum, as torch.argmax
    const double mx = row[best];
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
    s.nll_sum += mx + std::log(sum) - double(row[target]);
    s.correct += best == target ? 1 : 0;
    s.predicted += 1;
  }
  return s;
}

WindowScore score_window(Session& session, std::span<const int32_t> tokens) {
  check(tokens.size() >= 2, "score_window: a window needs at least 2 tokens, got {}",
        tokens.size());
  ForwardOptions fo;
  fo.all_logits = true;
  session.rewind(0);
  const std::vector<float>& logits = session.prefill(tokens, fo);  // [n, vocab]
  return score_logits(logits, session.model().spec().vocab_size, tokens);
}

int64_t eval_window_count(int64_t n_ids, int64_t length, int64_t max_windows) {
  if (length <= 0 || n_ids < length) return 0;
  const int64_t w = n_ids / length;
  return max_windows > 0 && max_windows < w ? max_windows : w;
}

std::vector<WindowScore> score_windows(const Model& model, ExpertProvider& experts,
                                       std::span<const int32_t> ids, const EvalOptions& opt) {
  check(opt.window >= 2, "eval: window length {} must be at least 2", opt.window);
  const int64_t count = eval_window_count(int64_t(ids.size()), opt.window, opt.max_windows);
  check(count > 0, "eval: {} tokens are shorter than one window of {}", ids.size(), opt.window);
  Session session(model, experts, opt.window);
  std::vector<WindowScore> out;
  out.reserve(size_t(count));
  for (int64_t w = 0; w < count; ++w) {
    out.push_back(score_window(session, ids.subspan(size_t(w * opt.window), size_t(opt.window))));
    if (opt.progress) opt.progress(w + 1, count);
  }
  return out;
}

double ratio_standard_error(std::span<const double> y, std::span<const double> n) {
  const size_t w = y.size();
  if (w < 2 || n.size() != w) return std::numeric_limits<double>::quiet_NaN();
  double sy = 0, sn = 0;
  for (size_t i = 0; i < w; ++i) sy += y[i], sn += n[i];
  if (sn <= 0) return std::numeric_limits<double>::quiet_NaN();
  const double m = sy / sn;
  double ss = 0;
  for (size_t i = 0; i < w; ++i) ss += (y[i] - m * n[i]) * (y[i] - m * n[i]);
  return std::sqrt(double(w) / double(w - 1) * ss) / sn;
}

ScoreSummary summarize(std::span<const WindowScore> windows) {
  ScoreSummary s;
  std::vector<double> nll, cor, n;
  for (const WindowScore& w : windows) {
    s.windows += 1;
    s.predicted += w.predicted;
    s.correct += w.correct;
    s.nll_sum += w.nll_sum;
    nll.push_back(w.nll_sum);
    cor.push_back(double(w.correct));
    n.push_back(double(w.predicted));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.mean_nll = s.predicted > 0 ? s.nll_sum / double(s.predicted) : nan;
  s.perplexity = std::exp(s.mean_nll);
  s.top1 = s.predicted > 0 ? double(s.correct) / double(s.predicted) : nan;
  s.mean_nll_se = ratio_standard_error(nll, n);
  s.top1_se = ratio_standard_error(cor, n);
  return s;
}

PairedDifference paired_difference(std::span<const WindowScore> a, std::span<const WindowScore> b) {
  check(a.size() == b.size(), "eval: paired difference of {} and {} windows", a.size(), b.size());
  PairedDifference d;
  std::vector<double> dn, dc, n;
  double sn = 0, snll = 0, scor = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    check(a[i].predicted == b[i].predicted,
          "eval: window {} has {} predictions in one arm and {} in the other", i, a[i].predicted,
          b[i].predicted);
    dn.push_back(b[i].nll_sum - a[i].nll_sum);
    dc.push_back(double(b[i].correct - a[i].correct));
    n.push_back(double(a[i].predicted));
    sn += n.back(), snll += dn.back(), scor += dc.back();
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  d.windows = int64_t(a.size());
  d.predicted = int64_t(sn);
  d.mean_nll = sn > 0 ? snll / sn : nan;
  d.top1 = sn > 0 ? scor / sn : nan;
  d.mean_nll_se = ratio_standard_error(dn, n);
  d.top1_se = ratio_standard_error(dc, n);
  return d;
}

}  // namespace moetier
