// Greedy runs for the bit-identity tests: prefill a prompt in one chunk (all
// logits), then greedy-decode; every logit is kept and compared bit for bit.
// Header-only: each test_*.cpp is its own executable.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace moetier::testing {

struct GreedyRun {
  std::vector<std::vector<float>> logits;  // prefill (all positions), then one per decode step
  std::vector<int32_t> tokens;
};

inline int32_t argmax_of(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

inline GreedyRun greedy_run(const Model& m, ExpertProvider& ex, const std::vector<int32_t>& prompt,
                            int steps) {
  const int64_t V = m.spec().vocab_size;
  auto kv = m.new_state(int64_t(prompt.size()) + steps + 1);
  ForwardOptions all;
  all.all_logits = true;
  GreedyRun t;
  t.logits.push_back(m.forward(prompt, 0, *kv, ex, all));
  int32_t next = argmax_of(t.logits.back().data() + (int64_t(prompt.size()) - 1) * V, V);
  for (int s = 0; s < steps; ++s) {
    t.tokens.push_back(next);
    std::vector<int32_t> one{next};
    t.logits.push_back(m.forward(one, int64_t(prompt.size()) + s, *kv, ex));
    next = argmax_of(t.logits.back().data(), V);
  }
  t.tokens.push_back(next);
  return t;
}

inline void expect_identical_runs(const GreedyRun& a, const GreedyRun& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_EQ(a.logits[i].size(), b.logits[i].size());
    ASSERT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4), 0)
        << what << ": logits of step " << i << " differ";
  }
}

inline std::vector<int32_t> random_tokens(int64_t vocab, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % uint64_t(vocab));
  return p;
}

}  // namespace moetier::testing
