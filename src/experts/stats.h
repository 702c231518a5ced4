// ExpertStats: every counter of the expert memory hierarchy, in one struct,
// printed by `moetier run --stats` and exported as JSON (--stats-json).
//
// Definitions (docs/cache-protocol.md):
//   use          one expert requested by one acquire() call (after de-duplication)
//   hit (tier)   the use found the expert's bytes in that tier: hot set,
//                transient ring, or host RAM tier
//   miss         the use read the expert from storage
//   reads        logical expert reads: count (= misses) and bytes (the sum of the
//                missed experts' tensor bytes, as stored in the checkpoint)
//   uses = hits_hot + hits_transient + hits_host + misses, per layer and in total.
//   step         one (token, layer) pair, reported by the runtime through
//                ExpertProvider::note_routing(); an all-hit step is one whose k
//                selected experts were all hot or transient hits
//   stall        wall time the caller was blocked waiting for storage reads
//   process_read_bytes  /proc/self/io read_bytes since the provider started
//                (the whole process: includes page faults on mapped weights)
// Only successful acquires are counted; a failed one counts in failed_acquires.
//
// Not thread-safe: written by the provider on the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experts/residency.h"

namespace moetier {

struct LayerCounters {
  uint64_t uses = 0;
  uint64_t hits_hot = 0;
  uint64_t hits_transient = 0;
  uint64_t hits_host = 0;
  uint64_t misses = 0;
  uint64_t read_bytes = 0;  // logical bytes of the missed experts
  uint64_t hot_evictions = 0;
  uint64_t ring_evictions = 0;
  uint64_t steps = 0;
  uint64_t all_hit_steps = 0;
  uint64_t stall_ns = 0;

  uint64_t hits() const { return hits_hot + hits_transient + hits_host; }
  LayerCounters& operator+=(const LayerCounters& o);
  nlohmann::json to_json() const;
};

struct ExpertStats {
  // Configuration, filled by whoever builds the provider.
  std::string provider;  // "arena" or "mapped"
  std::string policy;
  std::string reader;
  uint64_t expert_bytes = 0;  // logical bytes of one expert (largest)
  uint64_t slot_bytes = 0;    // arena slot size (aligned superset reads)
  uint64_t hot_slots = 0, transient_slots = 0, host_slots = 0;
  uint64_t total_experts = 0;  // experts in the model (MoE layers x experts)
  uint64_t pinned = 0;

  std::vector<LayerCounters> layers;  // [num_hidden_layers]

  // Storage path.
  uint64_t read_requests = 0;       // extents read (after coalescing)
  uint64_t aligned_read_bytes = 0;  // bytes asked of the kernel (4 KiB supersets)
  uint64_t direct_reads = 0;
  uint64_t buffered_reads = 0;
  uint64_t fallback_files = 0;              // shards read buffered (O_DIRECT refused)
  std::vector<std::string> fallback_notes;  // one line per such shard
  uint64_t host_copy_bytes = 0;             // arena <-> host tier copies
  uint64_t validate_ns = 0;
  uint64_t failed_acquires = 0;
  std::string last_error;

  // Process I/O (/proc/self/io); process_io_ok is false where unreadable.
  bool process_io_ok = false;
  uint64_t process_read_bytes_base = 0;
  uint64_t process_read_bytes = 0;

  void resize_layers(size_t n) { layers.resize(n); }
  LayerCounters total() const;
  // Counts one committed acquire. bytes_of(key): logical bytes of that expert.
  void record(int64_t layer, const Plan& p, const std::function<uint64_t(ExpertKey)>& bytes_of);
  void record_step(int64_t layer, bool all_hit);
  // Starts the process I/O baseline / refreshes process_read_bytes.
  void start_process_io();
  void sample_process_io();
  // Zeroes every counter (not the configuration), e.g. between a cold and a warm run.
  void reset_counters();

  nlohmann::json to_json() const;
  std::string format() const;  // human-readable, several lines
};

}  // namespace moetier
