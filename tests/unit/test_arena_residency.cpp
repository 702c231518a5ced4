// experts/residency: the arena state machine. Decode matches a reference LRU
// cache exactly; prefill never evicts a hot expert; promotion, the host tier,
// abort, and the counter identities.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <random>
#include <set>

#include "core/error.h"
#include "experts/residency.h"
#include "experts/stats.h"

using namespace moetier;

namespace {

Residency make(size_t keys, size_t hot, size_t ring, size_t host = 0,
               PolicyKind kind = PolicyKind::Lru) {
  return Residency({keys, hot, ring, host}, make_policy(kind, keys));
}

// Distinct random keys of one "layer" [layer*E, layer*E + E).
std::vector<ExpertKey> draw(std::mt19937& rng, size_t n, uint32_t layer, uint32_t E) {
  std::vector<ExpertKey> all(E);
  for (uint32_t e = 0; e < E; ++e) all[e] = layer * E + e;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// Every resident key has its own slot; counts are within capacity.
void check_consistent(const Residency& r, size_t keys) {
  std::set<int32_t> slots;
  size_t hot = 0, ring = 0;
  for (ExpertKey k = 0; k < keys; ++k) {
    Tier t = r.where(k);
    if (t == Tier::Hot || t == Tier::Transient) {
      ASSERT_TRUE(slots.insert(r.slot_of(k)).second) << "slot shared, key " << k;
      (t == Tier::Hot ? hot : ring)++;
    } else {
      ASSERT_EQ(r.slot_of(k), -1);
    }
  }
  EXPECT_EQ(hot, r.hot_count());
  EXPECT_EQ(ring, r.ring_count());
  EXPECT_LE(hot, r.config().hot_slots);
  EXPECT_LE(ring, r.config().transient_slots);
}

}  // namespace

TEST(Residency, DecodeMatchesReferenceLru) {
  const uint32_t L = 3, E = 16;
  const size_t N = 11, k = 4;
  Residency r = make(L * E, N, 0);
  std::list<ExpertKey> ref;  // front = LRU
  std::mt19937 rng(42);
  std::geometric_distribution<int> skew(0.25);
  ExpertStats stats;
  stats.resize_layers(L);
  uint64_t ref_hits = 0, ref_misses = 0;
  for (int step = 0; step < 3000; ++step) {
    uint32_t layer = step % L;
    std::set<ExpertKey> pick;
    while (pick.size() < k) pick.insert(layer * E + std::min<uint32_t>(E - 1, skew(rng)) * 3 % E);
    std::vector<ExpertKey> keys(pick.begin(), pick.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    Plan p;
    r.plan(keys, Phase::Decode, p);
    // Reference: uses refresh recency first, then misses evict the LRU unlocked key.
    std::vector<bool> hit(k);
    for (size_t i = 0; i < k; ++i) {
      auto it = std::find(ref.begin(), ref.end(), keys[i]);
      hit[i] = it != ref.end();
      if (hit[i]) ref.splice(ref.end(), ref, it);
    }
    for (size_t i = 0; i < k; ++i) {
      if (hit[i]) continue;
      if (ref.size() == N) {
        auto v = std::find_if(ref.begin(), ref.end(), [&](ExpertKey x) {
          return std::find(keys.begin(), keys.end(), x) == keys.end();
        });
        ref.erase(v);
      }
      ref.push_back(keys[i]);
    }
    for (size_t i = 0; i < k; ++i) {
      ASSERT_EQ(p.steps[i].found == Tier::Hot, hit[i]) << "step " << step;
      ASSERT_EQ(p.steps[i].loading, !hit[i]);
      (hit[i] ? ref_hits : ref_misses)++;
    }
    r.commit(p);
    stats.record(layer, p, [](ExpertKey) { return 1000; });
  }
  std::vector<ExpertKey> ref_sorted(ref.begin(), ref.end());
  std::sort(ref_sorted.begin(), ref_sorted.end());
  EXPECT_EQ(r.hot_keys(), ref_sorted);
  check_consistent(r, L * E);
  LayerCounters t = stats.total();
  EXPECT_EQ(t.uses, 3000 * k);
  EXPECT_EQ(t.hits() + t.misses, t.uses);
  EXPECT_EQ(t.hits_hot, ref_hits);
  EXPECT_EQ(t.misses, ref_misses);
  EXPECT_EQ(t.read_bytes, t.misses * 1000);
  EXPECT_GT(t.hits_hot, 0u);
  EXPECT_GT(t.misses, N);
}

TEST(Residency, PrefillNeverEvictsTheHotSet) {
  const uint32_t L = 2, E = 32;
  const size_t N = 12, M = 6;
  Residency r = make(L * E, N, M);
  std::mt19937 rng(1);
  // Decode fills the hot set.
  for (int i = 0; i < 20; ++i) {
    Plan p;
    r.plan(draw(rng, 4, i % L, E), Phase::Decode, p);
    r.commit(p);
  }
  ASSERT_EQ(r.hot_count(), N);
  const std::vector<ExpertKey> hot = r.hot_keys();
  std::vector<int32_t> hot_slots;
  for (ExpertKey k : hot) hot_slots.push_back(r.slot_of(k));
  uint64_t ring_evictions = 0, transient_hits = 0;
  for (int i = 0; i < 200; ++i) {
    Plan p;
    r.plan(draw(rng, 1 + rng() % M, rng() % L, E), Phase::Prefill, p);
    EXPECT_EQ(p.hot_evictions, 0u);
    for (const PlanStep& st : p.steps) {
      EXPECT_EQ(st.hot, st.found == Tier::Hot);
      transient_hits += st.found == Tier::Transient;
    }
    ring_evictions += p.ring_evictions;
    r.commit(p);
    check_consistent(r, L * E);
    ASSERT_EQ(r.hot_keys(), hot) << "prefill batch " << i << " changed the hot set";
    for (size_t j = 0; j < hot.size(); ++j) ASSERT_EQ(r.slot_of(hot[j]), hot_slots[j]);
  }
  EXPECT_GT(ring_evictions, 0u);
  EXPECT_GT(transient_hits, 0u);
  EXPECT_EQ(r.ring_count(), M);
}

TEST(Residency, PrefillFillsFreeHotSlotsFirstAndDecodePromotes) {
  Residency r = make(40, 4, 3);
  Plan p;
  std::vector<ExpertKey> a{1, 2, 3};
  r.plan(a, Phase::Prefill, p);
  for (const auto& st : p.steps) EXPECT_TRUE(st.hot);  // the hot set had room
  r.commit(p);
  std::vector<ExpertKey> b{4, 5, 6};
  r.plan(b, Phase::Prefill, p);
  EXPECT_TRUE(p.steps[0].hot);
  EXPECT_FALSE(p.steps[1].hot);
  EXPECT_FALSE(p.steps[2].hot);
  r.commit(p);
  EXPECT_EQ(r.where(5), Tier::Transient);
  int32_t slot5 = r.slot_of(5);
  // Decode use of a transient expert: promoted in place, the LRU hot key leaves.
  std::vector<ExpertKey> c{5};
  r.plan(c, Phase::Decode, p);
  EXPECT_EQ(p.steps[0].found, Tier::Transient);
  EXPECT_TRUE(p.steps[0].hot);
  EXPECT_FALSE(p.steps[0].loading);
  EXPECT_EQ(p.hot_evictions, 1u);
  r.commit(p);
  EXPECT_EQ(r.where(5), Tier::Hot);
  EXPECT_EQ(r.slot_of(5), slot5);
  EXPECT_EQ(r.where(1), Tier::Storage);
  EXPECT_EQ(r.ring_count(), 1u);
  check_consistent(r, 40);
}

TEST(Residency, WithoutARingPrefillFollowsDecode) {
  Residency r = make(40, 2, 0);
  Plan p;
  std::vector<ExpertKey> a{1, 2};
  r.plan(a, Phase::Prefill, p);
  r.commit(p);
  std::vector<ExpertKey> b{3};
  r.plan(b, Phase::Prefill, p);
  EXPECT_TRUE(p.steps[0].hot);
  EXPECT_EQ(p.hot_evictions, 1u);
  r.commit(p);
  EXPECT_EQ(r.where(1), Tier::Storage);
}

TEST(Residency, HostTierCatchesEvictionsAndServesThemBack) {
  Residency r = make(50, 2, 0, 3);
  Plan p;
  for (ExpertKey k : {10u, 11u, 12u, 13u}) {  // 10 and 11 are evicted to the host tier
    std::vector<ExpertKey> one{k};
    r.plan(one, Phase::Decode, p);
    r.commit(p);
  }
  EXPECT_EQ(r.where(10), Tier::Host);
  EXPECT_EQ(r.where(11), Tier::Host);
  EXPECT_EQ(r.host_count(), 2u);
  std::vector<ExpertKey> back{10};
  r.plan(back, Phase::Decode, p);
  ASSERT_EQ(p.steps[0].found, Tier::Host);
  EXPECT_EQ(p.steps[0].host_slot, r.host_slot_of(10));
  EXPECT_TRUE(p.steps[0].loading);
  // 12 was evicted to make room: it is spilled before its slot is reused.
  ASSERT_EQ(p.spills.size(), 1u);
  EXPECT_EQ(p.spills[0].key, 12u);
  EXPECT_EQ(p.spills[0].slot, p.steps[0].slot);
  r.commit(p);
  EXPECT_EQ(r.where(10), Tier::Hot);
  EXPECT_GE(r.host_slot_of(10), 0);  // the host copy stays (inclusive)
  // The host tier is LRU: filling it past 3 drops its least recent entry (11).
  for (ExpertKey k : {14u, 15u}) {
    std::vector<ExpertKey> one{k};
    r.plan(one, Phase::Decode, p);
    r.commit(p);
  }
  EXPECT_EQ(r.host_count(), 3u);
  EXPECT_EQ(r.where(11), Tier::Storage);
}

TEST(Residency, AbortLeavesNothingBehind) {
  Residency r = make(30, 3, 3, 2);
  Plan p;
  std::vector<ExpertKey> a{1, 2};
  r.plan(a, Phase::Decode, p);
  r.commit(p);
  std::vector<ExpertKey> b{2, 3, 4};
  r.plan(b, Phase::Decode, p);
  r.abort(p);  // 3 and 4 failed to load; 1 was evicted for them
  EXPECT_EQ(r.where(2), Tier::Hot);
  EXPECT_EQ(r.where(3), Tier::Storage);
  EXPECT_EQ(r.where(4), Tier::Storage);
  EXPECT_EQ(r.where(1), Tier::Host);
  check_consistent(r, 30);
  std::vector<ExpertKey> c{3, 4, 5};
  r.plan(c, Phase::Decode, p);
  for (const auto& st : p.steps) EXPECT_EQ(st.found, Tier::Storage);
  r.commit(p);
  check_consistent(r, 30);
  EXPECT_EQ(r.hot_count(), 3u);
}

TEST(Residency, BatchLimitsAndDuplicates) {
  Residency r = make(30, 5, 3);
  EXPECT_EQ(r.max_batch(), 3u);
  Plan p;
  std::vector<ExpertKey> big{1, 2, 3, 4};
  EXPECT_THROW(r.plan(big, Phase::Decode, p), Error);
  std::vector<ExpertKey> dup{1, 1};
  EXPECT_THROW(r.plan(dup, Phase::Decode, p), Error);
  r.abort(p);
  check_consistent(r, 30);
  Residency q = make(30, 5, 0);
  EXPECT_EQ(q.max_batch(), 5u);
  Residency pinned({30, 5, 0, 0}, make_policy(PolicyKind::Pinned, 30, {1, 2, 3}, 2));
  EXPECT_EQ(pinned.max_batch(), 3u);
  EXPECT_THROW(Residency({30, 0, 4, 0}, make_policy(PolicyKind::Lru, 30)), Error);
}

TEST(Residency, RandomMixedPhasesWithAbortsStayConsistent) {
  const uint32_t L = 4, E = 24;
  for (PolicyKind kind : {PolicyKind::Lru, PolicyKind::Lfu}) {
    Residency r = make(L * E, 9, 5, 7, kind);
    std::mt19937 rng(9);
    for (int i = 0; i < 2000; ++i) {
      Phase ph = rng() % 3 ? Phase::Decode : Phase::Prefill;
      uint32_t layer = rng() % L;
      auto keys = draw(rng, 1 + rng() % r.max_batch(), layer, E);
      Plan p;
      r.plan(keys, ph, p);
      std::set<int32_t> slots;
      for (const auto& st : p.steps) {
        ASSERT_TRUE(slots.insert(st.slot).second);
        ASSERT_EQ(r.slot_of(st.key), st.slot);
      }
      if (ph == Phase::Prefill) {
        ASSERT_EQ(p.hot_evictions, 0u);
      }
      if (rng() % 10 == 0) {
        r.abort(p);
      } else {
        r.commit(p);
      }
      check_consistent(r, L * E);
    }
  }
}

// operator-= undoes operator+= on every counter (the bench's per-run differences).
TEST(LayerCounters, MinusUndoesPlus) {
  moetier::LayerCounters a, b;
  uint64_t v = 3;
  for (uint64_t* f : {&a.uses, &a.hits_hot, &a.hits_transient, &a.hits_host, &a.hits_loading,
                      &a.misses, &a.read_bytes, &a.hot_evictions, &a.ring_evictions, &a.steps,
                      &a.all_hit_steps, &a.stall_ns})
    *f = v, v = v * 7 + 1;
  b = a;
  b += a;
  b -= a;
  EXPECT_EQ(b.to_json(), a.to_json());
  b -= a;
  EXPECT_EQ(b.to_json(), moetier::LayerCounters{}.to_json());
}
