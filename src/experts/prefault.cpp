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

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

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
    if (huge) {
      const uintptr_t hlo = (lo + kHuge - 1) & ~(kHuge - 1), hhi = hi & ~(kHuge - 1);
      r.huge = hhi > hlo && ::madvise(reinterpret_cast<void*>(hlo), hhi - hlo, MADV_HUGEPAGE) == 0;
    }
    const size_t pieces = (hi - lo + kPiece - 1) / kPiece;
    std::atomic<bool> touched{false};
    pool.parallel_for(int64_t(pieces), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto* from = reinterpret_cast<std::byte*>(lo + size_t(i) * kPiece);
        auto* to =
            reinterpret_cast<std::byte*>(std::min<uintptr_t>(hi, lo + size_t(i + 1) * kPiece));
        if (!fault_in(from, to)) touched.store(true, std::memory_order_relaxed);
      }
    });
    r.populate = !touched.load();
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
