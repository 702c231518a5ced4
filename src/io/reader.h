// Batched reads: many (file, offset, length) requests issued together, through
// io_uring when liburing is present and a pread thread pool otherwise.
//
// Every request reads the kAlign-aligned superset of its range into `dst`
// (kAlign-aligned, at least request_capacity() bytes); data() then points at
// the first wanted byte inside dst. No copies.
//
// Concurrency: one caller thread per Reader. read() blocks until every request
// of the batch completed (or failed); the reader's own threads never touch a
// request after read() returns. counters() may be read by the caller thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/direct_file.h"

namespace moetier::io {

struct ReadRequest {
  // Set by the caller.
  DirectFile* file = nullptr;
  uint64_t offset = 0;       // first wanted byte in the file
  uint64_t length = 0;       // wanted bytes
  std::byte* dst = nullptr;  // kAlign-aligned, >= capacity() bytes
  // Set by read().
  uint64_t got = 0;  // bytes that arrived, counted from the aligned start
  int err = 0;       // errno of a failed read, 0 otherwise

  AlignedSpan span() const { return aligned_span(offset, length); }
  uint64_t capacity() const { return span().length; }
  // True when the wanted bytes all arrived.
  bool ok() const { return err == 0 && got >= span().head + length; }
  const std::byte* data() const { return dst + span().head; }
};

// One line naming the file, offset and what went wrong ("" when ok()).
std::string describe_failure(const ReadRequest& r);

// Totals over the reader's life.
struct IoCounters {
  uint64_t requests = 0;        // ReadRequests completed (ok or not)
  uint64_t batches = 0;         // read() calls
  uint64_t bytes_wanted = 0;    // sum of request lengths
  uint64_t bytes_aligned = 0;   // sum of aligned superset lengths asked of the kernel
  uint64_t direct_reads = 0;    // requests served with O_DIRECT
  uint64_t buffered_reads = 0;  // requests served through the page cache (fallback)
  uint64_t failures = 0;        // requests that were not ok()
};

class Reader {
 public:
  virtual ~Reader() = default;
  // Performs every request; fills got/err. Never throws for I/O failures
  // (check ok()); throws Error for a malformed request (null file, unaligned
  // dst).
  void read(std::span<ReadRequest> reqs);
  virtual std::string name() const = 0;
  const IoCounters& counters() const { return counters_; }

 protected:
  virtual void read_batch(std::span<ReadRequest> reqs) = 0;
  // Applies the fault injector and updates counters; call once per request.
  static void finish(ReadRequest& r);

 private:
  IoCounters counters_;
};

enum class ReaderKind : uint8_t { Auto, Uring, Pool };

// Auto: io_uring when built with liburing and the kernel allows it, else the
// pread pool. `parallelism`: queue depth (io_uring) or threads (pool).
std::unique_ptr<Reader> make_reader(ReaderKind kind = ReaderKind::Auto, int parallelism = 8);
std::unique_ptr<Reader> make_pool_reader(int threads);
// nullptr when built without liburing or when io_uring_queue_init fails;
// *why gets the reason.
std::unique_ptr<Reader> make_uring_reader(int depth, std::string* why);
bool built_with_uring();

}  // namespace moetier::io
