// runtime/eval: per-prediction NLL and top-1 against a direct computation on
// random logits, the window rule (non-overlapping windows from id 0, each from
// position 0 with the KV cache reused = a fresh cache, bit for bit), and the
// ratio / paired standard errors against their textbook forms.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "format/safetensors.h"
#include "runtime/eval.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

}  // namespace

TEST(Eval, ScoreLogitsMatchesLogSoftmax) {
  const int64_t n = 13, vocab = 37;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> ud(0, int32_t(vocab - 1));
  std::vector<float> logits(static_cast<size_t>(n * vocab));  // [n, vocab]
  for (float& x : logits) x = nd(rng) + 50.0f;  // an offset that naive exp() would overflow in f32
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = ud(rng);
  // Make a few targets the argmax so that both outcomes are exercised.
  for (int64_t t : {2, 5, 9}) logits[size_t(t * vocab + tokens[size_t(t + 1)])] = 80.0f;

  double nll = 0;
  int64_t correct = 0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const float* row = logits.data() + t * vocab;
    long double z = 0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp((long double)row[v] - 80.0L);
    nll += double(80.0L + std::log(z) - (long double)row[tokens[size_t(t + 1)]]);
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    correct += best == tokens[size_t(t + 1)];
  }
  const WindowScore s = score_logits(logits, vocab, tokens);
  EXPECT_EQ(s.predicted, n - 1);
  EXPECT_EQ(s.correct, correct);
  EXPECT_GE(s.correct, 3);
  EXPECT_LT(s.correct, n - 1);
  EXPECT_NEAR(s.nll_sum, nll, 1e-9 * nll);
}

TEST(Eval, ScoreLogitsTiesTakeTheFirstMaximum) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.5f, 0, 0, 0, 0};  // [2, 4]
  std::vector<int32_t> hit = {0, 1}, miss = {0, 2};
  EXPECT_EQ(score_logits(logits, 4, hit).correct, 1);
  EXPECT_EQ(score_logits(logits, 4, miss).correct, 0);
  std::vector<int32_t> bad = {0, 4};
  EXPECT_THROW(score_logits(logits, 4, bad), Error);
  std::vector<int32_t> three = {0, 1, 2};
  EXPECT_THROW(score_logits(logits, 4, three), Error);
}

TEST(Eval, WindowCount) {
  EXPECT_EQ(eval_window_count(35351, 512, 0), 69);
  EXPECT_EQ(eval_window_count(35351, 512, 64), 64);
  EXPECT_EQ(eval_window_count(35351, 512, 100), 69);
  EXPECT_EQ(eval_window_count(511, 512, 0), 0);
  EXPECT_EQ(eval_window_count(512, 512, 0), 1);
}

TEST(Eval, RatioStandardErrorOfEqualWindowsIsTheSampleSdOverRootW) {
  std::vector<double> y = {3.5, 1.25, 7.0, 2.0, 4.75}, n(5, 10.0);
  double mean = 0;
  for (double v : y) mean += v / 10.0 / 5.0;
  double ss = 0;
  for (double v : y) ss += (v / 10.0 - mean) * (v / 10.0 - mean);
  const double expect = std::sqrt(ss / 4.0) / std::sqrt(5.0);
  EXPECT_NEAR(ratio_standard_error(y, n), expect, 1e-12);
  EXPECT_TRUE(std::isnan(ratio_standard_error(std::vector<double>{1.0}, std::vector<double>{2.0})));
}

TEST(Eval, PairedDifference) {
  std::vector<WindowScore> a = {{100.0, 30, 63}, {120.0, 25, 63}, {90.0, 40, 63}};
  std::vector<WindowScore> b = {{101.0, 29, 63}, {119.0, 27, 63}, {93.0, 40, 63}};
  const PairedDifference d = paired_difference(a, b);
  EXPECT_EQ(d.windows, 3);
  EXPECT_EQ(d.predicted, 189);
  EXPECT_NEAR(d.mean_nll, 3.0 / 189.0, 1e-15);
  EXPECT_NEAR(d.top1, 1.0 / 189.0, 1e-15);
  // Per-window differences per token: 1/63, -1/63, 3/63.
  const double m = 1.0 / 63.0, sd = std::sqrt((0.0 + 4.0 + 4.0) / 2.0) / 63.0;
  EXPECT_NEAR(d.mean_nll, m, 1e-15);
  EXPECT_NEAR(d.mean_nll_se, sd / std::sqrt(3.0), 1e-12);
  const ScoreSummary s = summarize(a);
  EXPECT_EQ(s.predicted, 189);
  EXPECT_EQ(s.correct, 95);
  EXPECT_NEAR(s.mean_nll, 310.0 / 189.0, 1e-15);
  EXPECT_NEAR(s.perplexity, std::exp(310.0 / 189.0), 1e-12);
  std::vector<WindowScore> shorter = {a[0], a[1]};
  EXPECT_THROW(paired_difference(a, shorter), Error);
  b[1].predicted = 62;
  EXPECT_THROW(paired_difference(a, b), Error);
}

TEST(Eval, WindowsRunFromPositionZeroWithAFreshCache) {
  auto ck = Checkpoint::open(fixture("qwen3moe-mxfp4"));
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  MappedExperts ex(*ck, model.spec());
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> ud(0, int32_t(model.spec().vocab_size - 1));
  std::vector<int32_t> ids(3 * 17 + 9);  // 3 windows of 17 and a partial one that is dropped
  for (auto& t : ids) t = ud(rng);

  EvalOptions eo;
  eo.window = 17;
  int64_t calls = 0;
  eo.progress = [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, ++calls);
    EXPECT_EQ(total, 3);
  };
  const std::vector<WindowScore> got = score_windows(model, ex, ids, eo);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(calls, 3);
  for (size_t w = 0; w < 3; ++w) {
    auto fresh = model.new_state(17);
    std::span<const int32_t> win(ids.data() + w * 17, 17);
    ForwardOptions fo;
    fo.all_logits = true;
    const std::vector<float> logits = model.forward(win, 0, *fresh, ex, fo);
    const WindowScore want = score_logits(logits, model.spec().vocab_size, win);
    EXPECT_EQ(got[w].nll_sum, want.nll_sum) << "window " << w;
    EXPECT_EQ(got[w].correct, want.correct);
    EXPECT_EQ(got[w].predicted, 16);
    EXPECT_GT(got[w].nll_sum, 0.0);
  }
  eo.progress = nullptr;
  eo.max_windows = 2;
  EXPECT_EQ(score_windows(model, ex, ids, eo).size(), 2u);
  eo.window = int64_t(ids.size()) + 1;
  EXPECT_THROW(score_windows(model, ex, ids, eo), Error);
  eo.window = 1;
  EXPECT_THROW(score_windows(model, ex, ids, eo), Error);
}
