// experts/: the index and the arena-backed provider on every fixture. Every
// view's bytes equal the checkpoint's (read independently through the mmap),
// at several arena sizes, both phases, with and without the host tier; the
// counter identities hold.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "core/error.h"
#include "experts/arena_experts.h"
#include "experts/index.h"
#include "format/safetensors.h"
#include "model/architecture.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

const char* kFixtures[] = {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"};

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

struct Part {
  std::span<const std::byte> data, scales;
};

// The expert's three matrices as the mmap sees them (independent of the index).
std::vector<Part> reference(const Checkpoint& ck, const ModelSpec& c, int64_t l, int64_t e) {
  ExpertTensors t = expert_tensors(ck, c, l, e);
  const uint64_t H = uint64_t(c.hidden_size), I = uint64_t(c.expert_intermediate);
  if (t.layout == ExpertLayout::Stacked) {
    const TensorInfo& gu = ck.get(t.gate);
    const TensorInfo& dn = ck.get(t.down);
    uint64_t es = dtype_size(gu.dtype), m = I * H * es;
    auto g = ck.bytes(gu).subspan(uint64_t(e) * 2 * m);
    return {{g.subspan(0, m), {}},
            {g.subspan(m, m), {}},
            {ck.bytes(dn).subspan(uint64_t(e) * m, m), {}}};
  }
  std::vector<Part> out;
  const std::string* w[3] = {&t.gate, &t.up, &t.down};
  const std::string* s[3] = {&t.gate_scale, &t.up_scale, &t.down_scale};
  for (int p = 0; p < 3; ++p) {
    Part part{ck.bytes(ck.get(*w[p])), {}};
    if (!s[p]->empty()) part.scales = ck.bytes(ck.get(*s[p]));
    out.push_back(part);
  }
  return out;
}

uint64_t data_bytes(const MatView& m) {
  switch (m.enc) {
    case WeightEncoding::F32:
      return uint64_t(m.rows * m.cols) * 4;
    case WeightEncoding::BF16:
      return uint64_t(m.rows * m.cols) * 2;
    case WeightEncoding::MXFP4:
      return uint64_t(m.rows * m.cols) / 2;
    default:
      return 0;
  }
}

void expect_same(const ExpertView& v, const std::vector<Part>& ref, const std::string& what) {
  const MatView* m[3] = {&v.gate, &v.up, &v.down};
  for (int p = 0; p < 3; ++p) {
    ASSERT_EQ(data_bytes(*m[p]), ref[p].data.size()) << what;
    ASSERT_EQ(std::memcmp(m[p]->data, ref[p].data.data(), ref[p].data.size()), 0)
        << what << " part " << p;
    if (!ref[p].scales.empty()) {
      ASSERT_NE(m[p]->scales, nullptr);
      ASSERT_EQ(uint64_t(m[p]->rows * m[p]->cols / 32), ref[p].scales.size());
      ASSERT_EQ(std::memcmp(m[p]->scales, ref[p].scales.data(), ref[p].scales.size()), 0) << what;
    } else {
      ASSERT_EQ(m[p]->scales, nullptr);
    }
  }
}

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  ModelSpec cfg;
  std::vector<int64_t> moe_layers;
  explicit Loaded(const fs::path& dir) : ck(Checkpoint::open(dir)) {
    cfg = model_spec(*ck);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      if (cfg.is_moe_layer(l)) moe_layers.push_back(l);
    }
  }
};

}  // namespace

TEST(ExpertIndex, RangesCoverEveryExpertTensor) {
  for (const char* name : kFixtures) {
    Loaded m(fixture(name));
    ExpertIndex ix = ExpertIndex::build(*m.ck, m.cfg);
    EXPECT_EQ(ix.total_experts(), m.moe_layers.size() * size_t(m.cfg.num_experts)) << name;
    EXPECT_EQ(ix.slot_bytes() % 4096, 0u);
    uint64_t total = 0;
    for (int64_t l : m.moe_layers) {
      for (int64_t e = 0; e < m.cfg.num_experts; ++e) {
        const ExpertRecord& r = ix.record(l, e);
        auto ref = reference(*m.ck, m.cfg, l, e);
        uint64_t want = 0;
        for (const Part& p : ref) want += p.data.size() + p.scales.size();
        EXPECT_EQ(r.bytes, want) << name;
        EXPECT_LE(r.slot_bytes, ix.slot_bytes());
        EXPECT_LE(r.extents.size(), r.ranges.size());
        for (const ByteRange& b : r.ranges) {
          const Extent* in = nullptr;
          for (const Extent& x : r.extents) {
            if (x.shard == b.shard && x.offset <= b.offset &&
                b.offset + b.length <= x.offset + x.length)
              in = &x;
          }
          ASSERT_NE(in, nullptr) << name << " " << b.tensor;
        }
        total += r.bytes;
      }
    }
    EXPECT_EQ(ix.total_bytes(), total);
    int64_t dense = -1;
    for (int64_t l = 0; l < m.cfg.num_layers; ++l) {
      if (!m.cfg.is_moe_layer(l)) dense = l;
    }
    if (dense >= 0) {
      EXPECT_THROW(ix.record(dense, 0), Error);
    }
    EXPECT_THROW(ix.record(m.moe_layers[0], m.cfg.num_experts), Error);
  }
}

// Random acquires in both phases; every view checked byte for byte.
void run_random(const char* name, double arena_fraction, size_t transient, size_t host,
                PolicyKind policy, uint32_t seed) {
  Loaded m(fixture(name));
  ExpertIndex ix = ExpertIndex::build(*m.ck, m.cfg);
  const uint64_t expert_bytes = ix.expert_bytes();
  const size_t total = ix.total_experts();
  ArenaConfig ac;
  ac.hot_slots = std::max<size_t>(size_t(double(total) * arena_fraction), 1);
  ac.transient_slots = transient;
  ac.host_slots = host;
  ac.policy = policy;
  ExpertStats stats;
  ArenaExperts arena(std::move(ix), ac, &stats);
  const int64_t E = m.cfg.num_experts, k = m.cfg.experts_per_token;
  std::mt19937 rng(seed);
  std::vector<ExpertView> views;
  uint64_t acquired = 0;
  for (int it = 0; it < 400; ++it) {
    int64_t l = m.moe_layers[rng() % m.moe_layers.size()];
    Phase ph = rng() % 4 == 0 ? Phase::Prefill : Phase::Decode;
    int64_t n =
        1 + int64_t(rng() % uint64_t(std::min(arena.max_batch(), ph == Phase::Decode ? k : E)));
    std::set<int32_t> pick;
    while (int64_t(pick.size()) < n) pick.insert(int32_t(rng() % uint64_t(E)));
    std::vector<int32_t> ids(pick.begin(), pick.end());
    std::shuffle(ids.begin(), ids.end(), rng);
    arena.acquire(l, ids, ph, views);
    ASSERT_EQ(views.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      expect_same(
          views[i], reference(*m.ck, m.cfg, l, ids[i]),
          std::string(name) + " layer " + std::to_string(l) + " expert " + std::to_string(ids[i]));
    }
    acquired += ids.size();
  }
  LayerCounters t = stats.total();
  EXPECT_EQ(t.uses, acquired);
  EXPECT_EQ(t.hits() + t.misses, t.uses);
  EXPECT_EQ(t.read_bytes, t.misses * expert_bytes);  // every expert has the same size here
  EXPECT_GE(stats.aligned_read_bytes, t.read_bytes);
  EXPECT_EQ(stats.failed_acquires, 0u);
  if (arena_fraction < 0.5) {  // something was evicted and re-read
    EXPECT_GT(t.misses, total);
  }
  if (host) {
    EXPECT_GT(t.hits_host, 0u);
  }
  EXPECT_GT(t.hits_hot, 0u);
}

TEST(ArenaExperts, ViewsMatchCheckpointAtEveryArenaSize) {
  uint32_t seed = 1;
  for (const char* name : kFixtures) {
    for (double f : {1.0, 0.5, 0.25, 0.1}) {
      SCOPED_TRACE(std::string(name) + " arena " + std::to_string(f));
      run_random(name, f, 8, 0, PolicyKind::Lru, seed++);
    }
  }
}

TEST(ArenaExperts, HostTierAndOtherPolicies) {
  run_random("qwen3moe-mxfp4", 0.1, 4, 16, PolicyKind::Lru, 11);
  run_random("qwen3moe-sharded", 0.25, 2, 3, PolicyKind::Lfu, 12);
  run_random("qwen3moe-bf16", 0.25, 0, 5, PolicyKind::Lfu, 13);
}

TEST(ArenaExperts, AllHitShareFollowsRouting) {
  Loaded m(fixture("qwen3moe-bf16"));
  ArenaConfig ac;
  ac.hot_slots = 8;
  ac.transient_slots = 4;
  ExpertStats stats;
  ArenaExperts arena(ExpertIndex::build(*m.ck, m.cfg), ac, &stats);
  int64_t l = m.moe_layers[0];
  std::vector<ExpertView> v;
  std::vector<int32_t> a{1, 2, 3, 4};
  arena.acquire(l, a, Phase::Decode, v);  // all misses
  arena.note_routing(l, a, 4);
  std::vector<int32_t> b{4, 3, 2, 5};
  arena.acquire(l, b, Phase::Decode, v);  // 5 misses
  std::vector<int32_t> topk{4, 3, 2, 5, /* token 2 */ 2, 3, 4, 1};
  arena.note_routing(l, topk, 4);  // token 1 misses on 5; token 2: 1 was acquired earlier (miss)
  arena.acquire(l, a, Phase::Decode, v);  // all hits
  arena.note_routing(l, a, 4);
  LayerCounters t = stats.total();
  EXPECT_EQ(t.steps, 4u);
  EXPECT_EQ(t.all_hit_steps, 1u);
  EXPECT_THROW(arena.note_routing(l, std::vector<int32_t>{1, 2, 3}, 4), Error);
  EXPECT_EQ(t.uses, 12u);
  EXPECT_EQ(t.misses, 5u);
  EXPECT_EQ(t.hits_hot, 7u);
  EXPECT_NE(stats.format().find("all-k-hit"), std::string::npos);
  nlohmann::json j = stats.to_json();
  EXPECT_EQ(j["total"]["uses"], 12);
  EXPECT_EQ(j["total"]["reads"]["count"], 5);
  EXPECT_DOUBLE_EQ(j["total"]["all_hit_share"].get<double>(), 0.25);
}

TEST(ArenaExperts, BadRequestsAreErrors) {
  Loaded m(fixture("qwen3moe-bf16"));
  ArenaConfig ac;
  ac.hot_slots = 6;
  ac.transient_slots = 3;
  ArenaExperts arena(ExpertIndex::build(*m.ck, m.cfg), ac, nullptr);
  EXPECT_EQ(arena.max_batch(), 3);
  std::vector<ExpertView> v;
  std::vector<int32_t> ok{1, 2}, many{1, 2, 3, 4}, out{99};
  EXPECT_THROW(arena.acquire(1, ok, Phase::Decode, v), Error);  // layer 1 is dense
  EXPECT_THROW(arena.acquire(0, many, Phase::Decode, v), Error);
  EXPECT_THROW(arena.acquire(0, out, Phase::Decode, v), Error);
  std::vector<int32_t> dup{2, 2, 1};  // duplicates share one view
  arena.acquire(0, dup, Phase::Decode, v);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].gate.data, v[1].gate.data);
  EXPECT_EQ(arena.stats().total().uses, 2u);
}

// The host tier's copies run in load jobs, out of order with each other
// (demand before prefetch, inline waits): two tickets open at a time,
// prefetch hints in between, a host tier too small for the model (its LRU
// slots are reused while earlier jobs may still copy from them). Every view
// must still be the checkpoint's bytes, and the host tier must have served.
TEST(ArenaExperts, HostTierCopiesOutOfOrderKeepEveryViewExact) {
  for (uint32_t seed : {21u, 22u, 23u}) {
    Loaded m(fixture(seed == 22 ? "qwen3moe-sharded" : "qwen3moe-mxfp4"));
    ExpertIndex ix = ExpertIndex::build(*m.ck, m.cfg);
    const size_t total = ix.total_experts();
    ArenaConfig ac;
    ac.hot_slots = std::max<size_t>(total / 6, size_t(m.cfg.experts_per_token) * 2);
    ac.transient_slots = 4;
    ac.host_slots = total / 3;
    ExpertStats stats;
    ArenaExperts arena(std::move(ix), ac, &stats);
    const int64_t E = m.cfg.num_experts;
    std::mt19937 rng(seed);
    auto pick = [&](int64_t n) {
      std::set<int32_t> s;
      while (int64_t(s.size()) < n) s.insert(int32_t(rng() % uint64_t(E)));
      return std::vector<int32_t>(s.begin(), s.end());
    };
    struct Open {
      Ticket t;
      int64_t layer;
      std::vector<int32_t> ids;
    };
    std::vector<Open> open;
    std::vector<ExpertView> views;
    const int64_t half = std::max<int64_t>(1, arena.max_batch() / 2);
    for (int it = 0; it < 300; ++it) {
      const int64_t l = m.moe_layers[rng() % m.moe_layers.size()];
      const Phase ph = rng() % 3 == 0 ? Phase::Prefill : Phase::Decode;
      if (rng() % 3 == 0) arena.prefetch(l, pick(1 + int64_t(rng() % 3)), ph);
      std::vector<int32_t> ids = pick(1 + int64_t(rng() % uint64_t(half)));
      if (!open.empty() && !arena.can_overlap(l, ids, ph)) {
        arena.release(open.front().t);  // as the MoE block: overlap only when it fits
        open.clear();
      }
      open.push_back({arena.submit(l, ids, ph), l, ids});
      if (open.size() == 2) {  // wait the older, check it, release it
        Open o = open.front();
        open.erase(open.begin());
        arena.wait(o.t, views);
        for (size_t i = 0; i < o.ids.size(); ++i)
          expect_same(views[i], reference(*m.ck, m.cfg, o.layer, o.ids[i]),
                      "seed " + std::to_string(seed) + " layer " + std::to_string(o.layer) +
                          " expert " + std::to_string(o.ids[i]));
        arena.release(o.t);
      }
    }
    for (Open& o : open) {
      arena.wait(o.t, views);
      for (size_t i = 0; i < o.ids.size(); ++i)
        expect_same(views[i], reference(*m.ck, m.cfg, o.layer, o.ids[i]), "last");
      arena.release(o.t);
    }
    arena.drain();
    const LayerCounters t = stats.total();
    EXPECT_GT(t.hits_host, 0u) << seed;
    EXPECT_GT(stats.host_copy_bytes, 0u) << seed;
    EXPECT_EQ(t.hits() + t.misses, t.uses) << seed;
    EXPECT_EQ(arena.open_tickets(), 0u);
    EXPECT_GE(stats.prefault_bytes,
              (ac.hot_slots + ac.transient_slots + ac.host_slots) * stats.slot_bytes);
  }
}
