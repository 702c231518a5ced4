// Cache simulation over a routing trace (`moetier simulate`,
// docs/trace-and-simulate.md).
//
// The replay reproduces the engine's acquire stream: for each forward chunk
// (Replay::Chunk) and each MoE layer, the distinct experts of the chunk's
// tokens in ascending id order, in batches of at most max_batch, with the
// chunk's phase; then each (token, layer) step counts as all-hit when every one
// of its k experts was a hot or transient hit at the acquire that served it.
// Replay::Token makes every token its own acquire (token-level hit rates).
//
// Engine policies (LRU, LFU, pinned + LRU, with or without the transient ring)
// run the very Residency/Policy code of the arena and count with the very
// ExpertStats::record(), so on the same token stream their counters equal the
// engine's exactly (tests/unit/test_simulate.cpp). Two references do not run
// the engine: "static" (a fixed set: the top-B experts of a ranking) and "min"
// (Belady's MIN, use by use: evict the resident expert whose next use is
// farthest; optimal hits for a cache of that many slots, so a bound on every
// policy with as many slots in total).
//
// Pure computation, single-threaded.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "experts/policy.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/trace.h"

namespace moetier {

enum class Replay : uint8_t { Chunk, Token };
Replay parse_replay(const std::string& s);  // "chunk" | "token"

// One acquire group: the distinct experts one forward chunk (or one token)
// needs at one MoE layer, and the tokens whose routing they serve.
struct ReplayGroup {
  int64_t layer = 0;       // absolute layer index
  uint32_t moe_index = 0;  // position in the trace's moe_layers
  Phase phase = Phase::Decode;
  uint64_t key_begin = 0, key_end = 0;  // into ReplayStream::keys
  uint32_t tok_begin = 0, tok_end = 0;  // trace records
};

struct ReplayStream {
  Replay replay = Replay::Chunk;
  std::vector<ReplayGroup> groups;
  std::vector<ExpertKey> keys;  // [uses] every group's keys, ascending within a group
  std::vector<uint64_t> next;   // [uses] index of the key's next use, or UINT64_MAX
};
ReplayStream build_replay(const Trace& t, Replay replay);

struct SimResult {
  std::string policy;
  size_t hot_slots = 0, transient_slots = 0, host_slots = 0;
  ExpertStats stats;           // the engine's counters (config + per layer)
  ExpertStats phase_stats[2];  // the same, prefill only / decode only
};

// An engine policy with the arena's sizes.
struct PolicySim {
  PolicyKind kind = PolicyKind::Lru;
  size_t hot_slots = 1, transient_slots = 0, host_slots = 0;
  std::vector<ExpertKey> ranking;  // PolicyKind::Pinned
  size_t max_pinned = 0;
};
SimResult simulate_policy(const Trace& t, const ReplayStream& s, const PolicySim& p);
// Belady's MIN with `capacity` slots.
SimResult simulate_min(const Trace& t, const ReplayStream& s, size_t capacity);
// A fixed resident set: in_set[key] != 0.
SimResult simulate_static(const Trace& t, const ReplayStream& s, const std::vector<uint8_t>& in_set,
                          const std::string& name);

// The engine's sizing rules (experts/options.cpp): pinned experts leave
// max(k, ceil(hot/4)) slots to LRU; the default ring is min(E, max(k, hot/8)).
size_t engine_max_pinned(size_t hot, int64_t k);
size_t engine_default_transient(size_t hot, int64_t num_experts, int64_t k);

// "100" (experts), "25%" (of all experts, rounded up as --arena N%) or bytes
// ("10MB": divided by the model's slot size as --arena does when `encoding` is
// empty, else by the logical expert bytes of that encoding from the trace
// header). Throws Error for a budget that holds no expert or more than the
// model has.
size_t parse_budget(const std::string& text, const TraceModel& m, const std::string& encoding);

struct StudyOptions {
  std::vector<std::string> budgets;
  std::string encoding;    // for byte budgets; "" = the model's own
  int64_t transient = -1;  // ring slots of the ring variants; -1: the engine default per budget
  std::vector<std::string> policies = {"static", "static_layer", "lru", "lfu", "pinned", "min"};
  Replay replay = Replay::Chunk;
  std::vector<ExpertKey> ranking;  // pinned and static; empty: the trace's own (in-sample)
  std::string ranking_source;      // for the report
};

struct Study {
  nlohmann::json json;
  std::string csv;
  std::string table;  // human-readable
};
Study run_study(const Trace& t, const StudyOptions& o);

}  // namespace moetier
