// DirectFile: a read-only file opened for O_DIRECT reads, with a buffered
// fallback for file systems that refuse O_DIRECT.
//
// Direct reads must start at a multiple of kAlign, have a length that is a
// multiple of kAlign, and land in a kAlign-aligned buffer. aligned_span()
// turns any byte range into the aligned superset that covers it; the caller's
// bytes then start `head` bytes into the buffer (no copy).
//
// Fallback: when open(O_DIRECT) fails with EINVAL, or a direct read fails with
// EINVAL, the file switches to its buffered descriptor for good; the switch is
// counted (fallbacks()) and described by fallback_reason().
//
// Concurrency: read_at() may be called from many threads at once (pread on
// immutable descriptors; the direct->buffered switch is one atomic flag).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace moetier::io {

inline constexpr uint64_t kAlign = 4096;

inline constexpr uint64_t align_down(uint64_t x, uint64_t a = kAlign) { return x / a * a; }
inline constexpr uint64_t align_up(uint64_t x, uint64_t a = kAlign) { return (x + a - 1) / a * a; }

// The kAlign-aligned superset of [offset, offset + length).
struct AlignedSpan {
  uint64_t offset = 0;  // aligned start
  uint64_t length = 0;  // aligned length
  uint64_t head = 0;    // offset of the first wanted byte inside the span
};
inline AlignedSpan aligned_span(uint64_t offset, uint64_t length) {
  uint64_t a = align_down(offset);
  return {a, align_up(offset + length) - a, offset - a};
}

class DirectFile {
 public:
  // Opens `path` read-only. With direct=true it asks for O_DIRECT and falls
  // back to buffered reads (counted) when the file system refuses. Throws
  // Error naming the file when it cannot be opened at all.
  static std::unique_ptr<DirectFile> open(const std::filesystem::path& path, bool direct = true);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size_at_open() const { return size_; }
  // True while reads bypass the page cache.
  bool direct() const { return direct_.load(std::memory_order_relaxed); }
  // 1 once the file fell back to buffered reads (0 if it never did).
  uint64_t fallbacks() const { return fallbacks_.load(std::memory_order_relaxed); }
  std::string fallback_reason() const;

  // The descriptor to use now (the direct one unless the file fell back).
  int fd() const;
  // Records that the kernel refused a direct read with EINVAL and switches to
  // buffered reads. Returns the buffered descriptor.
  int refuse_direct_read();

  // One blocking read: pread until `length` bytes arrived, EOF, or an error.
  // Returns bytes read; sets *err to errno (0 on success or EOF). Handles
  // EINTR, partial reads and the EINVAL fallback. For direct files, offset,
  // length and dst must be aligned.
  uint64_t read_at(uint64_t offset, uint64_t length, std::byte* dst, int* err);

 private:
  DirectFile() = default;
  std::filesystem::path path_;
  int direct_fd_ = -1;
  int buffered_fd_ = -1;
  uint64_t size_ = 0;
  std::atomic<bool> direct_{false};
  std::atomic<uint64_t> fallbacks_{0};
  std::string open_refusal_;  // set when open(O_DIRECT) was refused
};

}  // namespace moetier::io
