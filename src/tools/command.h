// Subcommand registry: each cmd_*.cpp registers itself with a static
// Registrar, so adding a command touches no other file.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace moetier::tools {

// setup(app) adds a subcommand to app and its callback (which may throw Error).
using CommandSetup = std::function<void(CLI::App&)>;
std::vector<CommandSetup>& command_registry();
// The process's command line (argv joined by spaces), for results that record it.
std::string& command_line();

struct Registrar {
  explicit Registrar(CommandSetup s) { command_registry().push_back(std::move(s)); }
};

}  // namespace moetier::tools
