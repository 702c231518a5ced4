#include "io/reader.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/fault.h"

namespace moetier::io {

std::string describe_failure(const ReadRequest& r) {
  if (r.ok()) return {};
  std::string file = r.file ? r.file->path().string() : "?";
  if (r.err != 0) {
    return fmt::format("{}: read of {} bytes at offset {} failed: {}", file, r.length, r.offset,
                       std::strerror(r.err));
  }
  uint64_t head = r.span().head;
  uint64_t got = r.got > head ? r.got - head : 0;
  return fmt::format("{}: short read of {} bytes at offset {}: got {} (file truncated?)", file,
                     r.length, r.offset, got);
}

void Reader::read(std::span<ReadRequest> reqs) {
  for (auto& r : reqs) {
    check(r.file != nullptr, "read request without a file");
    check(reinterpret_cast<uintptr_t>(r.dst) % kAlign == 0,
          "{}: read destination is not {}-byte aligned", r.file->path().string(), kAlign);
    r.got = 0;
    r.err = 0;
  }
  if (reqs.empty()) return;
  read_batch(reqs);
  counters_.batches++;
  for (auto& r : reqs) {
    counters_.requests++;
    counters_.bytes_wanted += r.length;
    counters_.bytes_aligned += r.capacity();
    (r.file->direct() ? counters_.direct_reads : counters_.buffered_reads)++;
    if (!r.ok()) counters_.failures++;
  }
}

void Reader::finish(ReadRequest& r) {
  AlignedSpan s = r.span();
  ReadOutcome o{s.offset, s.length, r.got, r.err, r.dst, s.head, s.head + r.length};
  FaultInjector::global().apply(r.file->path(), o);
  r.got = o.got;
  r.err = o.err;
}

std::unique_ptr<Reader> make_reader(ReaderKind kind, int parallelism) {
  if (kind != ReaderKind::Pool) {
    std::string why;
    auto r = make_uring_reader(parallelism, &why);
    if (r) return r;
    check(kind != ReaderKind::Uring, "io_uring reader unavailable: {}", why);
  }
  return make_pool_reader(parallelism);
}

}  // namespace moetier::io
