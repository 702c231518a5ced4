// Fault injection for the storage path. Tests (and the CLI, through the
// MOETIER_FAULT environment variable) arm one fault; the readers apply it to
// each completed read before anyone sees the bytes.
//
// MOETIER_FAULT syntax: KIND[:key=value]...  with KIND one of
//   short | eio | truncate | corrupt | refuse-direct
// and keys
//   path=SUBSTR   only files whose path contains SUBSTR (default: all)
//   skip=N        let the first N matching reads pass (default 0)
//   count=N       fire N times, 0 = forever (default 1)
//   size=BYTES    truncate: the simulated file length (default 0)
// e.g. MOETIER_FAULT=eio:skip=3:count=1
//
// Concurrency: arm/disarm/apply are serialized by an internal mutex; reader
// threads call apply() concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace moetier::io {

enum class FaultKind : uint8_t {
  ShortRead,     // the read returns half of the bytes it needed
  Eio,           // the read fails with EIO
  Truncate,      // the file behaves as if truncated to `size` bytes after open
  Corrupt,       // the requested bytes are overwritten with 0xff
  RefuseDirect,  // open(O_DIRECT) fails with EINVAL, as on a file system without it
};

struct FaultSpec {
  FaultKind kind = FaultKind::Eio;
  std::string path_contains;  // empty: every file
  uint64_t skip = 0;
  uint64_t count = 1;  // 0: forever
  uint64_t size = 0;   // Truncate only
};

// Parses the MOETIER_FAULT syntax; throws Error naming the bad part.
FaultSpec parse_fault_spec(std::string_view text);
std::string_view fault_kind_name(FaultKind k);

// What a read looked like when it completed; apply() may change it.
struct ReadOutcome {
  uint64_t file_offset = 0;  // where the read started (aligned)
  uint64_t length = 0;       // bytes asked for
  uint64_t got = 0;          // bytes that arrived
  int err = 0;               // errno, 0 on success
  std::byte* dst = nullptr;  // the destination buffer
  uint64_t head = 0;         // first byte the caller asked for, relative to dst
  uint64_t need = 0;         // bytes from dst that must arrive (head + logical length)
};

class FaultInjector {
 public:
  // The process-wide injector; armed from MOETIER_FAULT on first use.
  static FaultInjector& global();

  void arm(const FaultSpec& spec);
  void disarm();
  bool armed() const;
  uint64_t fired() const;  // how many times the fault has fired since arm()

  // Called for every completed read of `path`.
  void apply(const std::filesystem::path& path, ReadOutcome& r);
  // Called when `path` is opened with O_DIRECT: true to refuse it.
  bool refuse_direct(const std::filesystem::path& path);

 private:
  bool take(const std::filesystem::path& path, FaultKind kind);  // mutex held
  mutable std::mutex mu_;
  std::optional<FaultSpec> spec_;
  uint64_t seen_ = 0;
  uint64_t fired_ = 0;
};

}  // namespace moetier::io
