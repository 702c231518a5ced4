// experts/: the asynchronous provider protocol of ArenaExperts. submit / wait /
// release with views that match the checkpoint; pinned views survive
// pressure and two sessions share one expert; batch 2 is submitted while
// batch 1 is held (and refused beside it when it would need its slots);
// prefetch is counted as used or wasted; a failed prefetch read is read again
// on demand; a failed overlapped batch leaves the other intact.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"
#include "experts/arena_experts.h"
#include "format/safetensors.h"
#include "io/fault.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

struct FaultGuard {
  ~FaultGuard() { io::FaultInjector::global().disarm(); }
};

// The MXFP4 fixture (2 MoE layers of 32 experts) with an arena of the given size.
struct Rig {
  std::unique_ptr<Checkpoint> ck;
  ModelSpec cfg;
  ExpertStats stats;
  std::unique_ptr<MappedExperts> mapped;
  std::unique_ptr<ArenaExperts> arena;
  explicit Rig(size_t hot, size_t ring, size_t host = 0) {
    ck = Checkpoint::open(fixture("qwen3moe-mxfp4"));
    cfg = model_spec(*ck);
    mapped = std::make_unique<MappedExperts>(*ck, cfg);
    ArenaConfig ac;
    ac.hot_slots = hot;
    ac.transient_slots = ring;
    ac.host_slots = host;
    arena = std::make_unique<ArenaExperts>(ExpertIndex::build(*ck, cfg), ac, &stats);
  }
  ExpertKey key(int64_t l, int32_t e) const { return arena->index().key(l, e); }
  // Every matrix and scale of the view equals the checkpoint's bytes.
  bool same(int64_t layer, int32_t e, const ExpertView& v) const {
    const ExpertView& r = mapped->view(layer, e);
    for (auto [a, b] : {std::pair{&v.gate, &r.gate}, {&v.up, &r.up}, {&v.down, &r.down}}) {
      const size_t n = size_t(a->rows * a->cols);
      if (std::memcmp(a->data, b->data, n / 2) != 0) return false;
      if (std::memcmp(a->scales, b->scales, n / 32) != 0) return false;
    }
    return true;
  }
  bool all_same(int64_t layer, const std::vector<int32_t>& ids, const std::vector<ExpertView>& v) {
    if (v.size() != ids.size()) return false;
    for (size_t i = 0; i < ids.size(); ++i)
      if (!same(layer, ids[i], v[i])) return false;
    return true;
  }
};

std::vector<int32_t> iota(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[size_t(i)] = from + i;
  return v;
}

}  // namespace

TEST(ExpertAsync, SubmitWaitReleaseMatchesTheCheckpoint) {
  Rig r(8, 4);
  const std::vector<int32_t> ids{3, 1, 2, 1};
  Ticket t = r.arena->submit(0, ids, Phase::Decode);
  EXPECT_EQ(r.arena->open_tickets(), 1u);
  std::vector<ExpertView> v;
  r.arena->wait(t, v);
  EXPECT_TRUE(r.all_same(0, ids, v));
  EXPECT_EQ(v[1].gate.data, v[3].gate.data);  // duplicates share one view
  EXPECT_THROW(r.arena->wait(t, v), Error);   // waited twice
  r.arena->release(t);
  EXPECT_EQ(r.arena->open_tickets(), 0u);
  EXPECT_THROW(r.arena->release(t), Error);  // released twice
  EXPECT_THROW(r.arena->wait(t, v), Error);
  EXPECT_EQ(r.arena->residency().held_slots(), 0u);
  EXPECT_EQ(r.stats.total().uses, 3u);
  EXPECT_EQ(r.stats.total().misses, 3u);
  // A ticket released without a wait is cancelled: its uses are not counted.
  Ticket c = r.arena->submit(1, std::vector<int32_t>{4, 5}, Phase::Decode);
  r.arena->release(c);
  EXPECT_EQ(r.stats.total().uses, 3u);
  EXPECT_EQ(r.arena->loads_in_flight(), 0u);
  EXPECT_EQ(r.arena->residency().held_slots(), 0u);
}

TEST(ExpertAsync, PinnedViewsSurvivePressureAndSessionsShare) {
  Rig r(6, 3);
  std::vector<ExpertView> va, vb;
  const std::vector<int32_t> a{0, 1}, b{1, 5};
  Ticket ta = r.arena->submit(0, a, Phase::Decode);  // session A
  r.arena->wait(ta, va);
  Ticket tb = r.arena->submit(0, b, Phase::Decode);  // session B shares expert 1
  r.arena->wait(tb, vb);
  EXPECT_EQ(va[1].gate.data, vb[0].gate.data);
  EXPECT_EQ(r.arena->residency().refs(r.arena->residency().slot_of(r.key(0, 1))), 2u);
  std::mt19937 rng(5);
  std::vector<ExpertView> v;
  for (int i = 0; i < 120; ++i) {  // pressure: the pins leave 3 evictable hot slots
    const Phase ph = i % 4 ? Phase::Decode : Phase::Prefill;
    std::vector<int32_t> ids{int32_t(8 + rng() % 24)};
    r.arena->acquire(int64_t(rng() % 2), ids, ph, v);
    ASSERT_TRUE(r.all_same(0, a, va)) << i;
    ASSERT_TRUE(r.all_same(0, b, vb)) << i;
  }
  r.arena->release_acquired();
  EXPECT_GT(r.stats.total().hot_evictions, 50u);
  r.arena->release(ta);  // 0 may go now; 1 stays, B still holds it
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> ids{int32_t(8 + i % 24)};
    r.arena->acquire(0, ids, Phase::Decode, v);
  }
  r.arena->release_acquired();
  EXPECT_EQ(r.arena->residency().where(r.key(0, 0)), Tier::Storage);
  EXPECT_NE(r.arena->residency().where(r.key(0, 1)), Tier::Storage);
  EXPECT_TRUE(r.all_same(0, b, vb));
  r.arena->release(tb);
  EXPECT_EQ(r.arena->residency().held_slots(), 0u);
}

TEST(ExpertAsync, BatchTwoIsSubmittedWhileBatchOneIsHeld) {
  {
    Rig r(4, 16);  // max_batch 4; the ring holds four batches
    ASSERT_EQ(r.arena->max_batch(), 4);
    std::vector<ExpertView> v1, v2;
    const auto b1 = iota(0, 4), b2 = iota(4, 4);
    Ticket t1 = r.arena->submit(0, b1, Phase::Prefill);
    r.arena->wait(t1, v1);
    ASSERT_TRUE(r.arena->can_overlap(0, b2, Phase::Prefill));
    Ticket t2 = r.arena->submit(0, b2, Phase::Prefill);  // its reads run while batch 1 computes
    EXPECT_EQ(r.stats.overlapped_submits, 1u);
    EXPECT_TRUE(r.all_same(0, b1, v1));  // batch 1 untouched while batch 2 loads
    r.arena->wait(t2, v2);
    EXPECT_TRUE(r.all_same(0, b1, v1));
    EXPECT_TRUE(r.all_same(0, b2, v2));
    r.arena->release(t1);
    r.arena->release(t2);
  }
  {
    Rig r(4, 4);  // max_batch 4; the ring holds one batch
    std::vector<ExpertView> v;
    r.arena->acquire(0, iota(0, 4), Phase::Decode, v);  // the hot set is full
    r.arena->release_acquired();
    const auto b1 = iota(4, 4), b2 = iota(8, 4);
    Ticket t1 = r.arena->submit(0, b1, Phase::Prefill);  // into the ring
    r.arena->wait(t1, v);
    // Batch 2 would recycle batch 1's ring slots: not beside it.
    EXPECT_FALSE(r.arena->can_overlap(0, b2, Phase::Prefill));
    // Asked anyway, the placement has no room and says so; batch 1 is intact.
    try {
      r.arena->submit(0, b2, Phase::Prefill);
      ADD_FAILURE() << "submit beside a full ring of held slots succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("held"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(r.all_same(0, b1, v));
    r.arena->release(t1);
    EXPECT_TRUE(r.arena->can_overlap(0, b2, Phase::Prefill));
    r.arena->acquire(0, b2, Phase::Prefill, v);
    EXPECT_TRUE(r.all_same(0, b2, v));
    r.arena->release_acquired();
  }
}

TEST(ExpertAsync, PrefetchedExpertsAreCountedUsedOrWasted) {
  Rig r(6, 0);
  const uint64_t eb = r.arena->index().expert_bytes();
  r.arena->prefetch(0, std::vector<int32_t>{1, 2, 3, 1}, Phase::Decode);
  EXPECT_EQ(r.stats.prefetch.hints, 3u);
  EXPECT_EQ(r.stats.prefetch.issued, 3u);
  EXPECT_EQ(r.stats.prefetch.read_bytes, 3 * eb);
  std::vector<ExpertView> v;
  r.arena->acquire(0, std::vector<int32_t>{1}, Phase::Decode, v);  // waits if still loading
  EXPECT_TRUE(r.same(0, 1, v[0]));
  r.arena->release_acquired();
  EXPECT_EQ(r.stats.prefetch.used, 1u);
  LayerCounters t = r.stats.total();
  EXPECT_EQ(t.misses, 0u);
  EXPECT_EQ(t.hits_hot + t.hits_loading, 1u);
  EXPECT_EQ(r.stats.prefetch.late, t.hits_loading);
  r.arena->prefetch(0, std::vector<int32_t>{1, 2}, Phase::Decode);  // resident or loading
  EXPECT_EQ(r.stats.prefetch.redundant, 2u);
  for (int32_t e = 10; e < 20; ++e) {  // pressure evicts the unused 2 and 3
    r.arena->acquire(0, std::vector<int32_t>{e}, Phase::Decode, v);
    r.arena->release_acquired();
  }
  EXPECT_EQ(r.stats.prefetch.wasted, 2u);
  t = r.stats.total();
  EXPECT_EQ(t.hits() + t.misses, t.uses);
  EXPECT_EQ(t.read_bytes, t.misses * eb);
  const auto j = r.stats.to_json();
  EXPECT_EQ(j["prefetch"]["used"], 1);
  EXPECT_EQ(j["prefetch"]["wasted"], 2);
  EXPECT_NE(r.stats.format().find("prefetch: 5 hints"), std::string::npos) << r.stats.format();
}

TEST(ExpertAsync, PrefetchNeverDisturbsHeldTickets) {
  Rig r(4, 2);
  std::vector<ExpertView> v;
  const auto held = iota(0, 2);
  Ticket t = r.arena->submit(0, held, Phase::Decode);
  r.arena->wait(t, v);
  for (int i = 0; i < 20; ++i) {
    r.arena->prefetch(i % 2, iota(2 + (i * 5) % 26, 4), i % 3 ? Phase::Decode : Phase::Prefill);
    ASSERT_TRUE(r.all_same(0, held, v)) << i;
  }
  r.arena->drain();
  EXPECT_TRUE(r.all_same(0, held, v));
  EXPECT_GT(r.stats.prefetch.issued, 0u);
  EXPECT_GT(r.stats.prefetch.dropped, 0u);
  r.arena->release(t);
  EXPECT_EQ(r.arena->residency().held_slots(), 0u);
}

TEST(ExpertAsync, AFailedPrefetchReadIsReadAgainOnDemand) {
  FaultGuard guard;
  Rig r(6, 2);
  io::FaultSpec spec;
  spec.kind = io::FaultKind::Eio;  // the next read fails: the prefetch's
  io::FaultInjector::global().arm(spec);
  r.arena->prefetch(0, std::vector<int32_t>{7}, Phase::Decode);
  std::vector<ExpertView> v;
  r.arena->acquire(0, std::vector<int32_t>{7}, Phase::Decode, v);
  EXPECT_TRUE(r.same(0, 7, v[0]));
  r.arena->release_acquired();
  EXPECT_EQ(io::FaultInjector::global().fired(), 1u);
  EXPECT_EQ(r.stats.prefetch.failed, 1u);
  EXPECT_EQ(r.stats.prefetch.used, 0u);
  EXPECT_EQ(r.stats.failed_acquires, 0u);
  EXPECT_EQ(r.stats.total().misses, 1u);  // read again by the request
}

TEST(ExpertAsync, AFailedOverlappedBatchLeavesTheOtherIntact) {
  FaultGuard guard;
  Rig r(4, 16);
  std::vector<ExpertView> v1, v2;
  const auto b1 = iota(0, 4), b2 = iota(4, 4);
  Ticket t1 = r.arena->submit(1, b1, Phase::Prefill);
  r.arena->wait(t1, v1);
  io::FaultSpec spec;
  spec.kind = io::FaultKind::Corrupt;
  spec.count = 0;
  io::FaultInjector::global().arm(spec);
  ASSERT_TRUE(r.arena->can_overlap(1, b2, Phase::Prefill));
  Ticket t2 = r.arena->submit(1, b2, Phase::Prefill);
  std::string err;
  try {
    r.arena->wait(t2, v2);
  } catch (const Error& e) {
    err = e.what();
  }
  io::FaultInjector::global().disarm();
  EXPECT_TRUE(v2.empty());
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find("fail validation"), std::string::npos) << err;
  EXPECT_NE(err.find("layer 1 expert"), std::string::npos) << err;
  EXPECT_THROW(r.arena->release(t2), Error);  // the failed wait finished it
  for (int32_t e : b2) EXPECT_EQ(r.arena->residency().where(r.key(1, e)), Tier::Storage);
  EXPECT_TRUE(r.all_same(1, b1, v1));
  EXPECT_EQ(r.stats.failed_acquires, 1u);
  r.arena->release(t1);
  r.arena->acquire(1, b2, Phase::Prefill, v2);
  EXPECT_TRUE(r.all_same(1, b2, v2));
  r.arena->release_acquired();
  EXPECT_EQ(r.arena->residency().held_slots(), 0u);
  EXPECT_EQ(r.stats.total().uses, 8u);
}
