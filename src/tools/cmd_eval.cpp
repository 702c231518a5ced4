// moetier eval --arm A=DIR --arm B=DIR --corpus code=FILE --corpus prose=FILE
//   [--max-tokens 512 --windows N --ctx N --threads T -o FILE] [expert-store flags]
// Teacher-forced held-out NLL and top-1 accuracy per corpus and arm, every arm
// scoring the same token ids in the same windows, and each arm's difference
// from the first arm with paired standard errors (runtime/eval.h,
// docs/eval.md). Prints a table to stdout, progress to stderr, and writes the
// JSON report to -o FILE (atomically).
//
// Order of work: every arm's directory, architecture and context (--max-tokens
// must fit --ctx, else each arm's max_position_embeddings) are checked first;
// then all corpora are read and tokenized by every arm's tokenizer (arms whose
// ids differ are an error before any model loads); then each
// arm is loaded, scored on every corpus and released in turn, so one model is
// in memory at a time.

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "model/architecture.h"
#include "runtime/eval.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tools/command.h"
#include "tools/context.h"
#include "tools/expert_flags.h"

namespace moetier::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct EvalArgs {
  std::vector<std::string> arms, corpora;  // NAME=DIR, NAME=FILE
  int64_t max_tokens = 512;
  int64_t windows = 0;  // 0: every whole window
  int64_t ctx = 0;      // 0: each arm's max_position_embeddings
  int threads = 0;
  std::string output;
  ExpertOptions experts;
  std::string backend = "cpu";
};

struct Named {
  std::string name;
  fs::path path;
};

struct Corpus {
  Named src;
  uint64_t bytes = 0;
  std::vector<int32_t> ids;  // [tokens] under the (common) tokenizer
  int64_t windows = 0;
};

struct ArmResult {
  Named arm;
  std::string store;                             // "mapped" or the arena summary
  std::vector<std::vector<WindowScore>> scores;  // [corpus][window]
  std::vector<double> seconds;                   // [corpus]
  json expert_stats;                             // arena runs only
};

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == '+'))
      return false;
  return true;
}

// "NAME=PATH" -> {NAME, PATH}; names are [A-Za-z0-9_.+-]{1,64} and unique.
std::vector<Named> parse_named(const char* flag, const char* what,
                               const std::vector<std::string>& items) {
  std::vector<Named> out;
  for (const std::string& s : items) {
    const size_t eq = s.find('=');
    check(eq != std::string::npos && eq + 1 < s.size() && valid_name(s.substr(0, eq)),
          "{}: '{}' is not NAME={} (NAME of letters, digits, '_', '-', '.', '+')", flag, s, what);
    Named n{s.substr(0, eq), fs::path(s.substr(eq + 1))};
    for (const Named& o : out)
      check(o.name != n.name, "{}: the name '{}' is given twice", flag, n.name);
    out.push_back(std::move(n));
  }
  return out;
}

std::string read_text(const Named& c) {
  std::error_code ec;
  check(fs::is_regular_file(c.path, ec), "--corpus {}: {}: no such file", c.name, c.path.string());
  std::ifstream f(c.path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  check(f.good() || f.eof(), "--corpus {}: {}: cannot read the file", c.name, c.path.string());
  return s.str();
}

// f() with an Error's message prefixed by the arm ("--arm A: ..."; it names the file).
template <typename F>
auto in_arm(const Named& arm, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("--arm", 0) == 0) throw;
    throw Error(fmt::format("--arm {}: {}", arm.name, what));
  }
}

// Corpus ids under arm 0's tokenizer; every other arm's tokenizer must give
// the same ids for every corpus (and the same vocabulary size).
std::vector<Corpus> tokenize_corpora(const std::vector<Named>& arms,
                                     const std::vector<int64_t>& model_vocab,
                                     const std::vector<Named>& sources) {
  std::vector<std::string> texts;
  std::vector<Corpus> out;
  for (const Named& s : sources) {
    texts.push_back(read_text(s));
    out.push_back(Corpus{s, texts.back().size(), {}, 0});
  }
  int32_t vocab0 = 0;
  for (size_t a = 0; a < arms.size(); ++a) {
    const Tokenizer tok = in_arm(arms[a], [&] {
      Tokenizer t = Tokenizer::load(arms[a].path);
      check_tokenizer_fits(t, model_vocab[a], arms[a].path);
      return t;
    });
    if (a == 0) vocab0 = tok.vocab_size();
    check(tok.vocab_size() == vocab0,
          "--arm {} ({}) and --arm {} ({}): tokenizers differ (vocabulary {} vs {})", arms[0].name,
          arms[0].path.string(), arms[a].name, arms[a].path.string(), vocab0, tok.vocab_size());
    for (size_t c = 0; c < out.size(); ++c) {
      std::vector<int32_t> ids = tok.encode(texts[c], /*add_special_tokens=*/false);
      if (a == 0) {
        out[c].ids = std::move(ids);
        continue;
      }
      if (ids == out[c].ids) continue;
      size_t i = 0;
      while (i < ids.size() && i < out[c].ids.size() && ids[i] == out[c].ids[i]) ++i;
      fail(
          "--arm {} ({}) and --arm {} ({}): tokenizers differ: corpus {} ({}) is {} vs {} ids, "
          "first different at id {}",
          arms[0].name, arms[0].path.string(), arms[a].name, arms[a].path.string(), out[c].src.name,
          out[c].src.path.string(), out[c].ids.size(), ids.size(), i);
    }
  }
  return out;
}

void check_windows(std::vector<Corpus>& corpora, const EvalArgs& a) {
  for (Corpus& c : corpora) {
    c.windows = eval_window_count(int64_t(c.ids.size()), a.max_tokens, a.windows);
    check(c.windows > 0,
          "--corpus {}: {} is {} tokens, shorter than one window of {} (--max-tokens)", c.src.name,
          c.src.path.string(), c.ids.size(), a.max_tokens);
  }
}

// Before any corpus is read: every arm is a checkpoint directory of a supported
// architecture whose context holds a window of --max-tokens. Returns their
// vocab_size.
std::vector<int64_t> check_arms(const std::vector<Named>& arms, const EvalArgs& a) {
  std::vector<int64_t> vocab;
  for (const Named& arm : arms) {
    in_arm(arm, [&] {
      auto ck = Checkpoint::open(arm.path);
      const ModelSpec cfg = model_spec(*ck);
      vocab.push_back(cfg.vocab_size);
      const ContextLimit lim = context_limit(a.ctx, cfg, arm.path, "--arm " + arm.name + ": ");
      check(a.max_tokens <= lim.tokens,
            "--max-tokens {} exceeds the context of {} ({}); lower --max-tokens or {}",
            a.max_tokens, lim.tokens, lim.source, lim.remedy);
    });
  }
  return vocab;
}

// Arena unless --mapped or no arena sizing flag: eval defaults to the mmap.
bool use_arena(const ExpertOptions& o) {
  return !o.mapped && (!o.arena.empty() || o.arena_experts >= 0 || !o.host_cache.empty());
}

std::string arena_description(const ExpertOptions& o) {
  std::string s = "arena";
  if (!o.arena.empty()) s += " --arena " + o.arena;
  if (o.arena_experts >= 0) s += fmt::format(" --arena-experts {}", o.arena_experts);
  if (o.transient >= 0) s += fmt::format(" --transient {}", o.transient);
  if (!o.host_cache.empty()) s += " --host-cache " + o.host_cache;
  return s + " --policy " + o.policy;
}

// Loads one arm, scores every corpus, releases the model on return.
ArmResult score_arm(const Named& arm, const std::vector<Corpus>& corpora, const EvalArgs& a) {
  ArmResult r{arm, "mapped", {}, {}, json()};
  EngineOptions eo;
  eo.backend = a.backend;
  eo.experts = a.experts;
  eo.experts.mapped = !use_arena(a.experts);
  eo.experts.quiet = true;
  auto engine = Engine::open(arm.path, eo);
  const ModelSpec& cfg = engine->spec();
  for (const Corpus& c : corpora)
    for (int32_t id : c.ids)
      check(id >= 0 && id < cfg.vocab_size,
            "--arm {} ({}): corpus {} has token id {}, outside the model's vocabulary [0, {})",
            arm.name, arm.path.string(), c.src.name, id, cfg.vocab_size);

  if (use_arena(a.experts)) r.store = arena_description(a.experts);
  for (const Corpus& c : corpora) {
    EvalOptions ev;
    ev.window = a.max_tokens;
    ev.max_windows = c.windows;
    Progress prog("eval " + arm.name + " " + c.src.name, c.windows);
    ev.progress = [&prog](int64_t d, int64_t) { prog.update(d, "windows"); };
    const auto t0 = std::chrono::steady_clock::now();
    r.scores.push_back(score_windows(engine->model(), engine->experts(), c.ids, ev));
    r.seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const double tokens = double(c.windows * a.max_tokens);
    prog.finish(fmt::format("{} windows x {} tokens in {:.1f} s ({:.0f} tok/s)", c.windows,
                            a.max_tokens, r.seconds.back(),
                            r.seconds.back() > 0 ? tokens / r.seconds.back() : 0.0));
  }
  if (use_arena(a.experts)) {
    ExpertStats& stats = engine->stats();
    stats.sample_process_io();
    if (a.experts.stats) std::fputs(stats.format().c_str(), stderr);
    r.expert_stats = stats.to_json();
  }
  return r;
}

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json summary_json(const std::vector<WindowScore>& w, double seconds) {
  const ScoreSummary s = summarize(w);
  json nll = json::array(), cor = json::array();
  for (const WindowScore& x : w) {
    nll.push_back(x.nll_sum);
    cor.push_back(x.correct);
  }
  return {{"windows", s.windows},
          {"predicted_tokens", s.predicted},
          {"nll_sum", s.nll_sum},
          {"mean_nll", number(s.mean_nll)},
          {"mean_nll_se", number(s.mean_nll_se)},
          {"perplexity", number(s.perplexity)},
          {"correct", s.correct},
          {"top1", number(s.top1)},
          {"top1_se", number(s.top1_se)},
          {"seconds", seconds},
          {"per_window_nll_sum", nll},
          {"per_window_top1_correct", cor}};
}

json difference_json(const PairedDifference& d) {
  return {{"windows", d.windows},
          {"predicted_tokens", d.predicted},
          {"mean_nll", number(d.mean_nll)},
          {"mean_nll_se", number(d.mean_nll_se)},
          {"perplexity_ratio", number(std::exp(d.mean_nll))},
          {"top1", number(d.top1)},
          {"top1_se", number(d.top1_se)}};
}

json report_json(const EvalArgs& a, const std::vector<Corpus>& corpora,
                 const std::vector<ArmResult>& arms) {
  json j = {{"schema", "moetier.eval/1"},
            {"max_tokens", a.max_tokens},
            {"windows_limit", a.windows > 0 ? json(a.windows) : json(nullptr)},
            {"threads", cpu::threads()},
            {"baseline", arms[0].arm.name}};
  for (const ArmResult& r : arms) {
    json arm = {{"name", r.arm.name}, {"dir", r.arm.path.string()}, {"experts", r.store}};
    if (!r.expert_stats.is_null()) arm["expert_stats"] = r.expert_stats;
    j["arms"].push_back(arm);
  }
  for (size_t c = 0; c < corpora.size(); ++c) {
    const Corpus& k = corpora[c];
    json cj = {{"name", k.src.name},       {"file", k.src.path.string()},
               {"bytes", k.bytes},         {"tokens", k.ids.size()},
               {"windows", k.windows},     {"predicted_tokens_per_window", a.max_tokens - 1},
               {"scores", json::object()}, {"differences", json::object()}};
    for (const ArmResult& r : arms) {
      cj["scores"][r.arm.name] = summary_json(r.scores[c], r.seconds[c]);
      if (&r == &arms[0]) continue;
      cj["differences"][r.arm.name + "-" + arms[0].arm.name] =
          difference_json(paired_difference(arms[0].scores[c], r.scores[c]));
    }
    j["corpora"].push_back(cj);
  }
  return j;
}

std::string fixed(double v, int prec, bool sign = false) {
  if (!std::isfinite(v)) return "n/a";
  return sign ? fmt::format("{:+.{}f}", v, prec) : fmt::format("{:.{}f}", v, prec);
}

void print_table(const std::vector<Corpus>& corpora, const std::vector<ArmResult>& arms) {
  std::printf("%-12s %-14s %12s %9s %8s %10s %8s %8s\n", "corpus", "arm", "windows x pred", "NLL",
              "+-se", "perplexity", "top-1", "+-se");
  for (size_t c = 0; c < corpora.size(); ++c) {
    const Corpus& k = corpora[c];
    for (const ArmResult& r : arms) {
      const ScoreSummary s = summarize(r.scores[c]);
      std::printf(
          "%-12s %-14s %12s %9s %8s %10s %8s %8s\n", k.src.name.c_str(), r.arm.name.c_str(),
          fmt::format("{} x {}", s.windows, s.windows ? s.predicted / s.windows : 0).c_str(),
          fixed(s.mean_nll, 4).c_str(), fixed(s.mean_nll_se, 4).c_str(),
          fixed(s.perplexity, 3).c_str(), fixed(s.top1, 4).c_str(), fixed(s.top1_se, 4).c_str());
    }
    for (size_t i = 1; i < arms.size(); ++i) {
      const PairedDifference d = paired_difference(arms[0].scores[c], arms[i].scores[c]);
      std::printf("%-12s %-14s %12s %9s %8s %10s %8s %8s\n", k.src.name.c_str(),
                  (arms[i].arm.name + " - " + arms[0].arm.name).c_str(), "paired",
                  fixed(d.mean_nll, 4, true).c_str(), fixed(d.mean_nll_se, 4).c_str(),
                  ("x" + fixed(std::exp(d.mean_nll), 4)).c_str(), fixed(d.top1, 4, true).c_str(),
                  fixed(d.top1_se, 4).c_str());
    }
  }
  std::fflush(stdout);
}

void run_eval(const EvalArgs& a) {
  check(a.max_tokens >= 2, "--max-tokens: {} must be at least 2", a.max_tokens);
  check(a.windows >= 0, "--windows: {} must not be negative", a.windows);
  check(a.threads >= 0, "--threads: {} must not be negative", a.threads);
  check(a.experts.stats_json.empty(),
        "--stats-json: eval writes each arm's expert counters into its -o report instead");
  const std::vector<Named> arms = parse_named("--arm", "DIR", a.arms);
  const std::vector<Named> sources = parse_named("--corpus", "FILE", a.corpora);
  if (a.threads > 0) cpu::set_threads(a.threads);
  const std::vector<int64_t> vocab = check_arms(arms, a);

  std::vector<Corpus> corpora = tokenize_corpora(arms, vocab, sources);
  check_windows(corpora, a);
  std::vector<ArmResult> results;
  for (const Named& arm : arms)
    results.push_back(in_arm(arm, [&] { return score_arm(arm, corpora, a); }));
  print_table(corpora, results);
  if (!a.output.empty())
    write_file_atomic(a.output, report_json(a, corpora, results).dump(1) + "\n");
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "Held-out NLL and top-1 of one or more checkpoints on the same token windows");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("--arm", a->arms,
                  "NAME=DIR: a checkpoint to score (repeat; the first is the "
                  "baseline of the differences)")
      ->required();
  cmd->add_option("--corpus", a->corpora, "NAME=FILE: a held-out text file (repeat)")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens per window (default 512)");
  cmd->add_option("--windows", a->windows, "Score at most N windows per corpus (default: all)");
  add_ctx_option(*cmd, a->ctx);
  cmd->add_option("-t,--threads", a->threads,
                  "CPU threads (default: MOETIER_THREADS, else the CPUs it may use)");
  cmd->add_option("-o,--output", a->output, "Write the JSON report to FILE");
  cmd->add_option("--backend", a->backend, "Compute backend: cpu (default), cuda, cuda:N");
  add_expert_options(*cmd, a->experts);
  cmd->callback([a] { run_eval(*a); });
});

}  // namespace
}  // namespace moetier::tools
