// One arm of `moetier bench`: an Engine (one backend, one expert store) run
// through workloads, N runs each, each run a fresh Session: prefill the
// prompt in one chunk, then decode gen_tokens greedily (end-of-sequence
// ignored). The result is the arm object of docs/bench-format.md.
//
// Figures per run: ttft_s (prefill + the first token's choice), prompt_tps,
// decode_tps (gen_tokens - 1 decode steps over their time), the expert
// counters' difference over the run (uses, reads, bytes, hit rates per tier,
// stall), /proc/self/io read bytes, the process's peak RSS, the backend's peak
// device memory over the run (Backend::memory_use, when it counts). The first run of
// the arm is cold: the checkpoint's pages are dropped from the page cache
// first (posix_fadvise DONTNEED on every shard; page_cache_dropped says whether
// that succeeded) and the arena is as load left it; later runs are warm.
//
// The bound of each workload: decode 1 / max(active bytes / device copy rate,
// host-tier bytes per token / host-to-device rate + storage bytes per token /
// storage rate) over the decode steps' counters (the first: the memory bound
// alone, all resident); prefill tensor FLOP rate / FLOPs per token.
//
// Single-threaded driver (the Engine's protocol).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bounds.h"
#include "bench/workloads.h"

namespace moetier {

class Engine;
class Tokenizer;

struct ArmOptions {
  std::string name;   // the arm's label
  std::string flags;  // the engine flags, as given
  std::vector<Workload> workloads;
  int runs = 3;
  uint32_t seed = 1;
  bool drop_page_cache = true;  // before the first (cold) run
  // Called before each phase ("prefill code run 1/3") and with one line per
  // finished run; may be empty.
  std::function<void(const std::string& phase)> on_phase;
  std::function<void(const std::string& line)> on_result;
};

// Runs every workload of `opt` on the engine; `bytes` and `bounds` from
// model_bytes() and the probes. Throws Error when a workload does not fit the
// context `ctx` (prompt + gen).
nlohmann::json run_arm(Engine& engine, const Tokenizer* tok, const ArmOptions& opt,
                       const ModelBytes& bytes, const Bounds& bounds, int64_t ctx);

// Adds median/min/max of ttft_s, prompt_tps, decode_tps over the warm runs
// (all runs when there is only one) to the workload object; returns the
// indices of the runs used.
std::vector<size_t> summarize_runs(nlohmann::json& wl, const std::vector<nlohmann::json>& runs);

// The "machine" object: CPU model, cores, RAM; `backend` names the device.
nlohmann::json machine_json(const std::string& backend_name, uint64_t device_memory);
// The moetier build's commit (git describe at configure time).
std::string build_commit();

}  // namespace moetier
