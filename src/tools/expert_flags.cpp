#include "tools/expert_flags.h"

#include <cstdio>

#include "core/atomic_file.h"

namespace moetier::tools {

void add_expert_options(CLI::App& cmd, ExpertOptions& o) {
  const char* g = "Expert memory";
  // The library never prints; the CLI shows its notes (an O_DIRECT fallback).
  o.note = [](const std::string& line) {
    std::fprintf(stderr, "moetier: note: %s\n", line.c_str());
  };
  cmd.add_option("--arena", o.arena,
                 "Hot expert slots as bytes (8GiB, 500MB) or a share of all experts (25%); "
                 "default: half of MemAvailable")
      ->group(g);
  cmd.add_option("--arena-experts", o.arena_experts, "Hot expert slots as a count")->group(g);
  cmd.add_option("--transient", o.transient,
                 "Transient ring slots for prompt processing (default min(E, max(k, hot/8)))")
      ->group(g);
  cmd.add_option("--host-cache", o.host_cache, "Host-RAM expert tier in bytes (default none)")
      ->group(g);
  cmd.add_option("--policy", o.policy, "Hot-set policy: lru (default), lfu, pinned")
      ->check(CLI::IsMember({"lru", "lfu", "pinned"}))
      ->group(g);
  cmd.add_option("--ranking", o.ranking, "Ranking file for --policy pinned (from moetier trace)")
      ->group(g);
  cmd.add_option("--io", o.io, "Storage reader: auto (default), uring, pool")
      ->check(CLI::IsMember({"auto", "uring", "pool"}))
      ->group(g);
  cmd.add_option("--io-depth", o.io_depth, "Reads in flight (io_uring depth / pread threads)")
      ->group(g);
  cmd.add_flag("--no-direct", o.buffered, "Read experts through the page cache, not O_DIRECT")
      ->group(g);
  cmd.add_flag("--mapped", o.mapped,
               "All experts resident through the checkpoint's mmap (no arena, no counters)")
      ->group(g);
  cmd.add_option("--prefetch", o.prefetch,
                 "Expert prefetch at decode: none (default), next-layer (layer L+1's router on "
                 "layer L's hidden state; counted in --stats; on the CUDA mapped host tier "
                 "it stages the predicted host experts during the layer before, measured "
                 "slower there: docs/cache-protocol.md)")
      ->check(CLI::IsMember({"none", "next-layer"}))
      ->group(g);
  cmd.add_flag("--stats", o.stats, "Print the expert memory counters at the end")->group(g);
  cmd.add_option("--stats-json", o.stats_json, "Write the expert memory counters as JSON")
      ->group(g);
}

void add_engine_options(CLI::App& cmd, EngineOptions& o) {
  cmd.add_option("--backend", o.backend, "Compute backend: cpu (default), cuda, cuda:N");
  add_expert_options(cmd, o.experts);
}

void report_expert_stats(const ExpertOptions& opt, ExpertStats& stats) {
  stats.sample_process_io();
  if (opt.stats) std::fputs(stats.format().c_str(), stderr);
  if (!opt.stats_json.empty()) write_file_atomic(opt.stats_json, stats.to_json().dump(2) + "\n");
}

}  // namespace moetier::tools
