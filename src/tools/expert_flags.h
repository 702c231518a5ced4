// The expert-store flags shared by the commands that run a model (run, bench,
// serve): --arena, --arena-experts, --transient, --host-cache, --policy,
// --ranking, --io, --io-depth, --no-direct, --mapped, --stats, --stats-json;
// and the engine's --backend.
#pragma once

#include <CLI/CLI.hpp>

#include "experts/options.h"
#include "experts/stats.h"
#include "runtime/session.h"

namespace moetier::tools {

void add_expert_options(CLI::App& cmd, ExpertOptions& o);
// --backend cpu|cuda[:N] and the expert options.
void add_engine_options(CLI::App& cmd, EngineOptions& o);

// --stats / --stats-json at the end of a run: prints stats.format() to stderr
// and writes stats.to_json() to the file (atomically). Here, not in experts/:
// library code does not print.
void report_expert_stats(const ExpertOptions& opt, ExpertStats& stats);

}  // namespace moetier::tools
