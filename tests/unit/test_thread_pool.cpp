// ThreadPool (core/thread_pool.h): every index runs exactly once, jobs do not
// nest, concurrent callers both finish, and many short jobs in a row neither
// lose nor repeat chunks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

using namespace moetier;

namespace {

void expect_each_once(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    ASSERT_LE(e - b, grain);
    for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n " << n << " i " << i;
}

}  // namespace

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000})
      for (int64_t grain : {1, 3, 16, 5000}) expect_each_once(pool, n, grain);
  }
}

TEST(ThreadPool, ManyShortJobsInARow) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job)
    pool.parallel_for(9, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 9 * 20000);
}

// Jobs whose chunk counts alternate between few and many, on more threads
// than cores: a worker that woke for a finished job and is preempted between
// reading the ticket and claiming a chunk must not claim a chunk of the next
// job under the old generation (it once could, where the next job had more
// chunks: that chunk ran twice and the pending count went below zero, so the
// caller slept forever).
TEST(ThreadPool, AStaleWorkerTakesNoChunkOfTheNextJob) {
  ThreadPool pool(12);
  for (int job = 0; job < 100000; ++job) {
    const int64_t n = job % 2 ? 48 : 1 + job % 3;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "job " << job;
  }
}

// Chunks longer than the caller's spin (about 20-60 us), so that the caller
// sleeps in wait_done and is woken by the chunk that finishes last, job after
// job (a lost wake-up there is a hang: the test's timeout).
TEST(ThreadPool, CallerSleepsUntilTheLastChunkIsDone) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 3000; ++job)
    pool.parallel_for(2, 1, [&](int64_t b, int64_t e) {
      if (b == 1 || job % 2) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      sum.fetch_add(e - b);
    });
  EXPECT_EQ(sum.load(), 2 * 3000);
}

TEST(ThreadPool, NestedCallRunsOnItsCaller) {
  ThreadPool pool(3);
  std::atomic<int64_t> inner{0};
  pool.parallel_for(6, 1, [&](int64_t, int64_t) {
    const auto me = std::this_thread::get_id();
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      inner.fetch_add(e - b);
    });
  });
  EXPECT_EQ(inner.load(), 60);
}

TEST(ThreadPool, ConcurrentCallersBothFinish) {
  ThreadPool pool(3);
  std::atomic<int64_t> a{0}, b{0};
  std::thread other([&] {
    for (int i = 0; i < 2000; ++i)
      pool.parallel_for(17, 2, [&](int64_t s, int64_t e) { a += e - s; });
  });
  for (int i = 0; i < 2000; ++i)
    pool.parallel_for(13, 2, [&](int64_t s, int64_t e) { b += e - s; });
  other.join();
  EXPECT_EQ(a.load(), 17 * 2000);
  EXPECT_EQ(b.load(), 13 * 2000);
}

TEST(ThreadPool, DefaultThreadsHonorsTheEnvironment) {
  ::setenv("MOETIER_THREADS", "3", 1);
  EXPECT_EQ(default_threads(), 3);
  ::unsetenv("MOETIER_THREADS");
  ::setenv("MOETIER_THREADS", "0", 1);  // not a count: falls through
  ::setenv("OMP_NUM_THREADS", "2", 1);
  EXPECT_EQ(default_threads(), 2);
  ::unsetenv("MOETIER_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_GE(default_threads(), 1);
}
