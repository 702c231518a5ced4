// moetier run DIR --prompt TEXT -n N [--ctx N --temp T --top-k K --top-p P
//   --min-p M --seed S --threads T --ignore-eos]
// Loads a checkpoint, streams the generated text to stdout as tokens
// arrive, then prints one line of figures to stderr (prompt tokens and tok/s,
// generated tokens and decode tok/s). Sampling: the checkpoint's
// generation_config.json over llama.cpp's defaults, flags over both
// (runtime/generation_config.h); the settings used are printed first.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "model/architecture.h"
#include "runtime/generate.h"
#include "runtime/generation_config.h"
#include "runtime/session.h"
#include "tools/command.h"
#include "tools/context.h"
#include "tools/expert_flags.h"

namespace moetier::tools {
namespace {

struct RunArgs {
  std::string dir, prompt;
  int64_t n = 64;
  int64_t ctx = 0;  // 0: max_position_embeddings
  SamplerConfig sampling;
  // The sampling flags given (the others come from the checkpoint or llama.cpp).
  CLI::Option *temp = nullptr, *top_k = nullptr, *top_p = nullptr, *min_p = nullptr;
  int threads = 0;
  bool ignore_eos = false;
  EngineOptions engine;  // --backend, --arena, --transient, --stats, ... (tools/expert_flags.h)
};

bool given(const CLI::Option* o) { return o && o->count() > 0; }

// eos_token_id (an int or a list) of config.json, if any.
std::vector<int32_t> config_eos(const nlohmann::json& j) {
  std::vector<int32_t> ids;
  if (!j.is_object() || !j.contains("eos_token_id")) return ids;
  const auto& e = j["eos_token_id"];
  if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
  if (e.is_array())
    for (const auto& x : e)
      if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
  return ids;
}

// End-of-sequence ids: generation_config.json, else config.json, else the
// tokenizer's eos token.
std::vector<int32_t> find_eos(const GenerationConfig& g, const Checkpoint& ck,
                              const Tokenizer& tok) {
  if (!g.eos.empty()) return g.eos;
  if (auto ids = config_eos(ck.config()); !ids.empty()) return ids;
  if (auto e = tok.eos_id()) return {*e};
  return {};
}

struct Sampling {
  SamplerConfig config;
  std::string line;  // "moetier: sampling: ..." for stderr
};

// Where one setting came from: the flag, the checkpoint's file, or llama.cpp.
std::string origin(const CLI::Option* flag, const char* flag_name, bool in_file) {
  if (given(flag)) return flag_name;
  return in_file ? "generation_config.json" : "llama.cpp default";
}

Sampling resolve_sampling(const RunArgs& a, const GenerationConfig& g) {
  Sampling s{checkpoint_sampling(g), ""};
  SamplerConfig& c = s.config;
  if (given(a.temp)) c.temperature = a.sampling.temperature;
  if (given(a.top_k)) c.top_k = a.sampling.top_k;
  if (given(a.top_p)) c.top_p = a.sampling.top_p;
  if (given(a.min_p)) c.min_p = a.sampling.min_p;
  c.seed = a.sampling.seed;
  const bool no_sample = g.do_sample == false && !given(a.temp);
  const std::string t = no_sample ? "do_sample false in generation_config.json"
                                  : origin(a.temp, "--temp", g.temperature.has_value());
  const std::string k = origin(a.top_k, "--top-k", g.top_k.has_value());
  if (c.temperature <= 0.0f) {
    s.line = fmt::format("moetier: sampling: greedy (temperature 0: {})\n", t);
  } else if (c.top_k == 1) {
    s.line = fmt::format("moetier: sampling: greedy (top-k 1: {})\n", k);
  } else {
    s.line = fmt::format(
        "moetier: sampling: temperature {:g} ({}), top-k {} ({}), top-p {:g} ({}), min-p {:g} "
        "({}), seed {}\n",
        c.temperature, t, c.top_k, k, c.top_p, origin(a.top_p, "--top-p", g.top_p.has_value()),
        c.min_p, origin(a.min_p, "--min-p", g.min_p.has_value()), c.seed);
  }
  return s;
}

// Refuses, before any compute, a prompt + n that does not fit the context.
void check_context(const RunArgs& a, const ModelSpec& cfg, size_t prompt_tokens) {
  const ContextLimit lim = context_limit(a.ctx, cfg, a.dir);
  const int64_t total = int64_t(prompt_tokens) + a.n;
  check(total <= lim.tokens,
        "prompt {} tokens + {} to generate = {} exceed the context of {} ({}); shorten the "
        "prompt, lower -n, or {}",
        prompt_tokens, a.n, total, lim.tokens, lim.source, lim.remedy);
}

void print_figures(const GenerateStats& st) {
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  std::fprintf(stderr,
               "moetier: prompt %lld tokens, %.2f tok/s | generated %lld tokens, %.2f tok/s "
               "decode%s\n",
               (long long)st.prompt_tokens, rate(double(st.prompt_tokens), st.prefill_seconds),
               (long long)st.generated_tokens, rate(double(st.decode_steps), st.decode_seconds),
               st.stopped_at_eos ? " (stopped at eos)" : "");
}

void run(const RunArgs& a) {
  check(a.n >= 0, "-n: {} must not be negative", a.n);
  check(a.threads >= 0, "--threads: {} must not be negative", a.threads);
  auto ck = Checkpoint::open(a.dir);       // "DIR: no such directory", ...
  const ModelSpec spec = model_spec(*ck);  // refuses unsupported architectures
  const GenerationConfig gen = read_generation_config(ck->dir());
  const Sampling sampling = resolve_sampling(a, gen);
  Sampler check_settings(sampling.config);  // refuses bad values before the prompt is encoded
  Tokenizer tok = Tokenizer::load(a.dir);
  check_tokenizer_fits(tok, spec.vocab_size, a.dir);
  const std::vector<int32_t> prompt = tok.encode(a.prompt);
  check(!prompt.empty(), "--prompt: the prompt encodes to no tokens");
  check_context(a, spec, prompt.size());

  if (a.threads > 0) cpu::set_threads(a.threads);  // else MOETIER_THREADS or the CPUs it may use
  std::vector<std::string> log;
  auto engine = Engine::open(std::move(ck), a.engine, &log);
  for (const auto& line : log) std::fprintf(stderr, "moetier: %s\n", line.c_str());
  GenerateOptions go;
  go.max_new_tokens = a.n;
  go.sampling = sampling.config;
  if (!a.ignore_eos) go.eos = find_eos(gen, engine->checkpoint(), tok);
  std::fputs(sampling.line.c_str(), stderr);
  StreamDecoder out(tok);
  auto session = engine->new_session(std::max<int64_t>(1, int64_t(prompt.size()) + a.n));
  const GenerateStats st = generate(*session, prompt, go, [&](int32_t id) {
    const std::string text = out.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  const std::string rest = out.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_figures(st);
  if (!engine->mapped()) report_expert_stats(a.engine.experts, engine->stats());
}

void add_sampling_options(CLI::App& cmd, RunArgs& a) {
  const char* g = "Sampling (default: generation_config.json, else llama.cpp's)";
  a.temp = cmd.add_option("--temp,--temperature", a.sampling.temperature,
                          "Temperature (llama.cpp: 0.8); 0 is greedy")
               ->group(g);
  a.top_k = cmd.add_option("--top-k", a.sampling.top_k,
                           "Keep the K most likely tokens; 0 keeps all (llama.cpp: 40)")
                ->group(g);
  a.top_p = cmd.add_option("--top-p", a.sampling.top_p,
                           "Keep the smallest set reaching probability P; 1 keeps all "
                           "(llama.cpp: 0.95)")
                ->group(g);
  a.min_p = cmd.add_option("--min-p", a.sampling.min_p,
                           "Keep tokens at least M times as likely as the most likely; 0 keeps "
                           "all (llama.cpp: 0.05)")
                ->group(g);
  cmd.add_option("--seed", a.sampling.seed, "Random seed for sampling (default 0)")->group(g);
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming to stdout");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("dir", a->dir, "Checkpoint directory (config.json, weights, tokenizer.json)")
      ->required();
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", a->n, "Tokens to generate (default 64)");
  add_ctx_option(*cmd, a->ctx);
  add_sampling_options(*cmd, *a);
  cmd->add_option("-t,--threads", a->threads,
                  "CPU threads (default: MOETIER_THREADS, else the CPUs it may use)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at end-of-sequence tokens");
  add_engine_options(*cmd, a->engine);
  cmd->callback([a] { run(*a); });
});

}  // namespace
}  // namespace moetier::tools
