// The expert-store flags shared by the commands that run a model (run, bench,
// serve): --arena, --arena-experts, --transient, --host-cache, --policy,
// --ranking, --io, --io-depth, --no-direct, --mapped, --stats, --stats-json.
#pragma once

#include <CLI/CLI.hpp>

#include "experts/options.h"

namespace moetier::tools {

void add_expert_options(CLI::App& cmd, ExpertOptions& o);

}  // namespace moetier::tools
