// moetier bench DIR [--workload code,prose,random-8k | --prompt-tokens N --gen N]
//   [--runs N] [--name ARM] [--json FILE [--append]] [--no-probe] [--no-drop-cache]
//   [--threads T] [--ctx N] [--seed S] [--backend cpu|cuda] [expert flags]
//
// Measures one arm (this engine configuration) on the workloads
// (bench/workloads.h) and writes the moetier-bench/1 JSON of
// docs/bench-format.md; --append adds the arm to an existing file (arms of
// other engines, e.g. llama.cpp, come from scripts/peers). One line per run
// and a table go to stderr.
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <fstream>

#include "bench/bounds.h"
#include "bench/coherence.h"
#include "bench/endpoint.h"
#include "bench/runner.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "experts/index.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "model/architecture.h"
#include "monitor/monitor.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tools/command.h"
#include "tools/context.h"
#include "tools/expert_flags.h"

namespace moetier::tools {
namespace {

using nlohmann::json;

struct BenchArgs {
  std::string dir, workloads = "code,prose,random-8k", name, json_path, endpoint, model;
  double timeout_s = 600;
  bool coherence = false;
  std::string coherence_file;
  int64_t prompt_tokens = 0, gen = 0, ctx = 0;
  int runs = 3, threads = 0;
  double monitor_period = 5.0;
  uint32_t seed = 1;
  bool append = false, no_probe = false, no_drop = false;
  EngineOptions engine;
  std::string argv;
};

std::vector<Workload> pick_workloads(const BenchArgs& a) {
  std::vector<Workload> w;
  if (a.prompt_tokens > 0 || a.gen > 0) {
    w.push_back(custom_workload(a.prompt_tokens, a.gen));
    return w;
  }
  std::string s = a.workloads;
  for (size_t p = 0; p <= s.size();) {
    const size_t c = std::min(s.find(',', p), s.size());
    if (c > p) w.push_back(workload(s.substr(p, c - p)));
    p = c + 1;
  }
  check(!w.empty(), "--workload: no workload named");
  return w;
}

std::string engine_flags(const BenchArgs& a) {
  const ExpertOptions& e = a.engine.experts;
  std::string f = "--backend " + a.engine.backend;
  if (!e.arena.empty()) f += " --arena " + e.arena;
  if (e.arena_experts >= 0) f += fmt::format(" --arena-experts {}", e.arena_experts);
  if (!e.host_cache.empty()) f += " --host-cache " + e.host_cache;
  if (e.prefetch != "none") f += " --prefetch " + e.prefetch;
  if (e.transient >= 0) f += fmt::format(" --transient {}", e.transient);
  if (e.mapped) f += " --mapped";
  if (e.policy != "lru") f += " --policy " + e.policy;
  if (a.threads > 0) f += fmt::format(" --threads {}", a.threads);
  return f;
}

// host_read: probe_host_read()'s figure, taken before the engine loaded (so
// that its buffer adds nothing to the run's peak resident memory).
Bounds probe(Engine& e, const ExpertIndex& index, bool storage, std::optional<double> host_read) {
  Bounds b;
  std::fprintf(stderr, "moetier: bench: measuring the machine's bounds\n");
  b.device_copy = probe_device_copy(e.backend());
  if (e.backend().is_host()) b.host_read = host_read;
  b.host_to_device = probe_host_to_device(e.backend());
  b.tensor_flops = probe_tensor_flops(e.backend());
  if (storage) b.storage = probe_storage(e.checkpoint(), index);
  return b;
}

json memory_json(const Engine& e, const ModelBytes& mb) {
  const ExpertStats& s = const_cast<Engine&>(e).stats();
  json m = {{"core_bytes", mb.core}};
  if (e.mapped()) {
    m["arena_bytes"] = mb.experts;
  } else {
    m["arena_bytes"] = (s.hot_slots + s.transient_slots) * s.slot_bytes;
    m["host_tier_bytes"] = s.host_slots * s.slot_bytes;
  }
  m["device_total_bytes"] = e.backend().device_memory();
  return m;
}

json model_json(const Engine& e, const ModelBytes& mb, const std::string& dir) {
  const ModelSpec& s = e.spec();
  json m = mb.to_json();
  m["dir"] = dir;
  m["architecture"] = std::string(s.arch->name());
  m["layers"] = s.num_layers;
  m["experts_per_layer"] = s.num_experts;
  m["top_k"] = s.experts_per_token;
  return m;
}

void print_table(const json& arm) {
  std::fprintf(stderr, "%-20s %8s %8s %12s %12s %10s %10s\n", "workload", "prompt", "gen",
               "prompt tok/s", "decode tok/s", "ttft s", "of bound");
  for (const json& w : arm["workloads"]) {
    const json& m = w["median"];
    const double f =
        w.contains("fraction_of_bound") ? w["fraction_of_bound"].value("decode_tps", 0.0) : 0.0;
    std::fprintf(stderr, "%-20s %8lld %8lld %12.1f %12.2f %10.3f %9.1f%%\n",
                 w["name"].get<std::string>().c_str(), w.value("prompt_tokens", 0LL),
                 w.value("gen_tokens", 0LL), m.value("prompt_tps", 0.0), m.value("decode_tps", 0.0),
                 m.value("ttft_s", 0.0), 100 * f);
  }
}

json result_file(const BenchArgs& a, const json& machine, const json& bounds) {
  if (a.append && std::filesystem::exists(a.json_path)) {
    std::ifstream f(a.json_path);
    json j = json::parse(f, nullptr, false);
    check(!j.is_discarded() && j.value("schema", "") == "moetier-bench/1",
          "{}: not a moetier-bench/1 file (--append)", a.json_path);
    return j;
  }
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"schema", "moetier-bench/1"}, {"command", a.argv},
          {"commit", build_commit()},    {"started", when},
          {"machine", machine},          {"bounds", bounds},
          {"arms", json::array()}};
}

// The coherence gate's result (and one line on stderr).
json gate(const BenchArgs& a, const std::function<std::string(const std::string&, int64_t)>& gen) {
  const auto checks = a.coherence_file.empty() ? default_coherence_checks()
                                               : load_coherence_checks(a.coherence_file);
  json r = run_coherence(checks, gen);
  std::fprintf(stderr, "moetier: coherence gate: %zu prompts, %zu failures\n",
               r["prompts"].get<size_t>(), r["failures"].get<size_t>());
  return r;
}

// Greedy continuation of prompt on the engine, as text.
std::string engine_complete(const Engine& e, const Tokenizer& tok, const std::string& prompt,
                            int64_t n) {
  const std::vector<int32_t> ids = tok.encode(prompt);
  check(!ids.empty(), "--coherence: a prompt encodes to no tokens");
  auto s = e.new_session(int64_t(ids.size()) + n + 1);
  std::vector<int32_t> out{argmax(s->prefill(ids))};
  while (int64_t(out.size()) < n) out.push_back(s->decode_greedy(out.back()));
  return tok.decode(out);
}

// --endpoint: the workloads through an OpenAI-compatible server; DIR (when
// given) supplies the tokenizer, for random prompts' ids and prompt counts.
void bench_endpoint(const BenchArgs& a, const std::vector<Workload>& workloads) {
  std::optional<Tokenizer> tok;
  if (!a.dir.empty()) tok.emplace(Tokenizer::load(a.dir));
  EndpointOptions o;
  o.url = a.endpoint;
  o.model = a.model;
  o.name = a.name;
  o.workloads = workloads;
  o.runs = a.runs;
  o.seed = a.seed;
  o.timeout_s = a.timeout_s;
  o.tok = tok ? &*tok : nullptr;
  o.vocab = tok ? tok->vocab_size() : 0;
  o.on_result = [](const std::string& l) { std::fprintf(stderr, "moetier: %s\n", l.c_str()); };
  json arm = run_endpoint(o);
  if (a.coherence || !a.coherence_file.empty())
    arm["coherence"] =
        gate(a, [&](const std::string& p, int64_t n) { return endpoint_complete(o, p, n); });
  print_table(arm);
  if (a.json_path.empty()) return;
  json out = result_file(a, machine_json("endpoint " + a.endpoint, 0), json::object());
  out["arms"].push_back(std::move(arm));
  write_file_atomic(a.json_path, out.dump(2) + "\n");
}

// The engine, with a progress bar over open()'s stages; sets load_s.
std::unique_ptr<Engine> open_engine(const BenchArgs& a, double& load_s) {
  std::vector<std::string> log;
  const auto t0 = std::chrono::steady_clock::now();
  EngineOptions eo = a.engine;
  Progress load("bench: load " + a.dir, 3);
  eo.on_load = [&load](int64_t d, int64_t, const char* stage) { load.update(d, stage); };
  auto e = Engine::open(a.dir, eo, &log);
  load.finish();
  load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& line : log) std::fprintf(stderr, "moetier: %s\n", line.c_str());
  return e;
}

// The arm's options: each finished run is a line above the runs' progress bar,
// each phase a monitor sample.
ArmOptions arm_options(const BenchArgs& a, const std::vector<Workload>& workloads,
                       monitor::Monitor& mon, Progress& runs) {
  ArmOptions opt;
  opt.flags = engine_flags(a);
  opt.name = a.name.empty() ? "moetier " + opt.flags : a.name;
  opt.workloads = workloads;
  opt.runs = a.runs;
  opt.seed = a.seed;
  opt.drop_page_cache = !a.no_drop;
  opt.on_result = [&runs, done = int64_t(0)](const std::string& l) mutable {
    runs.note("moetier: " + l);
    runs.update(++done, "runs");
  };
  opt.on_phase = [&mon](const std::string& phase) {
    mon.set_phase(phase);
    mon.sample_now();
  };
  return opt;
}

void bench(const BenchArgs& a) {
  check(a.runs >= 1, "--runs: {} must be at least 1", a.runs);
  const std::vector<Workload> workloads = pick_workloads(a);
  if (!a.coherence_file.empty()) load_coherence_checks(a.coherence_file);  // refused up front
  if (!a.endpoint.empty()) return bench_endpoint(a, workloads);
  check(!a.dir.empty(), "bench: a checkpoint DIR (or --endpoint URL) is needed");
  if (a.threads > 0) cpu::set_threads(a.threads);
  monitor::Monitor mon(a.monitor_period);  // samples every phase (docs/bench-format.md "monitor")
  mon.set_phase("load");
  mon.sample_now();
  std::optional<double> host_read;  // the CPU backend's decode bound, before the weights load
  if (!a.no_probe && a.engine.backend == "cpu") host_read = probe_host_read();
  double load_s = 0;
  auto e = open_engine(a, load_s);
  const ContextLimit lim = context_limit(a.ctx, e->spec(), a.dir);
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(std::filesystem::path(a.dir) / "tokenizer.json"))
    tok.emplace(Tokenizer::load(a.dir));
  const ExpertIndex index = ExpertIndex::build(e->checkpoint(), e->spec());
  const ModelBytes mb = model_bytes(e->checkpoint(), e->spec(), index);
  const Bounds b = a.no_probe ? Bounds{} : probe(*e, index, !e->mapped(), host_read);
  Progress runs("bench", int64_t(workloads.size()) * a.runs);
  json arm =
      run_arm(*e, tok ? &*tok : nullptr, arm_options(a, workloads, mon, runs), mb, b, lim.tokens);
  runs.finish();
  if (a.coherence || !a.coherence_file.empty()) {
    check(tok.has_value(), "--coherence: {} has no tokenizer.json", a.dir);
    mon.set_phase("coherence");
    arm["coherence"] =
        gate(a, [&](const std::string& p, int64_t n) { return engine_complete(*e, *tok, p, n); });
  }
  arm["model"] = model_json(*e, mb, a.dir);
  arm["memory"] = memory_json(*e, mb);
  arm["load_s"] = load_s;
  arm["bounds"] = b.to_json();
  if (!e->mapped()) arm["expert_stats"] = e->stats().to_json();
  print_table(arm);
  if (a.json_path.empty()) return;
  json machine = machine_json(e->backend().name(), e->backend().device_memory());
  machine.update(monitor::gpu_identity());
  json out = result_file(a, machine, b.to_json());
  mon.set_phase("done");
  mon.sample_now();
  arm["monitor"] = mon.to_json();
  if (!out.contains("monitor")) out["monitor"] = arm["monitor"];
  out["arms"].push_back(std::move(arm));
  write_file_atomic(a.json_path, out.dump(2) + "\n");
}

const Registrar reg([](CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure TTFT, prompt and decode speed per workload");
  cmd->add_option("dir", a->dir, "Checkpoint directory (with --endpoint: its tokenizer, optional)");
  cmd->add_option("--endpoint", a->endpoint,
                  "Drive an OpenAI-compatible server instead (http://HOST:PORT[/v1])");
  cmd->add_option("--model", a->model, "The request's model name (with --endpoint)");
  cmd->add_flag("--coherence", a->coherence,
                "Run the coherence gate (built-in code prompts with checkable answers)");
  cmd->add_option("--coherence-file", a->coherence_file,
                  "The gate's prompts: a JSON array of {\"prompt\", \"expect\"}");
  cmd->add_option("--timeout", a->timeout_s, "Seconds to wait for the server (default 600)");
  cmd->add_option(
      "--workload", a->workloads,
      "Comma-separated workloads: " + workload_names() + " (default code,prose,random-8k)");
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "A custom random prompt of N tokens");
  cmd->add_option("--gen", a->gen, "Tokens to generate in the custom workload");
  cmd->add_option("--runs", a->runs, "Runs per workload (default 3; the first run is cold)");
  cmd->add_option("--name", a->name, "The arm's label in the results");
  cmd->add_option("--json", a->json_path, "Write the results (moetier-bench/1) to FILE");
  cmd->add_flag("--append", a->append, "Add this arm to the arms already in --json FILE");
  cmd->add_flag("--no-probe", a->no_probe, "Do not measure the machine's bounds");
  cmd->add_flag("--no-drop-cache", a->no_drop, "Keep the page cache before the cold run");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: MOETIER_THREADS or all)");
  cmd->add_option("--seed", a->seed, "Seed of random prompts (default 1)");
  cmd->add_option("--monitor-period", a->monitor_period,
                  "Seconds between monitor samples (default 5; 0: only at phase changes)");
  add_ctx_option(*cmd, a->ctx);
  add_engine_options(*cmd, a->engine);
  cmd->callback([a] {
    a->argv = command_line();
    bench(*a);
  });
});

}  // namespace
}  // namespace moetier::tools
