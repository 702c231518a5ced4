// moetier repack DIR --experts cb3 [--calib CORPUS] -o OUT
// Writes a new checkpoint whose experts are CB3 (per-row 8-entry f16 codebook
// + packed 3-bit codes) fitted by weighted k-means; docs/prune-repack.md.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "convert/repack.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "kernels/cpu/cpu.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct RepackArgs {
  std::string dir, out, calib;
  RepackOptions opt;
  int threads = 0;
};

void run_repack(RepackArgs& a) {
  check(a.threads >= 0, "--threads: {} must not be negative", a.threads);
  if (a.threads > 0) cpu::set_threads(a.threads);
  InterruptGuard guard;
  a.opt.control.cancel = guard.flag();
  a.opt.calib = a.calib;
  std::optional<Progress> prog;  // its total comes with the first call
  a.opt.control.progress = [&prog](int64_t done, int64_t total) {
    if (!prog) prog.emplace("repack", total);
    prog->update(done, "expert matrices");
  };
  if (::isatty(2))  // the calibration line only for a person watching
    a.opt.log = [](const std::string& line) {
      std::fprintf(stderr, "moetier: %s\n", line.c_str());
    };
  const RepackReport r = repack_checkpoint(a.dir, a.out, a.opt);
  if (prog) prog->finish();
  std::printf("repacked %s -> %s: %lld expert matrices %s -> cb3\n", a.dir.c_str(), a.out.c_str(),
              (long long)r.matrices, r.source_encoding.c_str());
  std::printf("expert bytes: %s -> %s\n", format_bytes(r.expert_bytes_before).c_str(),
              format_bytes(r.expert_bytes_after).c_str());
  std::printf("weighted relative squared error per matrix: mean %.3g, max %.3g\n", r.rel_err_mean,
              r.rel_err_max);
  if (!a.calib.empty())
    std::printf("calibration: %lld tokens in %lld windows; %lld experts saw no token\n",
                (long long)r.calib_tokens, (long long)r.calib_windows, (long long)r.calib_unrouted);
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "repack", "Write a checkpoint whose experts are re-encoded (cb3: 3-bit codebooks)");
  auto a = std::make_shared<RepackArgs>();
  cmd->add_option("dir", a->dir, "Source checkpoint directory")->required();
  cmd->add_option("--experts", a->opt.experts, "Target expert encoding (cb3)")->required();
  cmd->add_option("--calib", a->calib,
                  "Text corpus: weight the fit by the mean squared input activations");
  cmd->add_option("--calib-tokens", a->opt.calib_opt.max_tokens,
                  "Corpus tokens to run for calibration (default 8192)");
  cmd->add_option("--calib-window", a->opt.calib_opt.window,
                  "Tokens per calibration sequence (default 256)");
  cmd->add_option("--iterations", a->opt.iterations, "Lloyd iterations per row (default 16)");
  cmd->add_option("-t,--threads", a->threads,
                  "CPU threads (default: MOETIER_THREADS, else the CPUs it may use)");
  cmd->add_option("-o,--output", a->out, "Output directory (must not exist)")->required();
  cmd->callback([a] { run_repack(*a); });
});

}  // namespace
}  // namespace moetier::tools
