// experts/residency: the asynchronous side of the state machine. Loading is a
// real state (never a victim; a second use is in flight; abort leaves nothing);
// references keep held slots through pressure and several holders share one;
// fits() means "the same decisions as with nothing held" (the proof that
// overlapping two batches changes no counter), and holds within max_batch
// always leave room; prefetch obeys the transient-ring rule and is counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "experts/residency.h"
#include "experts/stats.h"

using namespace moetier;

namespace {

Residency make(size_t keys, size_t hot, size_t ring, size_t host = 0,
               PolicyKind kind = PolicyKind::Lru, std::vector<ExpertKey> ranking = {},
               size_t max_pinned = 0) {
  return Residency({keys, hot, ring, host}, make_policy(kind, keys, ranking, max_pinned));
}

std::vector<ExpertKey> draw(std::mt19937& rng, size_t n, uint32_t layer, uint32_t E) {
  std::vector<ExpertKey> all(E);
  for (uint32_t e = 0; e < E; ++e) all[e] = layer * E + e;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  std::sort(all.begin(), all.end());  // ascending, as the runtime asks
  return all;
}

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
      ASSERT_EQ(r.state(k), KeyState::Absent);
    }
  }
  EXPECT_EQ(hot, r.hot_count());
  EXPECT_EQ(ring, r.ring_count());
}

void expect_same_plan(const Plan& a, const Plan& b, const std::string& what) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].key, b.steps[i].key) << what;
    EXPECT_EQ(a.steps[i].found, b.steps[i].found) << what << " step " << i;
    EXPECT_EQ(a.steps[i].slot, b.steps[i].slot) << what << " step " << i;
    EXPECT_EQ(a.steps[i].hot, b.steps[i].hot) << what << " step " << i;
  }
  EXPECT_EQ(a.hot_evictions, b.hot_evictions) << what;
  EXPECT_EQ(a.ring_evictions, b.ring_evictions) << what;
  EXPECT_EQ(a.spills.size(), b.spills.size()) << what;
}

}  // namespace

TEST(ResidencyAsync, LoadingIsNeverAVictimAndAbortLeavesNothing) {
  Residency r = make(40, 2, 0);
  Plan a, b, c;
  r.plan(std::vector<ExpertKey>{1}, Phase::Decode, a);
  EXPECT_EQ(r.state(1), KeyState::Loading);
  EXPECT_EQ(r.where(1), Tier::Hot);  // its role
  r.plan(std::vector<ExpertKey>{2}, Phase::Decode, b);
  r.commit(b);
  // The hot set is full; 1 is older than 2 but Loading: the victim is 2.
  r.plan(std::vector<ExpertKey>{3}, Phase::Decode, c);
  EXPECT_EQ(c.hot_evictions, 1u);
  EXPECT_EQ(r.where(2), Tier::Storage);
  EXPECT_EQ(r.state(1), KeyState::Loading);
  r.commit(c);
  // Nothing else is evictable while 1 loads and 3 is locked by its plan... 3 is
  // committed now, so a fourth key evicts 3, never 1.
  Plan d;
  r.plan(std::vector<ExpertKey>{4}, Phase::Decode, d);
  EXPECT_EQ(r.where(3), Tier::Storage);
  r.commit(d);
  r.abort(a);  // 1's read failed
  EXPECT_EQ(r.state(1), KeyState::Absent);
  EXPECT_EQ(r.hot_count(), 1u);
  check_consistent(r, 40);
  // Its slot is free again and the key can be planned anew.
  Plan e;
  r.plan(std::vector<ExpertKey>{1}, Phase::Decode, e);
  EXPECT_EQ(e.steps[0].found, Tier::Storage);
  EXPECT_EQ(e.hot_evictions, 0u);
  r.commit(e);
  EXPECT_EQ(r.state(1), KeyState::Hot);
  check_consistent(r, 40);
}

TEST(ResidencyAsync, ASecondUseOfALoadingKeyWaitsOnTheSameLoad) {
  Residency r = make(40, 4, 2);
  Plan a, b;
  r.plan(std::vector<ExpertKey>{5, 6}, Phase::Decode, a);
  r.hold(a);
  r.plan(std::vector<ExpertKey>{6, 7}, Phase::Decode, b);
  r.hold(b);
  ASSERT_EQ(b.steps[0].key, 6u);
  EXPECT_TRUE(b.steps[0].in_flight);
  EXPECT_FALSE(b.steps[0].loading);  // no second read
  EXPECT_EQ(b.steps[0].found, Tier::Hot);
  EXPECT_EQ(b.steps[0].slot, a.steps[1].slot);
  EXPECT_EQ(r.refs(a.steps[1].slot), 2u);  // both requests hold it
  EXPECT_FALSE(b.steps[1].in_flight);
  ExpertStats s;
  s.resize_layers(1);
  s.record(0, b, [](ExpertKey) { return 10; });
  EXPECT_EQ(s.total().hits_loading, 1u);
  EXPECT_EQ(s.total().misses, 1u);
  EXPECT_EQ(s.total().hits() + s.total().misses, s.total().uses);
  r.commit(a);
  r.commit(b);
  EXPECT_EQ(r.state(6), KeyState::Hot);
  r.release(a);
  EXPECT_EQ(r.refs(b.steps[0].slot), 1u);
  r.release(b);
  EXPECT_EQ(r.held_slots(), 0u);
}

TEST(ResidencyAsync, HeldExpertsSurvivePressureUntilReleased) {
  const uint32_t E = 32;
  for (PolicyKind kind : {PolicyKind::Lru, PolicyKind::Lfu}) {
    Residency r = make(E, 6, 3, 0, kind);
    Plan held, other;
    r.plan(std::vector<ExpertKey>{1, 2}, Phase::Decode, held);
    r.commit(held);
    r.hold(held);
    r.plan(std::vector<ExpertKey>{2}, Phase::Decode, other);  // a second session shares 2
    r.commit(other);
    r.hold(other);
    EXPECT_EQ(r.refs(r.slot_of(2)), 2u);
    std::mt19937 rng(3);
    for (int i = 0; i < 300; ++i) {  // heavy pressure in both phases
      Plan p;
      const Phase ph = i % 3 ? Phase::Decode : Phase::Prefill;
      r.plan(draw(rng, 1 + rng() % 2, 0, E), ph, p);
      r.commit(p);
      ASSERT_NE(r.where(1), Tier::Storage) << i;
      ASSERT_NE(r.where(2), Tier::Storage) << i;
    }
    r.release(held);  // 1 may go now; 2 is still held by the other session
    for (int i = 0; i < 300; ++i) {
      Plan p;
      auto keys = draw(rng, 4, 0, E);  // two of them, neither 1 nor 2
      keys.erase(std::remove_if(keys.begin(), keys.end(), [](ExpertKey k) { return k <= 2; }),
                 keys.end());
      keys.resize(2);
      r.plan(keys, Phase::Decode, p);
      r.commit(p);
      ASSERT_NE(r.where(2), Tier::Storage) << i;
    }
    EXPECT_EQ(r.where(1), Tier::Storage);  // evicted under pressure once released
    r.release(other);
    EXPECT_EQ(r.held_slots(), 0u);
    EXPECT_THROW(r.release(other), Error);
    check_consistent(r, E);
  }
}

// The engine's schedule (hold batch i; plan batch i + 1 beside it when fits(),
// else release first) against the simulator's (plan, commit, nothing held):
// every plan is identical, for every policy, phase mix and ring size.
TEST(ResidencyAsync, FitsMeansTheSameDecisionsAsNothingHeld) {
  const uint32_t L = 3, E = 24;
  struct Sizes {
    size_t hot, ring, host;
  };
  uint64_t overlapped = 0, serialized = 0;
  for (PolicyKind kind : {PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Pinned}) {
    for (Sizes z : {Sizes{8, 3, 0}, Sizes{10, 8, 4}, Sizes{6, 0, 2}, Sizes{40, 6, 0}}) {
      std::vector<ExpertKey> ranking{5, 30, 31, 60};
      const size_t max_pinned = kind == PolicyKind::Pinned ? 2 : 0;
      Residency ref = make(L * E, z.hot, z.ring, z.host, kind, ranking, max_pinned);
      Residency eng = make(L * E, z.hot, z.ring, z.host, kind, ranking, max_pinned);
      const size_t batch = std::min<size_t>(ref.max_batch(), E);
      std::mt19937 rng(uint32_t(17 + z.hot + 3 * z.ring + int(kind)));
      for (int chunk = 0; chunk < 150; ++chunk) {
        const Phase ph = rng() % 2 ? Phase::Prefill : Phase::Decode;
        const uint32_t layer = rng() % L;
        const auto all = draw(rng, 1 + rng() % E, layer, E);  // one layer's distinct experts
        Plan held;
        bool holding = false;
        for (size_t b0 = 0; b0 < all.size(); b0 += batch) {
          std::span<const ExpertKey> ids(all.data() + b0, std::min(batch, all.size() - b0));
          Plan want, got;
          ref.plan(ids, ph, want);
          ref.commit(want);
          if (holding && eng.fits(ids, ph)) {
            ++overlapped;
            eng.plan(ids, ph, got);
            eng.release(held);
          } else {
            serialized += holding;
            if (holding) eng.release(held);
            eng.plan(ids, ph, got);
          }
          eng.hold(got);
          eng.commit(got);
          expect_same_plan(want, got, "chunk " + std::to_string(chunk));
          held = got;
          holding = true;
        }
        if (holding) eng.release(held);
        ASSERT_EQ(eng.held_slots(), 0u);
        ASSERT_EQ(ref.hot_keys(), eng.hot_keys()) << "chunk " << chunk;
      }
    }
  }
  EXPECT_GT(overlapped, 100u);
  EXPECT_GT(serialized, 100u);
}

// Placement math: with the slots held by open requests plus the batch within
// max_batch(), plan() always finds room.
TEST(ResidencyAsync, HoldsWithinMaxBatchAlwaysLeaveRoom) {
  const uint32_t L = 2, E = 20;
  for (PolicyKind kind : {PolicyKind::Lru, PolicyKind::Lfu}) {
    for (size_t ring : {0u, 3u, 5u}) {
      Residency r = make(L * E, 7, ring, 2, kind);
      const size_t mb = r.max_batch();
      std::mt19937 rng(uint32_t(ring * 7 + int(kind)));
      std::vector<Plan> open;
      for (int i = 0; i < 2000; ++i) {
        const Phase ph = rng() % 2 ? Phase::Prefill : Phase::Decode;
        while (!open.empty() && (rng() % 2 || r.held_slots() >= mb)) {
          r.release(open.front());
          open.erase(open.begin());
        }
        const size_t room = mb - r.held_slots();
        Plan p;
        ASSERT_NO_THROW(r.plan(draw(rng, 1 + rng() % room, rng() % L, E), ph, p))
            << "held " << r.held_slots() << " of max_batch " << mb;
        if (ph == Phase::Prefill && ring > 0) {
          ASSERT_EQ(p.hot_evictions, 0u);
        }
        r.commit(p);
        r.hold(p);
        open.push_back(p);
        check_consistent(r, L * E);
      }
    }
  }
}

TEST(ResidencyAsync, PrefetchObeysTheRingRuleAndNeverTouchesHeldSlots) {
  Residency r = make(64, 4, 2);
  Plan p;
  r.plan(std::vector<ExpertKey>{1, 2}, Phase::Decode, p);
  r.commit(p);
  Plan q;
  r.plan(std::vector<ExpertKey>{3, 4}, Phase::Decode, q);
  r.commit(q);
  r.hold(q);  // 3 and 4 are in use
  const auto hot = r.hot_keys();
  // Prefill prefetch: into the ring only (the hot set is full), never evicting hot.
  Plan f;
  PrefetchSkips sk = r.prefetch(std::vector<ExpertKey>{10, 11, 12, 1}, Phase::Prefill, 8, f);
  EXPECT_EQ(sk.redundant, 1u);  // 1 is resident
  EXPECT_EQ(f.steps.size(), 2u);
  EXPECT_EQ(sk.dropped, 1u);  // a ring of 2, both loading now
  EXPECT_EQ(f.hot_evictions, 0u);
  EXPECT_EQ(r.hot_keys(), hot);
  for (const PlanStep& st : f.steps) {
    EXPECT_TRUE(st.loading);
    EXPECT_FALSE(st.hot);
    EXPECT_EQ(r.state(st.key), KeyState::Loading);
  }
  // Decode prefetch evicts the policy's victim, but never the held 3 and 4.
  Plan g;
  sk = r.prefetch(std::vector<ExpertKey>{20, 21, 22}, Phase::Decode, 8, g);
  EXPECT_EQ(g.steps.size(), 2u);  // 1 and 2 go; 3, 4 held
  EXPECT_EQ(sk.dropped, 1u);
  EXPECT_NE(r.where(3), Tier::Storage);
  EXPECT_NE(r.where(4), Tier::Storage);
  // The limit caps loads started.
  Plan h;
  r.release(q);
  sk = r.prefetch(std::vector<ExpertKey>{30, 31}, Phase::Decode, 1, h);
  EXPECT_EQ(h.steps.size(), 1u);
  EXPECT_EQ(sk.dropped, 1u);
  r.commit(f);
  r.commit(g);
  r.commit(h);
  check_consistent(r, 64);
}

// A small deterministic scenario: accurate and wasted prefetches are counted.
TEST(ResidencyAsync, PrefetchAccuracyIsCounted) {
  Residency r = make(64, 3, 0);
  ExpertStats s;
  s.resize_layers(1);
  auto bytes = [](ExpertKey) { return uint64_t(100); };
  Plan f;
  PrefetchSkips sk = r.prefetch(std::vector<ExpertKey>{1, 2, 3}, Phase::Decode, 8, f);
  s.record_prefetch(0, 3, f, sk, bytes);
  r.commit(f);
  EXPECT_EQ(s.prefetch.issued, 3u);
  EXPECT_EQ(s.prefetch.read_bytes, 300u);
  Plan u;
  r.plan(std::vector<ExpertKey>{1}, Phase::Decode, u);  // used: accurate
  EXPECT_TRUE(u.steps[0].prefetched);
  EXPECT_EQ(u.steps[0].found, Tier::Hot);
  r.commit(u);
  s.record(0, u, bytes);
  Plan v;
  r.plan(std::vector<ExpertKey>{1}, Phase::Decode, v);  // a second use is a plain hit
  EXPECT_FALSE(v.steps[0].prefetched);
  r.commit(v);
  s.record(0, v, bytes);
  Plan w;  // 9 and 10 evict the LRU 2 and 3, never used: wasted
  r.plan(std::vector<ExpertKey>{9, 10}, Phase::Decode, w);
  r.commit(w);
  s.record(0, w, bytes);
  EXPECT_EQ(s.prefetch.used, 1u);
  EXPECT_EQ(s.prefetch.wasted, 2u);
  EXPECT_EQ(s.prefetch.late, 0u);
  const LayerCounters t = s.total();
  EXPECT_EQ(t.uses, 4u);
  EXPECT_EQ(t.hits_hot, 2u);
  EXPECT_EQ(t.misses, 2u);
  EXPECT_EQ(t.hot_evictions, 2u);
  EXPECT_EQ(s.to_json()["prefetch"]["accuracy"].get<double>(), 1.0 / 3.0);
  // A prefetch that fails to load is aborted like any load: nothing is left.
  Plan x;
  r.prefetch(std::vector<ExpertKey>{20}, Phase::Decode, 8, x);
  r.hold(x);
  r.release(x);
  r.abort(x);
  EXPECT_EQ(r.where(20), Tier::Storage);
  check_consistent(r, 64);
}
