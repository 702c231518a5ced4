// The arena must change nothing: greedy tokens and every logit with a 10%
// arena (and other settings) are bit-identical to all-resident MappedExperts,
// on every fixture; the counter identities hold over a real run; a prompt
// chunk processed after decode leaves the hot set as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "experts/arena_experts.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "runtime/kv_cache.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

// The fixtures, and the embedded model (a trained router) under models/.
const char* kFixtures[] = {"tests/data/fixtures/qwen3moe-bf16",
                           "tests/data/fixtures/qwen3moe-mxfp4",
                           "tests/data/fixtures/qwen3moe-sharded", "models/moetier-tiny"};

struct Trace {
  std::vector<std::vector<float>> logits;  // prefill (all positions), then one per decode step
  std::vector<int32_t> tokens;
};

int32_t argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

// Prefill `prompt` in one chunk (all logits), then greedy-decode `steps` tokens.
Trace greedy(const Model& m, ExpertProvider& ex, const std::vector<int32_t>& prompt, int steps) {
  const int64_t V = m.spec().vocab_size;
  auto kv = m.new_state(int64_t(prompt.size()) + steps + 1);
  ForwardOptions all;
  all.all_logits = true;
  Trace t;
  t.logits.push_back(m.forward(prompt, 0, *kv, ex, all));
  int32_t next = argmax(t.logits.back().data() + (int64_t(prompt.size()) - 1) * V, V);
  for (int s = 0; s < steps; ++s) {
    t.tokens.push_back(next);
    std::vector<int32_t> one{next};
    t.logits.push_back(m.forward(one, int64_t(prompt.size()) + s, *kv, ex));
    next = argmax(t.logits.back().data(), V);
  }
  t.tokens.push_back(next);
  return t;
}

void expect_identical(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_EQ(a.logits[i].size(), b.logits[i].size());
    ASSERT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4), 0)
        << what << ": logits of step " << i << " differ";
  }
}

std::vector<int32_t> random_prompt(int64_t vocab, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % uint64_t(vocab));
  return p;
}

}  // namespace

TEST(ExpertIdentical, TenPercentArenaEqualsAllResident) {
  uint32_t seed = 100;
  for (const char* name : kFixtures) {
    fs::path dir = fs::path(MOETIER_SOURCE_DIR) / name;
    auto ck = Checkpoint::open(dir);
    const std::unique_ptr<Model> model_owned = load_model(*ck);
    const Model& model = *model_owned;
    const ModelSpec& cfg = model.spec();
    const auto prompt = random_prompt(cfg.vocab_size, 13, seed++);
    const int steps = 12;
    MappedExperts mapped(*ck, cfg);
    const Trace ref = greedy(model, mapped, prompt, steps);
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l) moe_layers += cfg.is_moe_layer(l);

    struct Variant {
      const char* arena;
      int64_t transient;
      const char* host;
      const char* policy;
      const char* prefetch = "none";
    };
    for (const Variant& v :
         {Variant{"10%", -1, "", "lru"}, Variant{"10%", 0, "", "lru"}, Variant{"10%", 1, "", "lfu"},
          Variant{"10%", 3, "64KiB", "lru"}, Variant{"50%", -1, "", "lfu"},
          Variant{"100%", -1, "", "lru"}, Variant{"10%", -1, "", "lru", "next-layer"},
          Variant{"10%", 3, "64KiB", "lfu", "next-layer"}}) {
      std::string what = std::string(name) + " arena " + v.arena + " transient " +
                         std::to_string(v.transient) + " host '" + v.host + "' " + v.policy +
                         " prefetch " + v.prefetch;
      ExpertOptions o;
      o.arena = v.arena;
      o.transient = v.transient;
      o.host_cache = v.host;
      o.policy = v.policy;
      o.prefetch = v.prefetch;
      o.quiet = true;
      ExpertStats stats;
      auto arena = make_expert_provider(*ck, cfg, o, &stats);
      const Trace got = greedy(model, *arena, prompt, steps);
      expect_identical(ref, got, what);
      const LayerCounters t = stats.total();
      EXPECT_EQ(t.hits() + t.misses, t.uses) << what;
      EXPECT_EQ(t.read_bytes, t.misses * stats.expert_bytes) << what;
      EXPECT_EQ(t.steps, uint64_t((prompt.size() + steps) * size_t(moe_layers))) << what;
      EXPECT_LE(t.all_hit_steps, t.steps);
      EXPECT_GE(stats.aligned_read_bytes, t.read_bytes);
      if (std::string(v.arena) == "10%") {
        EXPECT_GT(t.misses, stats.total_experts) << what;  // the arena really was too small
      }
      const PrefetchCounters& pf = stats.prefetch;
      if (std::string(v.prefetch) == "next-layer") {  // k hints per decode step and MoE layer
        EXPECT_EQ(pf.hints,
                  uint64_t(steps) * uint64_t(moe_layers - 1) * uint64_t(cfg.experts_per_token))
            << what;
        EXPECT_EQ(pf.redundant + pf.dropped + pf.issued, pf.hints) << what;
        if (std::string(name) == "models/moetier-tiny") {  // the fixtures' 10% leaves no room
          EXPECT_GT(pf.issued, 0u) << what;
          EXPECT_GT(pf.used, 0u) << what;
        }
        EXPECT_LE(pf.used + pf.wasted, pf.issued) << what;
      } else {
        EXPECT_EQ(pf.hints, 0u) << what;
      }
      if (std::string(v.arena) == "100%") {
        EXPECT_LE(t.misses, stats.total_experts) << what;  // each expert read at most once
        EXPECT_EQ(t.hot_evictions, 0u);
      }
    }
  }
}

TEST(ExpertIdentical, PromptAfterDecodeKeepsTheHotSet) {
  fs::path dir = fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures/qwen3moe-mxfp4";
  auto ck = Checkpoint::open(dir);
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  const ModelSpec& cfg = model.spec();
  ExpertOptions o;
  o.arena = "25%";
  o.transient = cfg.experts_per_token;
  o.quiet = true;
  ExpertStats stats;
  auto arena = make_expert_provider(*ck, cfg, o, &stats);
  MappedExperts mapped(*ck, cfg);
  auto prompt = random_prompt(cfg.vocab_size, 9, 7);
  auto kv = model.new_state(64), kv_ref = model.new_state(64);
  model.forward(prompt, 0, *kv, *arena);
  model.forward(prompt, 0, *kv_ref, mapped);
  int64_t pos = int64_t(prompt.size());
  for (int s = 0; s < 10; ++s, ++pos) {  // decode settles a hot set
    std::vector<int32_t> one{int32_t((s * 37 + 5) % cfg.vocab_size)};
    model.forward(one, pos, *kv, *arena);
    model.forward(one, pos, *kv_ref, mapped);
  }
  ASSERT_EQ(arena->residency().hot_count(), arena->residency().config().hot_slots);
  const auto hot_before = arena->residency().hot_keys();
  const uint64_t evictions_before = stats.total().hot_evictions;
  auto chunk = random_prompt(cfg.vocab_size, 11, 8);  // a second prompt chunk
  auto a = model.forward(chunk, pos, *kv, *arena);
  auto b = model.forward(chunk, pos, *kv_ref, mapped);
  EXPECT_EQ(arena->residency().hot_keys(), hot_before);
  EXPECT_EQ(stats.total().hot_evictions, evictions_before);
  EXPECT_GT(stats.total().ring_evictions, 0u);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}
