#include "experts/copy_work.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"

namespace moetier {

void CopyWork::add(std::byte* dst, const std::byte* src, size_t n, bool spill) {
  check(!spill || spill_chunks_ == chunks_.size(), "copy work: a spill after a fill");
  bytes_ += n;
  for (size_t off = 0; off < n;) {
    // Pieces of kChunkBytes; the last one takes up to 1.5 of them, so that none is tiny.
    const size_t len = n - off >= kChunkBytes + kChunkBytes / 2 ? kChunkBytes : n - off;
    chunks_.push_back({dst + off, src + off, len});
    if (spill) ++spill_chunks_;
    off += len;
  }
}

void CopyWork::run() {
  for (;;) {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= chunks_.size()) return;
    if (i >= spill_chunks_) {
      while (spills_done_.load(std::memory_order_acquire) < spill_chunks_)
        std::this_thread::yield();
    }
    const Chunk& c = chunks_[i];
    std::memcpy(c.dst, c.src, c.n);
    if (i < spill_chunks_) spills_done_.fetch_add(1, std::memory_order_release);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void CopyWork::finish() {
  run();
  while (done_.load(std::memory_order_acquire) < chunks_.size()) std::this_thread::yield();
}

void CopyWork::run_on(ThreadPool& pool) {
  const int64_t n = std::min<int64_t>(
      {pool.threads(), int64_t(chunks_.size()), int64_t(bytes_ / kBytesPerThread)});
  if (n > 1) pool.parallel_for(n, 1, [this](int64_t, int64_t) { run(); });
  finish();
}

}  // namespace moetier
