// What the kernel says about this process's I/O and the machine's memory.
#pragma once

#include <cstdint>
#include <optional>

namespace moetier::io {

// /proc/self/io: bytes this process caused to be fetched from storage
// (read_bytes) and bytes it asked read()-like calls for (rchar).
struct ProcessIo {
  uint64_t read_bytes = 0;
  uint64_t rchar = 0;
};
// nullopt when /proc/self/io is unreadable (no procfs, or a restricted container).
std::optional<ProcessIo> process_io();

// /proc/meminfo MemAvailable and MemTotal in bytes; nullopt when unreadable.
std::optional<uint64_t> mem_available_bytes();
std::optional<uint64_t> mem_total_bytes();

}  // namespace moetier::io
