// moetier prune DIR --trace TRACE --keep K|N% -o OUT
// Writes a new checkpoint that keeps the K (or N% of the) most-used experts of every MoE
// layer (use counts from TRACE's JSON summary, a binary trace, or a plain
// {"layers": [[count per expert], ...]} file); docs/prune-repack.md.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "convert/prune.h"
#include "core/progress.h"
#include "core/units.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct PruneArgs {
  std::string dir, trace, out, keep;
};

void run_prune(const PruneArgs& a) {
  InterruptGuard guard;
  ConvertControl control;
  control.cancel = guard.flag();
  std::optional<Progress> prog;  // its total comes with the first call
  control.progress = [&prog](int64_t done, int64_t total) {
    if (!prog) prog.emplace("prune", total);
    prog->update(done, "tensors");
  };
  const PruneReport r = prune_checkpoint(a.dir, a.trace, a.keep, a.out, control);
  if (prog) prog->finish();
  std::printf("pruned %s -> %s: kept %lld of %lld experts per MoE layer (use counts: %s)\n",
              a.dir.c_str(), a.out.c_str(), (long long)r.keep, (long long)r.from,
              r.usage_source.c_str());
  for (size_t l = 0; l < r.coverage.size(); ++l)
    if (r.coverage[l] >= 0)
      std::printf("  layer %zu: kept experts took %.1f%% of the traced selections\n", l,
                  100.0 * r.coverage[l]);
  std::printf(
      "expert bytes: %s -> %s; router bytes: %s -> %s\n",
      format_bytes(r.expert_bytes_before).c_str(), format_bytes(r.expert_bytes_after).c_str(),
      format_bytes(r.router_bytes_before).c_str(), format_bytes(r.router_bytes_after).c_str());
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "prune", "Write a checkpoint that keeps only the K most-used experts of each layer");
  auto a = std::make_shared<PruneArgs>();
  cmd->add_option("dir", a->dir, "Source checkpoint directory")->required();
  cmd->add_option("--trace", a->trace,
                  "Trace from moetier trace (its TRACE.json summary is read), or a JSON file "
                  "{\"layers\": [[uses per expert], ...]}")
      ->required();
  cmd->add_option("--keep", a->keep,
                  "Experts to keep per MoE layer: a count (26) or a share of them (40%, rounded "
                  "up); at least the experts per token")
      ->required();
  cmd->add_option("-o,--output", a->out, "Output directory (must not exist)")->required();
  cmd->callback([a] { run_prune(*a); });
});

}  // namespace
}  // namespace moetier::tools
