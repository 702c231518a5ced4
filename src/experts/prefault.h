// Pre-faulting the expert tiers' host memory at set-up, so that the first read
// or copy into an arena or host-tier slot does not pay a page fault (and the
// kernel's zeroing of the page) on the request path: on a 16-core Xeon first
// touch costs about 0.4 s per GB, single-threaded (issue 12).
//
// prefault(p, n) makes every page of the range resident and writable:
// madvise(MADV_POPULATE_WRITE) (Linux 5.14+), else one write per 4 KiB page
// (the bytes are unspecified before and after: fresh slots). The range is cut
// into 64 MiB pieces that the pool's threads fault in parallel (page faults
// of one process scale with threads on recent kernels). With `huge`, each
// piece first asks for transparent huge pages (madvise MADV_HUGEPAGE) — until
// one piece faults in slower than 2 GB/s: the kernel is compacting memory to
// find them, which can make set-up ten times slower than 4 KiB pages, so the
// remaining pieces get 4 KiB pages.
//
// Thread-safety: call it on the pool's owner thread, with no kernel running.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moetier {

class ThreadPool;

struct PrefaultResult {
  uint64_t bytes = 0;     // bytes made resident
  bool huge = false;      // MADV_HUGEPAGE was accepted for (part of) the range
  bool populate = false;  // MADV_POPULATE_WRITE did it (else page touches)
  uint64_t ns = 0;        // wall time
};

PrefaultResult prefault(void* p, size_t n, bool huge, ThreadPool& pool);

}  // namespace moetier
