// Prefetch must change nothing: with random prefetch hints before and after
// every request, greedy tokens and every logit equal all-resident
// MappedExperts bit for bit, on every fixture and several arena settings;
// the hints are really issued, used and wasted, and the counter identities
// hold. Without hints, a small arena also overlaps reads with compute.
#include <gtest/gtest.h>

#include <filesystem>

#include "cpu_reference.h"
#include "experts/arena_experts.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "prefetch_fixture.h"
#include "runtime/mapped_experts.h"

using namespace moetier;
using namespace moetier::testing;
namespace fs = std::filesystem;

TEST(ExpertPrefetch, RandomHintsChangeNoLogit) {
  uint32_t seed = 300;
  for (const char* name : kGreedyFixtures) {
    const CpuReference cr = cpu_reference(name, 13, seed++, 10);
    const Checkpoint& ck = *cr.ck;
    const Model& model = *cr.model;
    const ModelSpec& cfg = cr.spec();
    const GreedyRun& ref = cr.run;
    const auto& prompt = cr.prompt;
    struct Variant {
      const char* arena;
      int64_t transient;
      const char* host;
      const char* policy;
    };
    for (const Variant& v : {Variant{"10%", -1, "", "lru"}, Variant{"10%", 3, "64KiB", "lfu"},
                             Variant{"25%", 0, "", "lru"}, Variant{"100%", -1, "", "lru"}}) {
      const std::string what = std::string(name) + " arena " + v.arena + " transient " +
                               std::to_string(v.transient) + " host '" + v.host + "' " + v.policy;
      ExpertOptions o;
      o.arena = v.arena;
      o.transient = v.transient;
      o.host_cache = v.host;
      o.policy = v.policy;
      o.quiet = true;
      ExpertStats stats;
      auto arena = make_expert_provider(ck, cfg, o, &stats);
      RandomPrefetch hinted(*arena, seed++);
      expect_identical_runs(ref, greedy_run(model, hinted, prompt, 10), what);
      arena->drain();
      const LayerCounters t = stats.total();
      const PrefetchCounters& f = stats.prefetch;
      EXPECT_EQ(t.hits() + t.misses, t.uses) << what;
      EXPECT_EQ(t.read_bytes, t.misses * stats.expert_bytes) << what;
      EXPECT_GT(f.hints, 0u) << what;
      EXPECT_EQ(f.redundant + f.dropped + f.issued, f.hints) << what;
      EXPECT_LE(f.used + f.wasted, f.issued) << what;
      EXPECT_LE(f.late, f.used) << what;
      EXPECT_EQ(f.failed, 0u) << what;
      if (std::string(v.arena) != "100%") {
        EXPECT_GT(f.issued, 0u) << what;
        EXPECT_GT(f.used, 0u) << what;
      }
      EXPECT_EQ(arena->residency().held_slots(), 0u) << what;
      EXPECT_EQ(arena->open_tickets(), 0u) << what;
    }
  }
}

// A 10% arena with a ring bigger than a batch: prefill batches of a layer
// overlap (counted), and the output is still bit-identical.
TEST(ExpertPrefetch, OverlappedBatchesChangeNoLogit) {
  auto ck = Checkpoint::open(fs::path(MOETIER_SOURCE_DIR) / "models/moetier-tiny");
  const std::unique_ptr<Model> model = load_model(*ck);
  const ModelSpec& cfg = model->spec();
  const auto prompt = random_tokens(cfg.vocab_size, 40, 9);
  MappedExperts mapped(*ck, cfg);
  const GreedyRun ref = greedy_run(*model, mapped, prompt, 6);
  ExpertOptions o;
  o.arena_experts = 8;
  o.transient = 64;
  o.quiet = true;
  ExpertStats stats;
  auto arena = make_expert_provider(*ck, cfg, o, &stats);
  expect_identical_runs(ref, greedy_run(*model, *arena, prompt, 6), "overlap");
  EXPECT_GT(stats.overlapped_submits, 0u);
}
