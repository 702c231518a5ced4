// The arena's mapped host tier (experts/arena_experts.h, "Mapped host tier"),
// run on the CPU through DeviceDouble: decode steps run on device expert
// tables whose entries name arena slots (device memory, poisoned until
// copied) or host-tier copies read in place; the Session's calls around each
// step count the uses and admit experts with overlapped copies. Greedy runs
// through a Session equal the CPU engine's bit for bit, whatever the arena
// size, and whether the copies land at once or a step late.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "cpu_reference.h"
#include "device_double.h"
#include "experts/arena_experts.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"
#include "runtime/session.h"

using namespace moetier;
using namespace moetier::testing;
namespace fs = std::filesystem;

namespace {

// Prefill (all logits), then greedy decode steps, through a Session.
// `copies` gets the device's overlapped copy count after each step.
GreedyRun session_run(const Model& m, ExpertProvider& ex, const std::vector<int32_t>& prompt,
                      int steps, const DeviceDouble& dev, std::vector<uint64_t>& copies) {
  const int64_t V = m.spec().vocab_size;
  Session s(m, ex, int64_t(prompt.size()) + steps + 1);
  ForwardOptions all;
  all.all_logits = true;
  GreedyRun t;
  t.logits.push_back(s.prefill(prompt, all));
  int32_t next = argmax_of(t.logits.back().data() + (int64_t(prompt.size()) - 1) * V, V);
  for (int i = 0; i < steps; ++i) {
    t.tokens.push_back(next);
    t.logits.push_back(s.decode(next));
    copies.push_back(dev.async_copies);
    next = argmax_of(t.logits.back().data(), V);
  }
  t.tokens.push_back(next);
  return t;
}

std::unique_ptr<ArenaExperts> arena_on(DeviceDouble& dev, const Checkpoint& ck,
                                       const ModelSpec& cfg, int64_t experts, const char* host,
                                       ExpertStats& stats) {
  ExpertOptions o;
  o.arena_experts = experts;
  o.host_cache = host;
  o.quiet = true;
  return make_expert_provider(ck, cfg, o, &stats, nullptr, &dev);
}

}  // namespace

TEST(MappedHost, DecodeOnDeviceTablesEqualsTheCpuEngine) {
  uint32_t seed = 900;
  const int kSteps = 10;
  for (const char* name : kGreedyFixtures) {
    const CpuReference cr = cpu_reference(name, 11, seed++, kSteps);
    const Checkpoint& ck = *cr.ck;
    const ModelSpec& cfg = cr.spec();
    const GreedyRun& ref = cr.run;
    const auto& prompt = cr.prompt;
    for (int64_t experts : {int64_t(2), cfg.num_experts}) {
      for (bool lazy : {false, true}) {
        const std::string what = std::string(name) + ", arena of " + std::to_string(experts) +
                                 " experts" + (lazy ? ", copies a step late" : "");
        DeviceDouble dev;
        dev.maps_host = true;
        dev.lazy_copies = lazy;
        const std::unique_ptr<Model> model = load_model(ck, dev);
        ExpertStats stats;
        auto arena = arena_on(dev, ck, cfg, experts, "512MiB", stats);
        ASSERT_TRUE(arena->mapped_host()) << what;
        for (int64_t l : cfg.moe_layers()) {
          EXPECT_GE(arena->device_table(l), 0) << what;
          EXPECT_NE(arena->device_ids(l), nullptr) << what;
        }
        std::vector<uint64_t> copies{0, 0};  // after each step
        expect_identical_runs(ref, session_run(*model, *arena, prompt, kSteps, dev, copies), what);
        // Copies are committed as they land, not only when the arena runs dry:
        // only the last step's admissions (and the step before's, when copies
        // land late) may still be loading.
        size_t loading = 0;
        for (size_t k = 0; k < arena->index().num_keys(); ++k)
          loading += arena->residency().state(ExpertKey(k)) == KeyState::Loading;
        EXPECT_LE(loading, copies.back() - copies[copies.size() - (lazy ? 3 : 2)]) << what;
        // Every decode step ran on the tables.
        EXPECT_EQ(dev.moe_resident_calls, uint64_t(kSteps) * cfg.moe_layers().size()) << what;
        arena->drain();
        const LayerCounters t = stats.total();
        EXPECT_EQ(t.misses, 0u) << what;  // every expert is in the host tier
        EXPECT_EQ(t.hits() + t.misses, t.uses) << what;
        // Decode steps count k uses per MoE layer; prefill counts distinct experts.
        EXPECT_GE(t.uses, uint64_t(kSteps * cfg.experts_per_token) * cfg.moe_layers().size())
            << what;
        EXPECT_GT(t.hits_host, 0u) << what;             // read in place
        EXPECT_GT(dev.async_copy_bytes(), 0u) << what;  // admissions copied in
      }
    }
  }
}

TEST(MappedHost, OnlyWhereItApplies) {
  auto ck = Checkpoint::open(fs::path(MOETIER_SOURCE_DIR) / kGreedyFixtures[1]);
  const ModelSpec cfg = model_spec(*ck);
  {
    DeviceDouble dev;  // a device that cannot read host memory
    ExpertStats stats;
    auto a = arena_on(dev, *ck, cfg, 2, "512MiB", stats);
    EXPECT_FALSE(a->mapped_host());
    EXPECT_EQ(a->device_table(cfg.moe_layers()[0]), -1);
    EXPECT_EQ(a->device_ids(cfg.moe_layers()[0]), nullptr);
  }
  {
    DeviceDouble dev;  // a host tier too small for every expert
    dev.maps_host = true;
    ExpertStats stats;
    auto a = arena_on(dev, *ck, cfg, 2, "64KiB", stats);
    ASSERT_LT(a->residency().config().host_slots, a->index().total_experts());
    EXPECT_FALSE(a->mapped_host());
  }
  {
    DeviceDouble dev;
    dev.maps_host = true;
    ExpertStats stats;
    auto a = arena_on(dev, *ck, cfg, 2, "512MiB", stats);
    EXPECT_TRUE(a->mapped_host());
    // A dense layer (none here) or a layer out of range has no table.
    EXPECT_EQ(a->device_table(cfg.num_layers), -1);
    EXPECT_EQ(a->device_ids(-1), nullptr);
  }
}

// The admission window (MOETIER_MAPPED_ADMIT=W): an expert read from the
// host tier enters the arena only when it was used within the last W steps;
// a first use is a host-tier hit with no copy. The same bits as the CPU
// engine, every use counted, and fewer admission copies than admitting on
// every host-tier use (W = 0).
TEST(MappedHost, AdmissionWindowChangesNoBitAndCopiesLess) {
  uint32_t seed = 950;
  const int kSteps = 10;
  uint64_t bytes[2] = {0, 0};  // all fixtures: admit always, admit within 4 steps
  const char* env = std::getenv("MOETIER_MAPPED_ADMIT");
  const std::string before = env ? env : "";
  for (const char* name : kGreedyFixtures) {
    const CpuReference cr = cpu_reference(name, 11, seed++, kSteps);
    const ModelSpec& cfg = cr.spec();
    uint64_t uses[2] = {0, 0};
    for (int w : {0, 1}) {
      const std::string what = std::string(name) + ", MOETIER_MAPPED_ADMIT=" + (w ? "4" : "0");
      ::setenv("MOETIER_MAPPED_ADMIT", w ? "4" : "0", 1);
      DeviceDouble dev;
      dev.maps_host = true;
      const std::unique_ptr<Model> model = load_model(*cr.ck, dev);
      ExpertStats stats;
      auto arena = arena_on(dev, *cr.ck, cfg, 3, "512MiB", stats);
      env ? (void)::setenv("MOETIER_MAPPED_ADMIT", before.c_str(), 1)
          : (void)::unsetenv("MOETIER_MAPPED_ADMIT");
      ASSERT_TRUE(arena->mapped_host()) << what;
      std::vector<uint64_t> copies{0, 0};
      expect_identical_runs(cr.run, session_run(*model, *arena, cr.prompt, kSteps, dev, copies),
                            what);
      arena->drain();
      const LayerCounters t = stats.total();
      EXPECT_EQ(t.misses, 0u) << what;
      EXPECT_EQ(t.hits() + t.misses, t.uses) << what;
      uses[w] = t.uses;
      bytes[w] += dev.async_copy_bytes();
    }
    EXPECT_EQ(uses[0], uses[1]) << name;
  }
  EXPECT_LT(bytes[1], bytes[0]);
}
