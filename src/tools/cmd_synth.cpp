// moetier synth --preset NAME [--experts mxfp4|bf16] [--layers N] [--set KEY=VALUE]...
//   --tokenizer DIR -o OUT
// Writes a checkpoint with a real model's shapes and random weights whose
// router has a realistic skew (convert/synth.h), for benchmarks.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "convert/synth.h"
#include "core/error.h"
#include "core/units.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct SynthArgs {
  SynthOptions opt;
  std::string out, tokenizer;
  std::optional<int64_t> layers;
};

void run_synth(SynthArgs a) {
  a.opt.tokenizer = a.tokenizer;
  if (a.layers) {  // (0 would mean the preset's: dozens of layers, hundreds of GB)
    check(*a.layers > 0, "--layers: {} (expected a positive count)", *a.layers);
    a.opt.layers = *a.layers;
  }
  a.opt.log = [](const std::string& l) { std::fprintf(stderr, "moetier: %s\n", l.c_str()); };
  const auto t0 = std::chrono::steady_clock::now();
  const SynthReport r = write_synthetic(a.out, a.opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "synth %s -> %s: %s in %lld shards, %.1f s; router scale %.3f: the top %.0f%% of experts "
      "take %.1f%% of routed calls\n",
      a.opt.preset.c_str(), a.out.c_str(), format_bytes(r.bytes).c_str(), (long long)r.shards, s,
      r.tau, 100 * a.opt.hot_share, 100 * r.hot_calls);
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a checkpoint with a real model's shapes and random weights (benchmarks)");
  auto a = std::make_shared<SynthArgs>();
  cmd->add_option("--preset", a->opt.preset, "Shapes: qwen3-30b-a3b, deepseek-v4-flash-experts")
      ->required();
  cmd->add_option("--experts", a->opt.experts, "Expert encoding: mxfp4 (default) or bf16");
  cmd->add_option("--layers", a->layers, "Layers (default: the preset's)");
  cmd->add_option("--seed", a->opt.seed, "Random seed (default 1)");
  cmd->add_option("--set", a->opt.set,
                  "KEY=VALUE: an integer config.json field of the preset (e.g. num_experts=384); "
                  "repeatable");
  cmd->add_option("--hot-share", a->opt.hot_share, "Share of experts that is hot (default 0.26)");
  cmd->add_option("--hot-calls", a->opt.hot_calls,
                  "Share of routed calls the hot experts take (default 0.74)");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "Directory with the tokenizer.json to ship (its ids must fit the vocabulary)")
      ->required();
  cmd->add_option("-o,--output", a->out, "Output directory (must not exist)")->required();
  cmd->callback([a] { run_synth(*a); });
});

}  // namespace
}  // namespace moetier::tools
