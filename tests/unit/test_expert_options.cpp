// experts/options: arena sizing from --arena BYTES / N% / --arena-experts,
// the default ring, the pinned limit, the host tier, and refused combinations.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "model/architecture.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

struct Model {
  std::unique_ptr<Checkpoint> ck;
  ModelSpec cfg;
  std::unique_ptr<ExpertIndex> ix;
  Model() {
    fs::path dir = fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures/qwen3moe-mxfp4";
    ck = Checkpoint::open(dir);
    cfg = model_spec(*ck);
    ix = std::make_unique<ExpertIndex>(ExpertIndex::build(*ck, cfg));
  }
  ArenaConfig resolve(const ExpertOptions& o, std::string* why = nullptr) {
    return resolve_arena_config(*ix, cfg, o, why);
  }
};

}  // namespace

TEST(ExpertOptions, SizingRules) {
  EXPECT_EQ(default_transient_slots(1000, 256, 8), 125u);
  EXPECT_EQ(default_transient_slots(10, 256, 8), 8u);
  EXPECT_EQ(default_transient_slots(100000, 256, 8), 256u);
  EXPECT_EQ(pinned_limit(100, 8), 75u);
  EXPECT_EQ(pinned_limit(20, 8), 12u);
  EXPECT_EQ(pinned_limit(8, 8), 0u);
}

TEST(ExpertOptions, ArenaSizes) {
  Model m;  // 2 MoE layers x 32 experts, k = 8
  const size_t total = m.ix->total_experts(), slot = m.ix->slot_bytes();
  ASSERT_EQ(total, 64u);
  ExpertOptions o;
  o.arena = "10%";
  std::string why;
  ArenaConfig a = m.resolve(o, &why);
  EXPECT_EQ(a.hot_slots, 7u);  // ceil(6.4)
  EXPECT_EQ(a.transient_slots, 8u);
  EXPECT_NE(why.find("7 hot + 8 transient"), std::string::npos) << why;
  o.arena = "100%";
  EXPECT_EQ(m.resolve(o).hot_slots, 64u);
  o.arena = std::to_string(slot * 5 + slot / 2);  // bytes: 5.5 slots
  EXPECT_EQ(m.resolve(o).hot_slots, 5u);
  o.arena = "1GiB";  // more than the model: capped
  a = m.resolve(o, &why);
  EXPECT_EQ(a.hot_slots, total);
  EXPECT_NE(why.find("capped"), std::string::npos);
  o.arena.clear();
  o.arena_experts = 9;
  o.transient = 0;
  o.host_cache = std::to_string(slot * 3);
  o.policy = "lfu";
  a = m.resolve(o);
  EXPECT_EQ(a.hot_slots, 9u);
  EXPECT_EQ(a.transient_slots, 0u);
  EXPECT_EQ(a.host_slots, 3u);
  EXPECT_EQ(a.policy, PolicyKind::Lfu);
}

TEST(ExpertOptions, DefaultsFromMemAvailable) {
  Model m;
  ExpertOptions o;
  std::string why;
  ArenaConfig a = m.resolve(o, &why);
  EXPECT_EQ(a.hot_slots, m.ix->total_experts());  // a tiny model fits
  EXPECT_GT(a.transient_slots, 0u);
  EXPECT_NE(why.find("MemAvailable"), std::string::npos) << why;
}

TEST(ExpertOptions, PinnedNeedsARankingAndLeavesRoomForLru) {
  Model m;
  auto dir = fs::temp_directory_path() / ("moetier_opts_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "r.txt") << "0 1\n1 2\n0 3\n1 4\n0 5\n";
  ExpertOptions o;
  o.arena_experts = 20;
  o.policy = "pinned";
  EXPECT_THROW(m.resolve(o), Error);
  o.ranking = (dir / "r.txt").string();
  ArenaConfig a = m.resolve(o);
  EXPECT_EQ(a.ranking.size(), 5u);
  EXPECT_EQ(a.max_pinned, 12u);  // 20 - max(8, 5)
  o.policy = "lru";
  EXPECT_THROW(m.resolve(o), Error);  // a ranking without the pinned policy
  fs::remove_all(dir);
}

TEST(ExpertOptions, RefusedCombinations) {
  Model m;
  auto refused = [&](auto set) {
    ExpertOptions o;
    set(o);
    EXPECT_THROW(m.resolve(o), Error);
  };
  refused([](ExpertOptions& o) {
    o.arena = "1GiB";
    o.arena_experts = 3;
  });
  refused([](ExpertOptions& o) { o.arena = "0%"; });
  refused([](ExpertOptions& o) { o.arena = "150%"; });
  refused([](ExpertOptions& o) { o.arena = "x%"; });
  refused([](ExpertOptions& o) { o.arena = "100"; });  // fewer bytes than one slot
  refused([](ExpertOptions& o) { o.arena_experts = 0; });
  refused([](ExpertOptions& o) { o.transient = -2; });
  refused([](ExpertOptions& o) { o.policy = "fifo"; });
  refused([](ExpertOptions& o) { o.io = "aio"; });
  refused([](ExpertOptions& o) { o.io_depth = 0; });
  refused([](ExpertOptions& o) { o.host_cache = "lots"; });
}
