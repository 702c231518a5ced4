// RandomPrefetch: an ExpertProvider that forwards to an ArenaExperts and, on
// every submit and wait, also gives it a random prefetch hint (random MoE
// layer, random experts, random phase). Prefetch must never change the
// output: tests run the forward through it and compare every logit.
// Header-only: each test_*.cpp is its own executable.
#pragma once

#include <random>
#include <vector>

#include "experts/arena_experts.h"

namespace moetier::testing {

class RandomPrefetch final : public ExpertProvider {
 public:
  RandomPrefetch(ArenaExperts& a, uint32_t seed) : a_(a), rng_(seed) {
    for (int64_t l = 0; l < a.index().num_layers(); ++l)
      if (a.index().is_moe_layer(l)) layers_.push_back(l);
  }
  int64_t max_batch() const override { return a_.max_batch(); }
  Ticket submit(int64_t layer, std::span<const int32_t> ids, Phase phase) override {
    hint();
    return a_.submit(layer, ids, phase);
  }
  void wait(Ticket t, std::vector<ExpertView>& views) override {
    a_.wait(t, views);
    hint();
  }
  void release(Ticket t) override { a_.release(t); }
  bool can_overlap(int64_t layer, std::span<const int32_t> ids, Phase phase) override {
    return a_.can_overlap(layer, ids, phase);
  }
  Ticket submit_overlapped(int64_t layer, std::span<const int32_t> ids, Phase phase) override {
    return a_.submit_overlapped(layer, ids, phase);
  }
  void prefetch(int64_t layer, std::span<const int32_t> ids, Phase phase) override {
    a_.prefetch(layer, ids, phase);
  }
  void note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) override {
    a_.note_routing(layer, topk, k);
  }

 private:
  void hint() {
    const int64_t E = a_.index().num_experts();
    const int64_t layer = layers_[rng_() % layers_.size()];
    std::vector<int32_t> ids(1 + rng_() % uint64_t(E));
    for (int32_t& id : ids) id = int32_t(rng_() % uint64_t(E));
    a_.prefetch(layer, ids, rng_() % 2 ? Phase::Decode : Phase::Prefill);
  }
  ArenaExperts& a_;
  std::mt19937 rng_;
  std::vector<int64_t> layers_;
};

}  // namespace moetier::testing
