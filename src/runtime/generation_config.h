// generation_config.json (transformers' GenerationConfig file): what a
// checkpoint says about generating from it. moetier reads the sampling fields
// (do_sample, temperature, top_k, top_p, min_p) and eos_token_id; other fields
// are ignored.
//
// The sampling `moetier run` uses (docs/engine.md, "Sampling and moetier
// run"): llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p
// 0.05), each replaced by the checkpoint's field when generation_config.json
// gives it; do_sample false means greedy (temperature 0); command-line flags
// override both. A field given as null counts as absent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "runtime/sampler.h"

namespace moetier {

struct GenerationConfig {
  std::filesystem::path file;  // DIR/generation_config.json; empty when there is none
  std::optional<bool> do_sample;
  std::optional<float> temperature;  // >= 0
  std::optional<int64_t> top_k;      // >= 0 (0: off)
  std::optional<float> top_p;        // (0, 1]
  std::optional<float> min_p;        // [0, 1]
  std::vector<int32_t> eos;          // eos_token_id (an int or a list); empty when absent
};

// Reads DIR/generation_config.json; an empty GenerationConfig when DIR has
// none. Throws Error naming the file, and the field, for a file that is not a
// JSON object or a field of the wrong type or out of range.
GenerationConfig read_generation_config(const std::filesystem::path& dir);

// llama.cpp's defaults (common/common.h): temperature 0.8, top-k 40,
// top-p 0.95, min-p 0.05; seed 0.
SamplerConfig llama_cpp_sampling();

// llama.cpp's defaults with each field `g` gives in their place; do_sample
// false sets temperature 0 (greedy).
SamplerConfig checkpoint_sampling(const GenerationConfig& g);

}  // namespace moetier
