#include "monitor/host.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace moetier::monitor {
namespace {

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return s.str();
}

std::optional<uint64_t> value_in(const std::string& path, std::string_view key) {
  const auto text = slurp(path);
  if (!text) return std::nullopt;
  return proc_value(*text, key);
}

}  // namespace

std::optional<uint64_t> proc_value(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':')
      continue;
    std::string_view rest = line.substr(key.size() + 1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    uint64_t v = 0;
    const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc() || p == rest.data()) return std::nullopt;
    std::string_view unit(p, rest.data() + rest.size() - p);
    while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    if (unit.substr(0, 2) == "kB") v *= 1024;
    return v;
  }
  return std::nullopt;
}

HostReading read_host(const HostPaths& paths) {
  HostReading r;
  r.mem_available_bytes = value_in(paths.meminfo, "MemAvailable");
  r.rss_bytes = value_in(paths.status, "VmRSS");
  r.read_bytes = value_in(paths.io, "read_bytes");
  return r;
}

}  // namespace moetier::monitor
