// ExpertStats: every counter of the expert memory hierarchy, in one struct,
// printed by `moetier run --stats` and exported as JSON (--stats-json).
//
// Definitions (docs/cache-protocol.md):
//   use          one expert requested by one acquire() call (after de-duplication)
//   hit (tier)   the use found the expert's bytes in that tier: hot set,
//                transient ring, or host RAM tier; hits_loading: the expert
//                was being loaded by an earlier request (a prefetch) and the
//                use waited for that load instead of reading it again
//   miss         the use read the expert from storage
//   reads        logical expert reads: count (= misses) and bytes (the sum of the
//                missed experts' tensor bytes, as stored in the checkpoint)
//   uses = hits_hot + hits_transient + hits_host + hits_loading + misses, per
//                layer and in total (hits_loading is 0 without prefetch).
//   step         one (token, layer) pair, reported by the runtime through
//                ExpertProvider::note_routing(); an all-hit step is one whose k
//                selected experts were all hot or transient hits
//   stall        wall time the caller was blocked waiting for storage reads
//   prefetch     PrefetchCounters below: hints, loads started, accuracy
//                (used / wasted), bytes, and the stall that remained
//   setup        allocating and pre-faulting the arena and host tier (once)
//   process_read_bytes  /proc/self/io read_bytes since the provider started
//                (the whole process: includes page faults on mapped weights)
// Only successful acquires are counted; a failed one counts in failed_acquires.
//
// Not thread-safe: written by the provider on the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "experts/residency.h"

namespace moetier {

struct LayerCounters {
  uint64_t uses = 0;
  uint64_t hits_hot = 0;
  uint64_t hits_transient = 0;
  uint64_t hits_host = 0;
  uint64_t hits_loading = 0;  // waited for an expert already being loaded
  uint64_t misses = 0;
  uint64_t read_bytes = 0;  // logical bytes of the missed experts
  uint64_t hot_evictions = 0;
  uint64_t ring_evictions = 0;
  uint64_t steps = 0;
  uint64_t all_hit_steps = 0;
  uint64_t stall_ns = 0;

  uint64_t hits() const { return hits_hot + hits_transient + hits_host + hits_loading; }
  LayerCounters& operator+=(const LayerCounters& o);
  LayerCounters& operator-=(const LayerCounters& o);  // the counts since an earlier total()
  nlohmann::json to_json() const;
};

// ExpertProvider::prefetch() accounting (docs/cache-protocol.md, "Prefetch").
struct PrefetchCounters {
  uint64_t hints = 0;           // distinct experts named by prefetch() calls
  uint64_t redundant = 0;       // of those, already resident or loading
  uint64_t redundant_used = 0;  // of those, picked by the layer's router (device hints)
  uint64_t dropped = 0;         // no slot the rules allow (or over the in-flight limit)
  uint64_t issued = 0;          // loads started (storage reads and host-tier copies)
  uint64_t read_bytes = 0;      // logical bytes of the storage reads
  uint64_t used = 0;            // prefetched experts used before they left (accurate)
  uint64_t late = 0;            // of those, used while still loading (the use waited)
  uint64_t wasted = 0;          // prefetched experts that left the arena unused
  uint64_t failed = 0;          // loads whose read failed (the experts became absent)
  uint64_t load_ns = 0;         // loader wall time of prefetch reads
  uint64_t used_load_ns = 0;    // the share of load_ns of the used experts
  uint64_t wait_ns = 0;         // caller time blocked on prefetch loads (stall remaining)

  // Estimated stall saved: load time of the used prefetches minus the waits.
  uint64_t saved_ns() const { return used_load_ns > wait_ns ? used_load_ns - wait_ns : 0; }
  // One entry of a device step's staging report (Backend::NextLayer::staged)
  // naming an expert already in device memory (-2 - id): a hint, redundant,
  // and redundant_used when `ids` (the layer's routing) holds it. False, with
  // nothing counted, for any other entry.
  bool count_in_device(int32_t staged, std::span<const int32_t> ids);
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
  uint64_t setup_ns = 0;        // allocating and pre-faulting the tiers' memory
  uint64_t prefault_bytes = 0;  // host memory made resident at set-up
  bool huge_pages = false;      // transparent huge pages were accepted for it

  std::vector<LayerCounters> layers;  // [num_hidden_layers]
  PrefetchCounters prefetch;

  // Storage path.
  uint64_t read_requests = 0;       // extents read (after coalescing)
  uint64_t aligned_read_bytes = 0;  // bytes asked of the kernel (4 KiB supersets)
  uint64_t direct_reads = 0;
  uint64_t buffered_reads = 0;
  uint64_t fallback_files = 0;              // shards read buffered (O_DIRECT refused)
  std::vector<std::string> fallback_notes;  // one line per such shard
  uint64_t host_copy_bytes = 0;             // arena <-> host tier copies
  uint64_t host_copy_ns = 0;                // wall time of those copies (in the load jobs)
  uint64_t validate_ns = 0;
  uint64_t overlapped_submits = 0;  // submits made while another request was open
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
  // Counts one prefetch() call: `hints` distinct experts, the loads `p` started
  // (and the evictions they caused, in the layer's counters), what was skipped.
  void record_prefetch(int64_t layer, uint64_t hints, const Plan& p, const PrefetchSkips& skips,
                       const std::function<uint64_t(ExpertKey)>& bytes_of);
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
