// moetier simulate TRACE --budgets LIST [-o PREFIX] [--transient M]
//   [--policies LIST] [--ranking FILE] [--replay chunk|token] [--encoding NAME]
// Replays a trace (moetier trace) through the engine's own cache policies at
// every budget and prints hit rates and all-k-hit shares beside the static
// frequency-ranked set and Belady's MIN; -o writes PREFIX.json and PREFIX.csv
// (docs/trace-and-simulate.md).
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "experts/policy.h"
#include "experts/simulate.h"
#include "experts/trace.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct SimulateArgs {
  std::string trace, out, ranking, encoding, replay = "chunk";
  std::vector<std::string> budgets, policies;
  int64_t transient = -1;
};

// "a,b,c" (CLI11 also splits repeated flags) -> trimmed non-empty items.
std::vector<std::string> split_list(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& s : in) {
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    }
  }
  return out;
}

void simulate(const SimulateArgs& a) {
  StudyOptions o;
  o.budgets = split_list(a.budgets);
  check(!o.budgets.empty(), "--budgets: give at least one budget (e.g. 64,10%,2MB)");
  if (!a.policies.empty()) o.policies = split_list(a.policies);
  o.transient = a.transient;
  o.encoding = a.encoding;
  o.replay = parse_replay(a.replay);
  const Trace t = read_trace(a.trace);
  if (!a.ranking.empty()) {
    o.ranking = read_ranking(a.ranking, t.header.model.num_layers, t.header.model.num_experts);
    o.ranking_source = a.ranking;
  }
  const Study s = run_study(t, o);
  std::fputs(s.table.c_str(), stdout);
  if (!a.out.empty()) {
    write_file_atomic(a.out + ".json", s.json.dump(1) + "\n");
    write_file_atomic(a.out + ".csv", s.csv);
    std::fprintf(stderr, "moetier: simulate: wrote %s.json and %s.csv\n", a.out.c_str(),
                 a.out.c_str());
  }
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "simulate", "Replay a routing trace through the cache policies at several budgets");
  auto a = std::make_shared<SimulateArgs>();
  cmd->add_option("trace", a->trace, "Trace file from moetier trace")->required();
  cmd->add_option("--budgets", a->budgets,
                  "Hot-set budgets: experts (100), shares of all experts (10%) or bytes (64MB), "
                  "comma-separated")
      ->required();
  cmd->add_option("-o,--output", a->out, "Write PREFIX.json and PREFIX.csv");
  cmd->add_option("--transient", a->transient,
                  "Ring slots of the ring variants (default: the engine's min(E, max(k, hot/8)); "
                  "0: no ring variants)");
  cmd->add_option("--policies", a->policies,
                  "Subset of static,static_layer,lru,lfu,pinned,min (default: all)");
  cmd->add_option("--ranking", a->ranking,
                  "Ranking file for pinned and static (default: the trace's own, in-sample)");
  cmd->add_option("--replay", a->replay,
                  "chunk (default: as the engine acquires) or token (one acquire per token)");
  cmd->add_option("--encoding", a->encoding,
                  "Encoding whose expert size converts byte budgets (default: the model's own "
                  "slot size, as --arena)");
  cmd->callback([a] { simulate(*a); });
});

}  // namespace
}  // namespace moetier::tools
