// Host readings from /proc: MemAvailable (/proc/meminfo), the process's
// resident set (VmRSS in /proc/self/status) and the bytes it caused to be read
// from storage (read_bytes in /proc/self/io). A file that cannot be read or a
// line that is absent leaves its field empty (a gap), never a guess.
// Stateless; any thread may call these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moetier::monitor {

struct HostReading {
  std::optional<uint64_t> mem_available_bytes, rss_bytes, read_bytes;
};

// Where the readings come from; tests point them elsewhere.
struct HostPaths {
  std::string meminfo = "/proc/meminfo";
  std::string status = "/proc/self/status";
  std::string io = "/proc/self/io";
};

HostReading read_host(const HostPaths& paths = {});

// The value of "KEY:" in TEXT, a /proc key-value file ("MemAvailable:  123 kB");
// a "kB" suffix multiplies by 1024. Empty when the key is absent or the
// value is not a number.
std::optional<uint64_t> proc_value(std::string_view text, std::string_view key);

}  // namespace moetier::monitor
