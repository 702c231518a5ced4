// CopyWork: the host-tier copies of one load job (experts/loader.h), cut into
// chunks that several threads may run at once: spills (arena slot -> host
// slot) first, then fills (host slot -> arena slot). Big copies are split into
// chunks of at most kChunkBytes, so one expert's copy spreads over threads too.
//
// Protocol:
//   - The owner add()s every copy (all spills before the first fill) before
//     the job is pushed, and changes nothing after; the chunk list is then
//     read-only.
//   - From then on any number of threads may call run() concurrently (the
//     loader thread running the job, the owner helping while it waits, the
//     thread pool's workers). Each chunk is taken exactly once (fetch_add on
//     next_). A fill chunk is copied only after every spill chunk finished
//     (a fill, or a read of the job, may write the arena slot a spill reads):
//     the taker of a fill chunk waits for spills_done_ == spill_chunks_, and
//     the spill chunks it waits for are being copied by the threads that took
//     them (a taken chunk has no wait of its own), so this always ends.
//   - finish() runs chunks and returns once every chunk has finished
//     (done_ == chunks, acquire): then all copied bytes are visible to the
//     caller, which runs the job's storage reads only after it.
//   - run_on(pool) is finish() with up to bytes / kBytesPerThread of the
//     pool's threads helping; a pool already busy (a kernel running) runs it
//     on the caller alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moetier {

class ThreadPool;

class CopyWork {
 public:
  static constexpr size_t kChunkBytes = size_t(256) << 10;
  // run_on() asks one more thread per this many bytes (a pool wake-up costs
  // about what copying this much does).
  static constexpr size_t kBytesPerThread = size_t(512) << 10;

  // A copy of n bytes; spill: arena -> host (must precede every fill).
  void add(std::byte* dst, const std::byte* src, size_t n, bool spill);
  bool empty() const { return chunks_.empty(); }
  size_t chunks() const { return chunks_.size(); }
  uint64_t bytes() const { return bytes_; }

  // Takes and copies chunks until none is left to take (any thread).
  void run();
  // run(), then waits until every chunk taken by anyone has finished.
  void finish();
  // finish() with the threads of `pool` taking chunks as well.
  void run_on(ThreadPool& pool);

 private:
  struct Chunk {
    std::byte* dst = nullptr;
    const std::byte* src = nullptr;
    size_t n = 0;
  };
  std::vector<Chunk> chunks_;  // spills first, [0, spill_chunks_)
  size_t spill_chunks_ = 0;
  uint64_t bytes_ = 0;
  std::atomic<size_t> next_{0};         // next chunk to take
  std::atomic<size_t> spills_done_{0};  // spill chunks finished
  std::atomic<size_t> done_{0};         // chunks finished
};

}  // namespace moetier
