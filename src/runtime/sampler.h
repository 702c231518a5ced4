// Token sampling from logits: greedy, or temperature + top-k + top-p + min-p
// with a seeded std::mt19937_64 (same seed, same logits -> same tokens).
//
// Order (as transformers' logits warpers): divide logits by temperature,
// keep the top_k most likely (0: all), then keep the smallest set of the most
// likely whose probability sums to >= top_p (1: all), then keep the tokens
// whose probability is >= min_p times the most likely one's (0: all),
// renormalize, draw. min-p compares ratios to the maximum, so it is the same
// on the tempered softmax before or after the other truncations; llama.cpp
// instead applies temperature last (its min-p, top-k and top-p see the
// untempered probabilities), which keeps a different set when temperature
// != 1 (docs/engine.md). Ties rank the lower token id first. temperature <= 0
// or top_k == 1 is greedy (argmax, lowest id on ties) and draws no random
// number. Not thread-safe (owns the generator).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moetier {

// The library default is greedy; `moetier run`'s defaults come from the
// checkpoint (runtime/generation_config.h).
struct SamplerConfig {
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  float min_p = 0.0f;  // in [0, 1]
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  int32_t sample(std::span<const float> logits);
  bool greedy() const;

  // The distribution sample() draws from: (token, probability) pairs summing
  // to 1; by descending probability when top-k or top-p truncates, else in
  // token order (min-p alone keeps token order). sample() returns the first token whose cumulative
  // probability exceeds a uniform draw in [0, 1).
  std::vector<std::pair<int32_t, double>> distribution(std::span<const float> logits) const;

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace moetier
