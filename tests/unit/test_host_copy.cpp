// experts/copy_work.h (host-tier copies split over threads, spills before
// fills) and experts/prefault.h (tiers made resident at set-up).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/buffer.h"
#include "core/thread_pool.h"
#include "experts/copy_work.h"
#include "experts/prefault.h"

using namespace moetier;

namespace {

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = std::byte(rng());
  return v;
}

}  // namespace

TEST(CopyWork, BigCopiesAreSplitAndNoPieceIsTiny) {
  std::vector<std::byte> a(CopyWork::kChunkBytes * 5), b(a.size());
  CopyWork w;
  w.add(b.data(), a.data(), CopyWork::kChunkBytes * 4 + 100, false);  // 4 pieces, last 1+
  w.add(b.data(), a.data(), CopyWork::kChunkBytes * 3 / 2, false);    // 1.5 chunks: 2 pieces
  w.add(b.data(), a.data(), 100, false);
  w.add(b.data(), a.data(), 0, false);  // nothing
  EXPECT_EQ(w.chunks(), 4u + 2u + 1u);
  EXPECT_EQ(w.bytes(), CopyWork::kChunkBytes * 4 + 100 + CopyWork::kChunkBytes * 3 / 2 + 100);
}

TEST(CopyWork, SpillsAfterFillsAreRefused) {
  std::byte x[8] = {}, y[8] = {};
  CopyWork w;
  w.add(x, y, 8, false);
  EXPECT_ANY_THROW(w.add(y, x, 8, true));
}

// Each spill saves arena slot i to host slot i, then a fill overwrites arena
// slot i with the bytes of another host slot: a fill that ran before its
// spill would make the saved copy wrong. Four threads take the pieces at once.
TEST(CopyWork, EverySpillSeesTheBytesBeforeAnyFillOnManyThreads) {
  const size_t slot = CopyWork::kChunkBytes * 3 + 4096, n = 12;
  for (int round = 0; round < 20; ++round) {
    std::vector<std::byte> arena = pattern(slot * n, uint32_t(round));
    const std::vector<std::byte> before = arena;
    std::vector<std::byte> host = pattern(slot * n, uint32_t(round + 100));
    const std::vector<std::byte> host_before = host;
    CopyWork w;
    // spills: arena slot i -> host slot i (the first n/2); fills: host slot
    // n/2 + i -> arena slot i (host slots the spills do not write)
    for (size_t i = 0; i < n / 2; ++i) w.add(&host[i * slot], &arena[i * slot], slot, true);
    for (size_t i = 0; i < n / 2; ++i)
      w.add(&arena[i * slot], &host[(n / 2 + i) * slot], slot, false);
    std::vector<std::thread> helpers;
    for (int t = 0; t < 3; ++t) helpers.emplace_back([&] { w.run(); });
    w.finish();
    for (auto& t : helpers) t.join();
    for (size_t i = 0; i < n / 2; ++i) {
      ASSERT_EQ(std::memcmp(&host[i * slot], &before[i * slot], slot), 0) << "spill " << i;
      ASSERT_EQ(std::memcmp(&arena[i * slot], &host_before[(n / 2 + i) * slot], slot), 0)
          << "fill " << i;
    }
    ASSERT_EQ(std::memcmp(&arena[n / 2 * slot], &before[n / 2 * slot], slot * n / 2), 0);
  }
}

TEST(CopyWork, RunOnAPoolCopiesEverything) {
  ThreadPool pool(3);
  const size_t n = CopyWork::kChunkBytes * 7 + 77;
  const std::vector<std::byte> src = pattern(n, 5);
  std::vector<std::byte> dst(n);
  CopyWork w;
  w.add(dst.data(), src.data(), n, false);
  w.run_on(pool);
  EXPECT_EQ(dst, src);
}

TEST(Prefault, EveryPageIsResidentAfterwards) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE)), n = (size_t(24) << 20) + 3 * page;
  AlignedBuffer buf(n);
  ThreadPool pool(2);
  const PrefaultResult r = prefault(buf.data(), n, true, pool);
  EXPECT_EQ(r.bytes, n);
  std::vector<unsigned char> vec((n + page - 1) / page);
  ASSERT_EQ(::mincore(buf.data(), n, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  EXPECT_EQ(resident, vec.size());
  EXPECT_EQ(prefault(nullptr, 0, true, pool).bytes, 0u);
}
