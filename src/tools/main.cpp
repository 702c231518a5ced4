// moetier: the command-line entry point. Commands live in cmd_*.cpp.
#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"
#include "tools/command.h"

namespace moetier::tools {
std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> r;
  return r;
}
std::string& command_line() {
  static std::string s;
  return s;
}
}  // namespace moetier::tools

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i)
    moetier::tools::command_line() += (i ? " " : "") + std::string(argv[i]);
  CLI::App app{"moetier: run Mixture-of-Experts models larger than memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moetier 0.1.0");
  for (auto& setup : moetier::tools::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const moetier::Error& e) {
    std::fprintf(stderr, "moetier: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetier: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
