// Per-layer expert use counts for `moetier prune`, read from:
//   1. the JSON summary that `moetier trace` writes next to a trace
//      (TRACE.json: "layers": [{"layer": L, "uses": [count per expert]}, ...],
//      docs/trace-and-simulate.md) — given TRACE or TRACE.json;
//   2. a binary trace without its summary (counted with experts/trace.h);
//   3. a plain use-count file {"layers": [[count per expert], ...]}: one list
//      per layer of the model (dense layers: []) or one per MoE layer, in order;
//   4. a ranking text (TRACE.ranking): "LAYER EXPERT USES" per line, '#'
//      comments; experts not listed count 0.
// Counts are non-negative numbers (token-level selections in a trace).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/spec.h"

namespace moetier {

struct ExpertUsage {
  std::string source;                       // the file the counts came from
  std::vector<std::vector<double>> counts;  // [num_layers][num_experts]; empty for dense layers
};

// Throws Error naming the file (and the layer) when the counts do not match
// the model (layer set, experts per layer, negative or non-numeric counts).
ExpertUsage read_expert_usage(const std::filesystem::path& trace, const ModelSpec& cfg);

// The `keep` most-used experts of every MoE layer, ascending by id (ties in
// use go to the smaller id); empty lists for dense layers.
std::vector<std::vector<int32_t>> most_used_experts(const ExpertUsage& u, const ModelSpec& cfg,
                                                    int64_t keep);

}  // namespace moetier
