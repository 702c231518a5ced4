// What a checkpoint costs: parameter counts, bytes of the resident core and of
// the experts per encoding, and a memory plan for a budget (how many experts
// the arena holds once the core and the headroom are placed).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/spec.h"

namespace moetier {

struct ExpertEncodingStats {
  int64_t experts = 0;  // (layer, expert) pairs in this encoding
  uint64_t bytes = 0;
};

struct ModelInfo {
  std::string dir;
  std::string architecture;  // the registry name
  int64_t tensors = 0, shards = 0;
  uint64_t file_bytes = 0;  // all shard files
  int64_t layers = 0, moe_layers = 0;
  int64_t experts_per_layer = 0, experts_per_token = 0;
  int64_t total_experts = 0;  // moe_layers * experts_per_layer
  // Parameters: an MXFP4 byte holds two; scales are not parameters.
  int64_t total_params = 0, active_params = 0;  // active: core + top-k experts per layer
  int64_t core_params = 0, params_per_expert = 0;
  uint64_t core_bytes = 0;                              // every tensor that is not an expert's
  uint64_t expert_bytes = 0;                            // all experts, scales included
  uint64_t max_expert_bytes = 0, min_expert_bytes = 0;  // one expert (gate+up+down+scales)
  std::map<std::string, ExpertEncodingStats> expert_encodings;  // "bf16", "f16", "f32", "mxfp4"
  uint64_t kv_bytes_per_token = 0;                              // K and V, all layers, bf16
};

struct MemoryPlan {
  uint64_t budget = 0;
  uint64_t core = 0;      // resident core
  uint64_t headroom = 0;  // KV cache + activations/scratch (or as given)
  int64_t context_tokens = 0;
  uint64_t kv_bytes = 0, scratch_bytes = 0;  // the default headroom's parts
  bool headroom_given = false;
  uint64_t arena = 0;       // budget - core - headroom (0 when that is negative)
  uint64_t slot_bytes = 0;  // largest expert rounded up to 4 KiB
  int64_t experts_fit = 0;  // min(arena / slot, total experts)
  double share = 0;         // experts_fit / total experts
  bool core_fits = false;
  bool all_fit = false;
};

constexpr uint64_t kDefaultScratchBytes = 256ull << 20;

// Counts and bytes of a checkpoint whose config parsed as `c`. Throws Error if
// an MoE layer's experts are missing (check_checkpoint says more).
ModelInfo model_info(const Checkpoint& ck, const ModelSpec& c);
// Validates DIR (throws the first problem check_checkpoint finds), then model_info.
ModelInfo model_info(const std::filesystem::path& dir);

// headroom 0: KV cache for `context` tokens + kDefaultScratchBytes.
MemoryPlan plan_memory(const ModelInfo& m, uint64_t budget, uint64_t headroom = 0,
                       int64_t context = 4096);

nlohmann::ordered_json to_json(const ModelInfo& m, const MemoryPlan* plan = nullptr);
std::string to_text(const ModelInfo& m, const MemoryPlan* plan = nullptr);

}  // namespace moetier
