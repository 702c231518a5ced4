// Sampler: greedy, temperature, top-k, top-p and seeding, checked on
// distributions with known answers and on empirical frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
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

TEST(Sampler, BadConfigAndLogitsAreRefused) {
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, -1, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({NAN, 0, 1.0f, 0}), Error);
  Sampler s({1.0f, 0, 1.0f, 0});
  std::vector<float> nan = {1.0f, NAN};
  EXPECT_THROW(s.sample(nan), Error);
  EXPECT_THROW(s.sample(std::vector<float>{}), Error);
}
