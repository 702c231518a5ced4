// moetier run DIR --prompt TEXT -n N [--temperature T --top-k K --top-p P
//   --seed S --threads T --ignore-eos]
// Loads a qwen3_moe checkpoint, streams the generated text to stdout as tokens
// arrive, then prints one line of figures to stderr (prompt tokens and tok/s,
// generated tokens and decode tok/s). Greedy unless --temperature > 0.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "runtime/generate.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "tools/command.h"
#include "tools/expert_flags.h"

namespace moetier::tools {
namespace {

struct RunArgs {
  std::string dir, prompt;
  int64_t n = 64;
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int threads = 0;
  bool ignore_eos = false;
  ExpertOptions experts;  // --arena, --transient, --stats, ... (tools/expert_flags.h)
};

// eos_token_id (an int or a list) of a JSON object, if any.
std::vector<int32_t> eos_ids(const nlohmann::json& j) {
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
std::vector<int32_t> find_eos(const Checkpoint& ck, const Tokenizer& tok) {
  const auto gen = ck.dir() / "generation_config.json";
  if (std::filesystem::exists(gen)) {
    std::ifstream f(gen);
    auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (auto ids = eos_ids(j); !ids.empty()) return ids;
  }
  if (auto ids = eos_ids(ck.config()); !ids.empty()) return ids;
  if (auto e = tok.eos_id()) return {*e};
  return {};
}

void run(const RunArgs& a) {
  check(a.n >= 0, "-n: {} must not be negative", a.n);
  check(a.threads >= 0, "--threads: {} must not be negative", a.threads);
  if (a.threads > 0) cpu::set_threads(a.threads);  // else OMP_NUM_THREADS or all cores
  Tokenizer tok = Tokenizer::load(a.dir);
  auto ck = Checkpoint::open(a.dir);
  const Qwen3MoeModel model = Qwen3MoeModel::load(*ck);
  ExpertStats expert_stats;
  std::unique_ptr<ExpertProvider> provider;
  if (a.experts.mapped) {
    provider = std::make_unique<MappedExperts>(*ck, model.config());
  } else {
    provider = make_expert_provider(*ck, model.config(), a.experts, &expert_stats);
  }
  ExpertProvider& experts = *provider;

  const std::vector<int32_t> prompt = tok.encode(a.prompt);
  check(!prompt.empty(), "--prompt: the prompt encodes to no tokens");
  const int64_t max_pos = model.config().max_position_embeddings;
  if (max_pos > 0 && int64_t(prompt.size()) + a.n > max_pos)
    std::fprintf(stderr,
                 "moetier: warning: %zu prompt + %lld new tokens exceed "
                 "max_position_embeddings %lld\n",
                 prompt.size(), (long long)a.n, (long long)max_pos);

  GenerateOptions go;
  go.max_new_tokens = a.n;
  go.sampling = {a.temperature, a.top_k, a.top_p, a.seed};
  if (!a.ignore_eos) go.eos = find_eos(*ck, tok);
  StreamDecoder out(tok);
  const GenerateStats st = generate(model, experts, prompt, go, [&](int32_t id) {
    const std::string text = out.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  const std::string rest = out.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);

  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  std::fprintf(stderr,
               "moetier: prompt %lld tokens, %.2f tok/s | generated %lld tokens, %.2f tok/s "
               "decode%s\n",
               (long long)st.prompt_tokens, rate(double(st.prompt_tokens), st.prefill_seconds),
               (long long)st.generated_tokens, rate(double(st.decode_steps), st.decode_seconds),
               st.stopped_at_eos ? " (stopped at eos)" : "");
  if (!a.experts.mapped) report_expert_stats(a.experts, expert_stats);
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming to stdout");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("dir", a->dir, "Checkpoint directory (config.json, weights, tokenizer.json)")
      ->required();
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", a->n, "Tokens to generate (default 64)");
  cmd->add_option("--temperature,--temp", a->temperature,
                  "Sampling temperature; 0 (default) is greedy");
  cmd->add_option("--top-k", a->top_k, "Keep the K most likely tokens (0, default: all)");
  cmd->add_option("--top-p", a->top_p, "Keep the smallest set reaching probability P (default 1)");
  cmd->add_option("--seed", a->seed, "Random seed for sampling (default 0)");
  cmd->add_option("-t,--threads", a->threads,
                  "CPU threads (default: OMP_NUM_THREADS, else all cores)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at end-of-sequence tokens");
  add_expert_options(*cmd, a->experts);
  cmd->callback([a] { run(*a); });
});

}  // namespace
}  // namespace moetier::tools
