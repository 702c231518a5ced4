#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOETIER_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MOETIER_PAUSE() asm volatile("yield")
#else
#define MOETIER_PAUSE() ((void)0)
#endif

namespace moetier {
namespace {

// About 20-60 us of spinning before an idle thread sleeps: long enough to
// catch the next kernel of a forward pass, short enough not to steal a busy
// machine's cores for long.
constexpr int kSpinIters = 1 << 12;
// Chunks per job: they are counted in 32 bits (ticket_'s index, pending_).
constexpr int64_t kMaxChunks = int64_t(1) << 30;

uint32_t gen_of(uint64_t t) { return uint32_t(t >> 32); }
uint32_t idx_of(uint64_t t) { return uint32_t(t); }

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (auto& w : workers_) w.join();
}

bool ThreadPool::run_one_chunk(uint32_t gen) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(t) != gen) return false;
    const int64_t chunks = chunks_.load(std::memory_order_relaxed);
    if (int64_t(idx_of(t)) >= chunks) return false;
    if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) break;
  }
  // Chunk idx of job gen is ours: the job's fields stay put until we finish.
  const int64_t n = n_.load(std::memory_order_relaxed),
                grain = grain_.load(std::memory_order_relaxed);
  const int64_t begin = int64_t(idx_of(t)) * grain, end = std::min(n, begin + grain);
  (*fn_.load(std::memory_order_relaxed))(begin, end);
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  return true;
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t e = epoch_.load(std::memory_order_acquire);
    for (int i = 0; e == seen && i < kSpinIters; ++i) {
      MOETIER_PAUSE();
      e = epoch_.load(std::memory_order_acquire);
    }
    if (e == seen) {
      sleepers_.fetch_add(1);
      epoch_.wait(seen);
      sleepers_.fetch_sub(1);
      continue;
    }
    if (stop_.load()) return;
    seen = e;
    while (run_one_chunk(e)) {
    }
  }
}

void ThreadPool::wait_done() {
  int32_t p = pending_.load(std::memory_order_acquire);
  for (int i = 0; p != 0 && i < kSpinIters; ++i) {
    MOETIER_PAUSE();
    p = pending_.load(std::memory_order_acquire);
  }
  while (p != 0) {
    pending_.wait(p);
    p = pending_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>({grain, 1, (n + kMaxChunks - 1) / kMaxChunks});
  const int64_t chunks = (n + grain - 1) / grain;
  bool expected = false;
  if (workers_.empty() || chunks == 1 || !busy_.compare_exchange_strong(expected, true)) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    return;
  }
  // First the old job's ticket is closed (the new generation, no chunk left):
  // a worker that woke for the old job and read its ticket before this could
  // otherwise claim a chunk under the old generation against the new job's
  // chunk count. The exchange (acquire) keeps the field stores below after it;
  // a claim that came before it (release) read the old chunk count.
  const uint32_t gen = epoch_.load(std::memory_order_relaxed) + 1;
  ticket_.exchange(uint64_t(gen) << 32 | 0xffffffffu, std::memory_order_acq_rel);
  fn_.store(&fn, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  grain_.store(grain, std::memory_order_relaxed);
  chunks_.store(chunks, std::memory_order_relaxed);
  pending_.store(int32_t(chunks), std::memory_order_relaxed);
  ticket_.store(uint64_t(gen) << 32, std::memory_order_release);
  epoch_.store(gen);  // seq_cst: pairs with sleepers_ below
  if (sleepers_.load() > 0) epoch_.notify_all();
  while (run_one_chunk(gen)) {
  }
  wait_done();
  busy_.store(false, std::memory_order_release);
}

int default_threads() {
  for (const char* var : {"MOETIER_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  int n = int(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  // cgroup v2 quota: "max 100000" or "200000 100000" (quota, period).
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (f >> quota >> period && quota != "max" && period > 0) {
    const long long q = std::atoll(quota.c_str());
    if (q > 0) n = std::min<int>(n, int(std::max<long long>(1, q / period)));
  }
  return std::max(n, 1);
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
}  // namespace

ThreadPool& global_pool() {
  std::lock_guard lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(default_threads());
  return *g_pool;
}

void set_global_threads(int n) {
  std::lock_guard lock(g_pool_mu);
  const int want = n > 0 ? n : default_threads();
  if (g_pool && g_pool->threads() == want) return;
  g_pool.reset();
  g_pool = std::make_unique<ThreadPool>(want);
}

}  // namespace moetier
