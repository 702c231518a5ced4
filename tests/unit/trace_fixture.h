// Synthetic routing traces for the trace and simulate tests: skewed random
// routing (a Zipf-like law over a per-layer permutation of the experts), mixed
// prefill chunks and decode steps, written with the real TraceWriter.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "experts/trace.h"

namespace moetier::testing {

struct Synth {
  int64_t layers = 3, experts = 12, k = 3;
  std::vector<int64_t> moe = {0, 2};
  int windows = 4;
  int max_prefill = 9, max_decode = 6;
  double skew = 1.1;  // Zipf exponent
  bool f32 = false;
  uint32_t seed = 1;
};

inline TraceHeader synth_header(const Synth& s) {
  TraceHeader h;
  TraceModel& m = h.model;
  m.dir = "synthetic";
  m.model_type = "qwen3_moe";
  m.num_layers = s.layers;
  m.num_experts = s.experts;
  m.k = s.k;
  m.moe_layers = s.moe;
  m.hidden = 64;
  m.moe_intermediate = 32;
  m.encoding = "bf16";
  m.expert_bytes = 3 * 64 * 32 * 2;
  m.slot_bytes = 16384;
  m.encodings = expert_encoding_bytes(m.hidden, m.moe_intermediate, m.encoding, m.expert_bytes);
  h.corpus = {"a.txt", "b.txt"};
  h.f32_weights = s.f32;
  h.settings = {{"synthetic", true}};
  return h;
}

// Writes a synthetic trace to `path`; returns the token count.
inline uint64_t write_synth(const std::filesystem::path& path, const Synth& s) {
  std::mt19937 rng(s.seed);
  const size_t M = s.moe.size(), k = size_t(s.k), E = size_t(s.experts);
  std::vector<std::vector<int32_t>> perm(M, std::vector<int32_t>(E));
  for (auto& p : perm) {
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
  }
  std::vector<double> w(E);
  for (size_t i = 0; i < E; ++i) w[i] = 1.0 / std::pow(double(i + 1), s.skew);
  std::discrete_distribution<size_t> zipf(w.begin(), w.end());
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  TraceWriter tw(path, synth_header(s));
  auto chunk = [&](uint32_t seq, int64_t pos, size_t n, Phase ph) {
    std::vector<int32_t> toks(n), ex(M * n * k);
    std::vector<float> wt(ex.size());
    for (auto& t : toks) t = int32_t(rng() % 1000);
    for (size_t l = 0; l < M; ++l)
      for (size_t t = 0; t < n; ++t) {
        std::vector<int32_t> chosen;
        while (chosen.size() < k) {
          int32_t e = perm[l][zipf(rng)];
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (size_t j = 0; j < k; ++j) {
          ex[(l * n + t) * k + j] = chosen[j];
          wt[(l * n + t) * k + j] = uw(rng);
        }
      }
    tw.add_chunk(seq, uint16_t(seq % 2), pos, ph, toks, ex, wt);
  };
  for (int win = 0; win < s.windows; ++win) {
    const size_t n = 2 + rng() % size_t(std::max(1, s.max_prefill - 1));
    chunk(uint32_t(win), 0, n, Phase::Prefill);
    const size_t d = rng() % size_t(s.max_decode + 1);
    for (size_t i = 0; i < d; ++i) chunk(uint32_t(win), int64_t(n + i), 1, Phase::Decode);
  }
  const uint64_t n = tw.tokens();
  tw.commit();
  return n;
}

}  // namespace moetier::testing
