#include "io/sysinfo.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace moetier::io {

namespace {

// Scans "KEY: VALUE [kB]" lines of a /proc file for `key`.
std::optional<uint64_t> proc_field(const char* file, std::string_view key, uint64_t unit) {
  std::FILE* f = std::fopen(file, "re");
  if (!f) return std::nullopt;
  char line[256];
  std::optional<uint64_t> out;
  while (std::fgets(line, sizeof line, f)) {
    std::string_view l(line);
    if (l.size() > key.size() && l.substr(0, key.size()) == key && l[key.size()] == ':') {
      unsigned long long v = 0;
      if (std::sscanf(line + key.size() + 1, "%llu", &v) == 1) out = uint64_t(v) * unit;
      break;
    }
  }
  std::fclose(f);
  return out;
}

}  // namespace

std::optional<ProcessIo> process_io() {
  auto rb = proc_field("/proc/self/io", "read_bytes", 1);
  auto rc = proc_field("/proc/self/io", "rchar", 1);
  if (!rb || !rc) return std::nullopt;
  return ProcessIo{*rb, *rc};
}

std::optional<uint64_t> mem_available_bytes() {
  return proc_field("/proc/meminfo", "MemAvailable", 1024);
}

std::optional<uint64_t> mem_total_bytes() { return proc_field("/proc/meminfo", "MemTotal", 1024); }

}  // namespace moetier::io
