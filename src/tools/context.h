// The context a command may compute in: --ctx N when given, else the model's
// max_position_embeddings. Commands compare what they are about to compute
// (run: prompt + -n; trace: --window + --decode; eval: --max-tokens) with it
// and refuse, before any compute, a sequence that does not fit.
//
// --ctx above max_position_embeddings is allowed with a warning, as llama.cpp
// allows -c above n_ctx_train ("possible training context overflow"):
// RoPE runs at any position, but the model was not trained there.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <string>

#include "model/spec.h"

namespace moetier::tools {

struct ContextLimit {
  int64_t tokens = 0;
  std::string source;  // "--ctx" or "max_position_embeddings in DIR/config.json"
  std::string remedy;  // "pass --ctx N" or "pass a larger --ctx"
};

// Adds --ctx to cmd (0, the default: the model's max_position_embeddings).
void add_ctx_option(CLI::App& cmd, int64_t& ctx);

// ctx: the --ctx value (0: not given). Throws Error for a negative value;
// prints a warning on stderr when ctx exceeds max_position_embeddings (`what`
// prefixes it, e.g. "--arm A: "; may be empty).
ContextLimit context_limit(int64_t ctx, const ModelSpec& cfg, const std::filesystem::path& dir,
                           const std::string& what = "");

}  // namespace moetier::tools
