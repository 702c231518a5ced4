// Expert-store options as the command line gives them, and the factory that
// turns them into a provider. The CLI11 part is in src/tools/expert_flags.h.
//
// Sizing (docs/cache-protocol.md):
//   --arena BYTES        hot slots = BYTES / slot size ("8GiB", "500MB", ...)
//   --arena N%           hot slots = ceil(N% of all experts of the model)
//   --arena-experts N    hot slots = N
//   --transient M        transient ring slots, in addition to the hot slots
//                        (default: min(E, max(k, hot / 8)))
//   --host-cache BYTES   host-RAM tier slots = BYTES / slot size (default none)
// With none of --arena / --arena-experts, the hot set gets half of
// MemAvailable (/proc/meminfo) minus the ring, capped at the whole model; the
// choice is described in the summary line (the CLI prints it). Hot slots are
// capped at the number of experts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "experts/arena_experts.h"
#include "experts/provider.h"
#include "experts/stats.h"

namespace moetier {

class Checkpoint;
struct ModelSpec;

struct ExpertOptions {
  std::string arena;              // --arena BYTES or N% ("" = not given)
  int64_t arena_experts = -1;     // --arena-experts N (-1 = not given)
  int64_t transient = -1;         // --transient M (-1 = default)
  std::string host_cache;         // --host-cache BYTES ("" = no host tier)
  std::string policy = "lru";     // --policy lru|lfu|pinned
  std::string ranking;            // --ranking FILE (with --policy pinned)
  std::string io = "auto";        // --io auto|uring|pool
  int io_depth = 16;              // --io-depth N
  bool buffered = false;          // --no-direct: page-cache reads instead of O_DIRECT
  bool mapped = false;            // --mapped: all experts resident through the mmap (no arena)
  std::string prefetch = "none";  // --prefetch none|next-layer
  bool stats = false;             // --stats: print ExpertStats to stderr at the end
  std::string stats_json;         // --stats-json FILE
  bool quiet = false;             // do not print the chosen sizes
  // One-line notes while running (an O_DIRECT fallback); the CLI prints them.
  std::function<void(const std::string&)> note;
};

// The sizing rules, shared with `moetier simulate`: the default transient ring
// is min(E, max(k, hot / 8)) slots; the pinned policy pins at most
// hot - max(k, ceil(hot / 4)) experts (0 when that is not positive).
size_t default_transient_slots(size_t hot, int64_t num_experts, int64_t k);
size_t pinned_limit(size_t hot, int64_t k);

// The arena configuration the options ask for, given the model; `summary` gets
// one line describing the choice (and where defaults came from).
ArenaConfig resolve_arena_config(const ExpertIndex& index, const ModelSpec& cfg,
                                 const ExpertOptions& opt, std::string* summary);

// The arena-backed provider. stats may be null; `summary` (if given) gets one
// line describing the sizes chosen and the reader; `backend` (if given) owns
// the arena's memory (ArenaConfig::backend). (opt.mapped is the caller's
// business: MappedExperts lives in the runtime.)
std::unique_ptr<ArenaExperts> make_expert_provider(const Checkpoint& ck, const ModelSpec& cfg,
                                                   const ExpertOptions& opt, ExpertStats* stats,
                                                   std::string* summary = nullptr,
                                                   Backend* backend = nullptr);

}  // namespace moetier
