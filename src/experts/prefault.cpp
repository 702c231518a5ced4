#include "experts/prefault.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/thread_pool.h"

namespace moetier {

namespace {

constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kHuge = uintptr_t(2) << 20;
constexpr size_t kPiece = size_t(64) << 20;  // one thread's share at a time
// A piece with huge pages faulted slower than this means the kernel is
// compacting memory to find them (measured here: 2.5 GiB took 0.16 s with free
// huge pages, 5.6 s while compacting, 0.7 s in 4 KiB pages): the rest of the
// range then gets 4 KiB pages.
constexpr double kMinHugeBytesPerSecond = 2e9;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

// Huge pages for the 2 MiB-aligned part of [b, e); false when none.
bool advise_huge(std::byte* b, std::byte* e) {
  const uintptr_t hlo = (uintptr_t(b) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hhi = uintptr_t(e) & ~(kHuge - 1);
  return hhi > hlo && ::madvise(reinterpret_cast<void*>(hlo), hhi - hlo, MADV_HUGEPAGE) == 0;
}

// Faults [b, e) (page-aligned) in: populate, else touch. False: touched.
bool fault_in(std::byte* b, std::byte* e) {
  if (::madvise(b, size_t(e - b), MADV_POPULATE_WRITE) == 0) return true;
  for (volatile std::byte* q = b; q < e; q += kPage) *q = std::byte{0};
  return false;
}

}  // namespace

PrefaultResult prefault(void* p, size_t n, bool huge, ThreadPool& pool) {
  PrefaultResult r;
  if (!p || n == 0) return r;
  const auto t0 = std::chrono::steady_clock::now();
  const uintptr_t lo = (uintptr_t(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t hi = (uintptr_t(p) + n) & ~(kPage - 1);
  if (hi > lo) {
    const uintptr_t base = lo & ~(kHuge - 1);  // pieces on 2 MiB boundaries: no huge page split
    const size_t pieces = (hi - base + kPiece - 1) / kPiece;
    std::atomic<bool> touched{false}, want_huge{huge}, got_huge{false};
    pool.parallel_for(int64_t(pieces), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto* from = reinterpret_cast<std::byte*>(std::max(lo, base + size_t(i) * kPiece));
        auto* to =
            reinterpret_cast<std::byte*>(std::min<uintptr_t>(hi, base + size_t(i + 1) * kPiece));
        const bool h = want_huge.load(std::memory_order_relaxed) && advise_huge(from, to);
        const auto p0 = std::chrono::steady_clock::now();
        if (!fault_in(from, to)) touched.store(true, std::memory_order_relaxed);
        if (!h) continue;
        got_huge.store(true, std::memory_order_relaxed);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
        if (double(to - from) > kMinHugeBytesPerSecond * s) continue;
        want_huge.store(false, std::memory_order_relaxed);  // the kernel compacts: stop asking
      }
    });
    r.populate = !touched.load();
    r.huge = got_huge.load();
  }
  // The partial pages at either end (an unaligned buffer).
  auto* c = static_cast<volatile std::byte*>(p);
  c[0] = c[0];
  c[n - 1] = c[n - 1];
  r.bytes = n;
  r.ns = uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  return r;
}

}  // namespace moetier
