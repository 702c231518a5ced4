// moetier report RESULTS... -o report.html [--title TEXT]
// Renders moetier-bench/1 result files (moetier bench, the llama.cpp peer
// converter, `moetier simulate -o` studies) into one self-contained HTML page
// that works offline (docs/report.md). Written atomically.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "report/report.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string out, title;
};

void report(const ReportArgs& a) {
  std::vector<moetier::report::ResultFile> files;
  for (const auto& in : a.inputs) files.push_back(moetier::report::load_result(in));
  moetier::report::ReportOptions opt;
  if (!a.title.empty()) opt.title = a.title;
  const std::string page = moetier::report::render_report(std::move(files), opt);
  write_file_atomic(a.out, page);
  std::fprintf(stderr, "moetier: report: wrote %s (%zu bytes, %zu result file%s)\n", a.out.c_str(),
               page.size(), a.inputs.size(), a.inputs.size() == 1 ? "" : "s");
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "Render bench results (moetier-bench/1 JSON) into one offline HTML page");
  auto a = std::make_shared<ReportArgs>();
  cmd->add_option("results", a->inputs,
                  "Result files: moetier bench --json, converted peers, moetier simulate -o "
                  "PREFIX.json")
      ->required();
  cmd->add_option("-o,--output", a->out, "The HTML file to write")->required();
  cmd->add_option("--title", a->title, "Page title (default: moetier bench report)");
  cmd->callback([a] { report(*a); });
});

}  // namespace
}  // namespace moetier::tools
