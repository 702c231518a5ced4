// Sampler: greedy, temperature, top-k, top-p, min-p and seeding, checked on
// distributions with known answers and on empirical frequencies; the sampling
// defaults read from generation_config.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/generation_config.h"
#include "runtime/sampler.h"

using namespace moetier;

namespace {

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Logits whose softmax at temperature 1 is p.
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

std::vector<int32_t> ids_of(const std::vector<std::pair<int32_t, double>>& d) {
  std::vector<int32_t> ids;
  for (auto& [id, p] : d) ids.push_back(id);
  return ids;
}

}  // namespace

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  Sampler s({});
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_EQ(argmax(l), 1);
  auto r = random_logits(1001, 1);
  EXPECT_EQ(s.sample(r), int32_t(std::max_element(r.begin(), r.end()) - r.begin()));
}

TEST(Sampler, TopKOneEqualsGreedy) {
  Sampler g({}), k1({1.3f, 1, 1.0f, 42});
  for (uint32_t i = 0; i < 20; ++i) {
    auto l = random_logits(517, i);
    EXPECT_EQ(k1.sample(l), g.sample(l));
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  SamplerConfig c{0.9f, 0, 1.0f, 1234};
  Sampler a(c), b(c);
  c.seed = 99;
  Sampler other(c);
  int differ = 0;
  for (uint32_t i = 0; i < 64; ++i) {
    auto l = random_logits(200, 100 + i);
    int32_t x = a.sample(l);
    EXPECT_EQ(x, b.sample(l));
    differ += x != other.sample(l);
  }
  EXPECT_GT(differ, 10);
}

TEST(Sampler, TopKKeepsTheKMostLikelyWithTemperedSoftmax) {
  auto l = random_logits(300, 7);
  Sampler s({0.7f, 5, 1.0f, 0});
  auto d = s.distribution(l);
  ASSERT_EQ(d.size(), 5u);
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const double t = double(0.7f);
  double z = 0;
  for (int i = 0; i < 5; ++i) z += std::exp(l[order[i]] / t);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(d[i].first, order[i]);
    EXPECT_NEAR(d[i].second, std::exp(l[order[i]] / t) / z, 1e-12);
  }
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  auto l = logits_of({0.15, 0.5, 0.05, 0.3});
  auto keep = [&](float p) { return ids_of(Sampler({1.0f, 0, p, 0}).distribution(l)); };
  EXPECT_EQ(keep(0.4f), (std::vector<int32_t>{1}));
  EXPECT_EQ(keep(0.5f), (std::vector<int32_t>{1}));
  EXPECT_EQ(keep(0.75f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(keep(0.85f), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(keep(1.0f), (std::vector<int32_t>{0, 1, 2, 3}));  // no truncation: token order
  auto d = Sampler({1.0f, 0, 0.75f, 0}).distribution(l);
  EXPECT_NEAR(d[0].second, 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(d[1].second, 0.3 / 0.8, 1e-6);
  // top-k then top-p: top-2 renormalized is {0.625, 0.375}; p=0.6 keeps one.
  EXPECT_EQ(ids_of(Sampler({1.0f, 2, 0.6f, 0}).distribution(l)), (std::vector<int32_t>{1}));
}

TEST(Sampler, TopPBeyondTheFirstThousandCandidates) {
  std::vector<float> l(3000, -1e30f);
  for (int i = 0; i < 2000; ++i) l[size_t(i) * 3 / 2] = 0.0f;  // 2000 equally likely tokens
  auto d = Sampler({1.0f, 0, 0.99f, 0}).distribution(l);
  EXPECT_GE(d.size(), 1980u);
  EXPECT_LE(d.size(), 1981u);
  for (auto& [id, p] : d) EXPECT_EQ(l[size_t(id)], 0.0f);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<double> p = {0.1, 0.4, 0.2, 0.3};
  auto l = logits_of(p);
  Sampler s({1.0f, 0, 1.0f, 7});
  std::vector<int> count(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[size_t(s.sample(l))];
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / double(n), p[i], 0.01) << i;
  // Temperature 2 flattens: p_i ~ sqrt(p_i).
  Sampler hot({2.0f, 0, 1.0f, 8});
  std::fill(count.begin(), count.end(), 0);
  double z = 0;
  for (double x : p) z += std::sqrt(x);
  for (int i = 0; i < n; ++i) ++count[size_t(hot.sample(l))];
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / double(n), std::sqrt(p[i]) / z, 0.01);
}

// min-p keeps the tokens at least min_p times as likely as the most likely,
// after temperature (transformers' order): p = {0.15, 0.5, 0.05, 0.3}.
TEST(Sampler, MinPKeepsTokensNearTheMostLikely) {
  auto l = logits_of({0.15, 0.5, 0.05, 0.3});
  auto with = [&](float t, int64_t k, float min_p) {
    return Sampler({t, k, 1.0f, 0, min_p}).distribution(l);
  };
  // T = 1, min-p 0.2: floor 0.1 drops token 2 (0.05); no other truncation, so token order.
  auto d = with(1.0f, 0, 0.2f);
  ASSERT_EQ(ids_of(d), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_NEAR(d[0].second, 0.15 / 0.95, 1e-6);
  EXPECT_NEAR(d[1].second, 0.5 / 0.95, 1e-6);
  EXPECT_NEAR(d[2].second, 0.3 / 0.95, 1e-6);
  // min-p 0.5: floor 0.25 keeps 0.5 and 0.3.
  d = with(1.0f, 0, 0.5f);
  ASSERT_EQ(ids_of(d), (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(d[0].second, 0.625, 1e-6);
  EXPECT_NEAR(d[1].second, 0.375, 1e-6);
  // T = 0.5 squares the ratios to the maximum (0.09, 1, 0.01, 0.36) before min-p 0.2
  // applies: token 0 goes too (llama.cpp, tempering last, would keep it).
  d = with(0.5f, 0, 0.2f);
  ASSERT_EQ(ids_of(d), (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(d[0].second, 0.25 / 0.34, 1e-6);
  EXPECT_NEAR(d[1].second, 0.09 / 0.34, 1e-6);
  // With top-k 3 (descending order) and top-p: min-p applies to what they keep.
  EXPECT_EQ(ids_of(with(1.0f, 3, 0.4f)), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(ids_of(Sampler({1.0f, 0, 0.85f, 0, 0.5f}).distribution(l)),
            (std::vector<int32_t>{1, 3}));
  // min-p 1 keeps the most likely only; 0 keeps all.
  EXPECT_EQ(ids_of(with(1.0f, 0, 1.0f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(ids_of(with(1.0f, 0, 0.0f)), (std::vector<int32_t>{0, 1, 2, 3}));
  // Drawing follows the kept distribution.
  Sampler s({1.0f, 0, 1.0f, 3, 0.5f});
  int ones = 0;
  for (int i = 0; i < 20000; ++i) {
    const int32_t x = s.sample(l);
    ASSERT_TRUE(x == 1 || x == 3) << x;
    ones += x == 1;
  }
  EXPECT_NEAR(ones / 20000.0, 0.625, 0.015);
}

TEST(Sampler, BadConfigAndLogitsAreRefused) {
  EXPECT_THROW(Sampler({1.0f, 0, 1.0f, 0, -0.1f}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.0f, 0, 1.5f}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, -1, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({NAN, 0, 1.0f, 0}), Error);
  Sampler s({1.0f, 0, 1.0f, 0});
  std::vector<float> nan = {1.0f, NAN};
  EXPECT_THROW(s.sample(nan), Error);
  EXPECT_THROW(s.sample(std::vector<float>{}), Error);
}

namespace {

struct GenDir {
  std::filesystem::path dir;
  GenDir() {
    static int n = 0;
    dir = std::filesystem::temp_directory_path() /
          ("moetier_gen_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::create_directories(dir);
  }
  ~GenDir() { std::filesystem::remove_all(dir); }
  GenerationConfig read(const std::string& text) const {
    std::ofstream(dir / "generation_config.json") << text;
    return read_generation_config(dir);
  }
};

}  // namespace

TEST(GenerationConfig, FieldsReplaceLlamaCppDefaults) {
  const SamplerConfig d = llama_cpp_sampling();
  EXPECT_FLOAT_EQ(d.temperature, 0.8f);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_FLOAT_EQ(d.top_p, 0.95f);
  EXPECT_FLOAT_EQ(d.min_p, 0.05f);
  GenDir g;
  // No file: the defaults.
  GenerationConfig none = read_generation_config(g.dir);
  EXPECT_TRUE(none.file.empty());
  EXPECT_FLOAT_EQ(checkpoint_sampling(none).temperature, 0.8f);
  // Qwen3's file.
  GenerationConfig q = g.read(
      R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
          "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95})");
  EXPECT_EQ(q.file, g.dir / "generation_config.json");
  EXPECT_EQ(q.eos, (std::vector<int32_t>{151645, 151643}));
  SamplerConfig s = checkpoint_sampling(q);
  EXPECT_FLOAT_EQ(s.temperature, 0.6f);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_FLOAT_EQ(s.top_p, 0.95f);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);  // not in the file: llama.cpp's
  // do_sample false is greedy whatever the temperature; null is absent.
  s = checkpoint_sampling(g.read(R"({"do_sample": false, "temperature": 0.7, "min_p": null,
                                     "eos_token_id": 2})"));
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_TRUE(Sampler(s).greedy());
  EXPECT_EQ(read_generation_config(g.dir).eos, (std::vector<int32_t>{2}));
  s = checkpoint_sampling(g.read(R"({"min_p": 0.1, "top_k": 0})"));
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_EQ(s.top_k, 0);
}

TEST(GenerationConfig, BadFieldsAreOneLineNamingFileAndField) {
  GenDir g;
  const std::string f = (g.dir / "generation_config.json").string();
  auto error_of = [&](const std::string& text) {
    try {
      g.read(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(R"({"top_k": -1})"), f + ": field 'top_k': -1 is not a non-negative integer");
  EXPECT_EQ(error_of(R"({"top_p": 0})"), f + ": field 'top_p': 0 is outside (0, 1]");
  EXPECT_EQ(error_of(R"({"min_p": 2})"), f + ": field 'min_p': 2 is outside [0, 1]");
  EXPECT_EQ(error_of(R"({"temperature": -1})"),
            f + ": field 'temperature': -1 is outside [0, 1000000]");
  EXPECT_EQ(error_of(R"({"do_sample": "yes"})"),
            f + ": field 'do_sample': is a string, expected true or false");
  EXPECT_EQ(error_of(R"({"eos_token_id": ["x"]})"),
            f + ": field 'eos_token_id': \"x\" is not a token id");
  EXPECT_EQ(error_of("[1]"), f + ": is an array, expected a JSON object");
  EXPECT_EQ(error_of("{").rfind(f + ": invalid JSON", 0), 0u) << error_of("{");
}
