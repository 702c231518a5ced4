#include "tools/context.h"

#include <cstdio>

#include "core/error.h"

namespace moetier::tools {

void add_ctx_option(CLI::App& cmd, int64_t& ctx) {
  cmd.add_option("-c,--ctx", ctx,
                 "Context length in tokens (default: the model's max_position_embeddings; "
                 "more is allowed with a warning)");
}

ContextLimit context_limit(int64_t ctx, const ModelSpec& cfg, const std::filesystem::path& dir,
                           const std::string& what) {
  check(ctx >= 0, "--ctx: {} must not be negative (0: the model's max_position_embeddings)", ctx);
  const std::string config = (dir / "config.json").string();
  if (ctx == 0) return {cfg.max_positions, "max_position_embeddings in " + config, "pass --ctx N"};
  if (ctx > cfg.max_positions)
    std::fprintf(stderr,
                 "moetier: warning: %s--ctx %lld exceeds max_position_embeddings %lld of %s: "
                 "the model was not trained on positions past %lld\n",
                 what.c_str(), (long long)ctx, (long long)cfg.max_positions, config.c_str(),
                 (long long)cfg.max_positions);
  return {ctx, "--ctx", "pass a larger --ctx"};
}

}  // namespace moetier::tools
