// experts/policy: eviction order of LRU, LFU and pinned+LRU; ranking files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "experts/policy.h"

using namespace moetier;

namespace {
auto none = [](ExpertKey) { return false; };
}

TEST(PolicyLru, EvictsLeastRecentlyUsedSkippingLocked) {
  LruPolicy p(10);
  for (ExpertKey k : {3u, 7u, 1u, 9u}) p.on_insert(k);
  EXPECT_EQ(p.victim(none), 3u);
  p.on_use(3);  // 7 1 9 3
  EXPECT_EQ(p.victim(none), 7u);
  EXPECT_EQ(p.victim([](ExpertKey k) { return k == 7 || k == 1; }), 9u);
  p.on_use(5);  // not resident: no effect
  p.on_erase(7);
  EXPECT_EQ(p.victim(none), 1u);
  EXPECT_FALSE(p.victim([](ExpertKey) { return true; }).has_value());
  p.on_insert(7);  // back in as most recent: 1 9 3 7
  p.on_erase(1);
  p.on_erase(9);
  p.on_erase(3);
  EXPECT_EQ(p.victim(none), 7u);
}

TEST(PolicyLfu, EvictsLeastFrequentlyUsedTiesToLeastRecent) {
  LfuPolicy p(10);
  // uses: 2 x3, 4 x1, 6 x2, 8 x1 (8 used after 4)
  for (ExpertKey k : {2u, 2u, 4u, 6u, 2u, 6u, 8u}) p.on_use(k);
  for (ExpertKey k : {2u, 4u, 6u, 8u}) p.on_insert(k);
  EXPECT_EQ(p.victim(none), 4u);
  EXPECT_EQ(p.victim([](ExpertKey k) { return k == 4; }), 8u);
  p.on_use(4);
  p.on_use(4);  // 4 now has 3 uses, 8 has 1, 6 has 2
  EXPECT_EQ(p.victim(none), 8u);
  p.on_erase(8);
  EXPECT_EQ(p.victim(none), 6u);
  // Counts survive eviction: 8 comes back with its history.
  p.on_use(8);
  p.on_use(8);
  p.on_use(8);
  p.on_insert(8);  // 8 has 4 uses
  EXPECT_EQ(p.victim(none), 6u);
  p.on_erase(6);
  EXPECT_EQ(p.victim(none), 2u);  // 2 and 4 have 3; 2 was used less recently
}

TEST(PolicyPinned, PinnedKeysAreNeverVictims) {
  PinnedLruPolicy p(20, {5, 6, 5, 7, 8}, 3);  // 5, 6, 7 pinned (duplicate counted once)
  EXPECT_EQ(p.pinned_count(), 3u);
  EXPECT_TRUE(p.is_pinned(7));
  EXPECT_FALSE(p.is_pinned(8));
  for (ExpertKey k : {5u, 1u, 6u, 2u, 7u}) p.on_insert(k);
  EXPECT_EQ(p.victim(none), 1u);
  p.on_use(1);
  EXPECT_EQ(p.victim(none), 2u);
  EXPECT_EQ(p.victim([](ExpertKey k) { return k == 2; }), 1u);
  EXPECT_FALSE(p.victim([](ExpertKey k) { return k == 1 || k == 2; }).has_value());
  EXPECT_EQ(p.pinned_keys(), (std::vector<ExpertKey>{5, 6, 7}));
}

TEST(PolicyFactory, NamesAndErrors) {
  EXPECT_EQ(make_policy(parse_policy_kind("lru"), 4)->name(), "lru");
  EXPECT_EQ(make_policy(parse_policy_kind("lfu"), 4)->name(), "lfu");
  EXPECT_EQ(make_policy(parse_policy_kind("pinned"), 4, {1}, 1)->name(), "pinned");
  EXPECT_THROW(parse_policy_kind("fifo"), Error);
  EXPECT_THROW(PinnedLruPolicy(4, {9}, 2), Error);
}

TEST(PolicyRanking, ReadsPairsCommentsAndRejectsBadLines) {
  auto dir = std::filesystem::temp_directory_path() / ("moetier_rank_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto f = dir / "ranking.txt";
  std::ofstream(f) << "# layer expert count\n2 5 900\n\n0 1   # hot\n 1 7 3\n";
  EXPECT_EQ(read_ranking(f, 3, 8), (std::vector<ExpertKey>{2 * 8 + 5, 1, 8 + 7}));
  std::ofstream(f) << "0 1\n3 0\n";
  try {
    read_ranking(f, 3, 8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranking.txt:2"), std::string::npos) << e.what();
  }
  std::ofstream(f) << "0 x\n";
  EXPECT_THROW(read_ranking(f, 3, 8), Error);
  EXPECT_THROW(read_ranking(dir / "missing", 3, 8), Error);
  std::filesystem::remove_all(dir);
}
