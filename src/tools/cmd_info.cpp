// moetier info DIR [--budget SIZE] [--headroom SIZE] [--context N] [--json]:
// parameter counts, core and expert bytes, and a memory plan for a budget.
#include <cstdio>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "model/info.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct InfoArgs {
  std::string dir, budget, headroom;
  int64_t context = 4096;
  bool json = false;
};

void run_info(const InfoArgs& a) {
  ModelInfo m = model_info(a.dir);
  std::unique_ptr<MemoryPlan> plan;
  if (!a.budget.empty()) {
    uint64_t budget = parse_bytes(a.budget, "--budget");
    uint64_t headroom = a.headroom.empty() ? 0 : parse_bytes(a.headroom, "--headroom");
    check(a.context >= 0, "--context: {} must not be negative", a.context);
    plan = std::make_unique<MemoryPlan>(plan_memory(m, budget, headroom, a.context));
  } else {
    check(a.headroom.empty(), "--headroom: needs --budget");
  }
  if (a.json)
    std::printf("%s\n", to_json(m, plan.get()).dump(2).c_str());
  else
    std::printf("%s", to_text(m, plan.get()).c_str());
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Parameter counts, bytes and a memory plan");
  auto a = std::make_shared<InfoArgs>();
  cmd->add_option("dir", a->dir, "Checkpoint directory")->required();
  cmd->add_option("--budget", a->budget, "Memory budget, e.g. 8GB, 512MiB, 81GB");
  cmd->add_option("--headroom", a->headroom,
                  "Memory kept for KV cache and activations (default: KV cache for --context "
                  "tokens + 256 MiB)");
  cmd->add_option("--context", a->context, "Context tokens for the default headroom (4096)");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] { run_info(*a); });
});

}  // namespace
}  // namespace moetier::tools
