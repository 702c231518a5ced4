// arena_bench: decode tok/s and expert reads per token at several arena sizes.
//
//   arena_bench DIR [--sizes 100,50,25,10] [--prompt 32] [--decode 64]
//               [--transient M] [--policy lru] [--threads T] [--json FILE]
//               [--text FILE] [--host-cache BYTES|all] [--warm] [--ab]
//               [--repeat R]
//   arena_bench --make-synthetic DIR [--layers 8 --experts 64 --top-k 8
//               --hidden 1024 --moe-inter 512 --bf16]
//
// For each size: a fresh (cold) arena, a random prompt of --prompt tokens
// processed in one chunk (prefill), then --decode greedy tokens (with --text
// FILE: the prompt is the text's first tokens and decode is fed the following
// tokens, teacher-forced, so that a trained router sees real text). Decode figures
// count only the decode steps. A `mapped` row (all experts resident through the
// checkpoint's mmap) is the ceiling. Not a test: nothing is asserted.
//
// The host tier: --host-cache gives every arena row a host tier (`all`: one
// slot per expert of the model). --warm runs one untimed prompt + decode on
// each provider first, so that the host tier holds what the arena evicted
// (the measured pass then copies from it instead of reading storage; the
// table's `host hits/token` and `reads/token` say how far that got). --ab adds,
// for every arena row, one with the host-tier copies made as before issue 12
// (one memcpy per expert inside submit, no pre-faulting; ArenaConfig::
// async_host_copies / prefault); --ab-huge one pre-faulted without huge
// pages (ArenaConfig::huge_pages). --repeat R measures every row R times,
// interleaved (row 1, row 2, ..., row 1, ...), and reports each row's median
// decode rate with its samples, so that rows share the machine's noise.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "runtime/kv_cache.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "synthetic.h"

using namespace moetier;

namespace {

struct Args {
  std::string dir, json, text, sizes = "100,50,25,10", policy = "lru";
  int64_t prompt = 32, decode = 64, transient = -1;
  int threads = 0, repeat = 1;
  uint32_t seed = 1;
  std::string host_cache;
  bool warm = false, ab = false, ab_huge = false;
};

// One configuration to measure: mapped, or an arena of `size`% (+ host tier).
struct Config {
  std::string name, size;
  bool mapped = false, legacy_copies = false, small_pages = false;
};

struct Row {
  std::string arena;
  double prefill_tps = 0, decode_tps = 0;
  double reads_per_token = 0, read_mib_per_token = 0, hit_rate = 0, all_hit = 0, stall_share = 0;
  uint64_t hot_slots = 0;
  double host_hits_per_token = 0, host_copy_mib_per_token = 0, setup_s = 0;
  std::vector<double> samples;  // decode tok/s of every repeat
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// text: token ids of --text (at least prompt + decode of them), or empty.
Row measure(const Model& m, ExpertProvider& ex, ExpertStats* stats, const Args& a,
            const std::vector<int32_t>& text) {
  const ModelSpec& c = m.spec();
  std::mt19937 rng(a.seed);
  std::vector<int32_t> prompt(size_t(a.prompt));
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
  if (!text.empty()) prompt.assign(text.begin(), text.begin() + a.prompt);
  Session session(m, ex, a.prompt + a.decode + 1);
  Row r;
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &session.prefill(prompt);
  r.prefill_tps = double(a.prompt) / seconds_since(t0);
  LayerCounters before = stats ? stats->total() : LayerCounters{};
  t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < a.decode; ++s) {
    const int32_t next =
        text.empty() ? int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin())
                     : text[size_t(a.prompt + s)];
    logits = &session.decode(next);
  }
  double dt = seconds_since(t0);
  r.decode_tps = double(a.decode) / dt;
  if (stats) {
    LayerCounters d = stats->total();
    uint64_t uses = d.uses - before.uses, misses = d.misses - before.misses;
    uint64_t steps = d.steps - before.steps, all = d.all_hit_steps - before.all_hit_steps;
    r.reads_per_token = double(misses) / double(a.decode);
    r.read_mib_per_token = double(d.read_bytes - before.read_bytes) / double(a.decode) / 1048576.0;
    r.hit_rate = uses ? 1.0 - double(misses) / double(uses) : 0;
    r.all_hit = steps ? double(all) / double(steps) : 0;
    r.stall_share = double(d.stall_ns - before.stall_ns) * 1e-9 / dt;
    r.hot_slots = stats->hot_slots;
    r.host_hits_per_token = double(d.hits_host - before.hits_host) / double(a.decode);
    r.setup_s = double(stats->setup_ns) * 1e-9;
  }
  return r;
}

std::vector<Config> configs(const Args& a) {
  std::vector<Config> out{{"mapped", "", true, false}};
  std::stringstream ss(a.sizes);
  for (std::string size; std::getline(ss, size, ',');) {
    std::string name = size + "%" + (a.host_cache.empty() ? "" : " + host tier");
    out.push_back({name, size, false, false});
    if (a.ab) out.push_back({name + " (sync copies)", size, false, true});
    if (a.ab_huge) out.push_back({name + " (4 KiB pages)", size, false, false, true});
  }
  return out;
}

Row measure_config(const Checkpoint& ck, const Model& model, const Config& c, const Args& a,
                   const std::vector<int32_t>& text) {
  if (c.mapped) {
    MappedExperts mapped(ck, model.spec());
    measure(model, mapped, nullptr, a, text);  // warm the page cache
    return measure(model, mapped, nullptr, a, text);
  }
  ExpertOptions o;
  o.arena = c.size + "%";
  o.transient = a.transient;
  o.policy = a.policy;
  o.host_cache = a.host_cache == "all" ? "" : a.host_cache;
  ExpertIndex ix = ExpertIndex::build(ck, model.spec());
  ArenaConfig ac = resolve_arena_config(ix, model.spec(), o, nullptr);
  if (a.host_cache == "all") ac.host_slots = ix.total_experts();
  ac.async_host_copies = ac.prefault = !c.legacy_copies;
  ac.huge_pages = !c.small_pages;
  ExpertStats stats;
  ArenaExperts arena(std::move(ix), ac, &stats);
  if (a.warm) measure(model, arena, &stats, a, text);
  const uint64_t copied = stats.host_copy_bytes;
  Row r = measure(model, arena, &stats, a, text);
  r.host_copy_mib_per_token = double(stats.host_copy_bytes - copied) / double(a.decode) / 1048576.0;
  return r;
}

void print_rows(const Args& a, const std::vector<Row>& rows) {
  std::printf("model %s: prompt %lld tokens, decode %lld tokens (%s), policy %s%s%s\n",
              a.dir.c_str(), (long long)a.prompt, (long long)a.decode,
              a.text.empty() ? "random prompt, greedy" : a.text.c_str(), a.policy.c_str(),
              a.warm ? ", warm" : "",
              a.repeat > 1 ? fmt::format(", median of {} interleaved runs", a.repeat).c_str() : "");
  std::printf(
      "| arena | hot slots | prefill tok/s | decode tok/s | vs mapped | expert reads/token | "
      "host hits/token | host copy MiB/token | hit rate | all-k-hit | I/O stall | set-up s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf(
        "| %s | %llu | %.1f | %.1f | %.3f | %.2f | %.2f | %.3f | %.1f%% | %.1f%% | %.1f%% | "
        "%.3f |\n",
        r.arena.c_str(), (unsigned long long)r.hot_slots, r.prefill_tps, r.decode_tps,
        r.decode_tps / rows[0].decode_tps, r.reads_per_token, r.host_hits_per_token,
        r.host_copy_mib_per_token, 100 * r.hit_rate, 100 * r.all_hit, 100 * r.stall_share,
        r.setup_s);
  }
}

nlohmann::json rows_json(const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    out.push_back({{"arena", r.arena},
                   {"hot_slots", r.hot_slots},
                   {"prefill_tok_s", r.prefill_tps},
                   {"decode_tok_s", r.decode_tps},
                   {"decode_tok_s_samples", r.samples},
                   {"decode_vs_mapped", r.decode_tps / rows[0].decode_tps},
                   {"reads_per_token", r.reads_per_token},
                   {"read_mib_per_token", r.read_mib_per_token},
                   {"host_hits_per_token", r.host_hits_per_token},
                   {"host_copy_mib_per_token", r.host_copy_mib_per_token},
                   {"hit_rate", r.hit_rate},
                   {"all_hit_share", r.all_hit},
                   {"stall_share", r.stall_share},
                   {"setup_s", r.setup_s}});
  }
  return out;
}

void run(const Args& a) {
  cpu::set_threads(a.threads);
  auto ck = Checkpoint::open(a.dir);
  const std::unique_ptr<Model> loaded = load_model(*ck);
  const Model& model = *loaded;
  std::vector<int32_t> text;
  if (!a.text.empty()) {
    std::ifstream f(a.text, std::ios::binary);
    check(bool(f), "{}: cannot open", a.text);
    std::stringstream buf;
    buf << f.rdbuf();
    const Tokenizer tok = Tokenizer::load(a.dir);
    check_tokenizer_fits(tok, model.spec().vocab_size, a.dir);
    text = tok.encode(buf.str());
    check(int64_t(text.size()) >= a.prompt + a.decode, "{}: {} tokens, need {}", a.text,
          text.size(), a.prompt + a.decode);
  }
  const std::vector<Config> cs = configs(a);
  std::vector<std::vector<Row>> runs(cs.size());
  for (int rep = 0; rep < std::max(1, a.repeat); ++rep)
    for (size_t i = 0; i < cs.size(); ++i)
      runs[i].push_back(measure_config(*ck, model, cs[i], a, text));
  std::vector<Row> rows;
  for (size_t i = 0; i < cs.size(); ++i) {
    std::vector<Row>& rs = runs[i];
    std::sort(rs.begin(), rs.end(),
              [](const Row& x, const Row& y) { return x.decode_tps < y.decode_tps; });
    Row r = rs[rs.size() / 2];  // the median run (by decode rate)
    for (const Row& x : runs[i]) r.samples.push_back(x.decode_tps);
    r.arena = cs[i].name;
    rows.push_back(r);
  }
  print_rows(a, rows);
  if (!a.json.empty()) write_file_atomic(a.json, rows_json(rows).dump(2) + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"arena_bench: decode speed and expert reads per token by arena size"};
  Args a;
  std::string synth;
  bench::SyntheticSpec s;
  bool bf16 = false;
  app.add_option("dir", a.dir, "Checkpoint directory");
  app.add_option("--sizes", a.sizes, "Arena sizes in % of all experts (default 100,50,25,10)");
  app.add_option("--prompt", a.prompt, "Prompt tokens (default 32)");
  app.add_option("--decode", a.decode, "Decoded tokens (default 64)");
  app.add_option("--transient", a.transient, "Transient ring slots (default: derived)");
  app.add_option("--policy", a.policy, "lru, lfu");
  app.add_option("--threads", a.threads, "CPU threads (0: all)");
  app.add_option("--seed", a.seed, "Prompt seed");
  app.add_option("--json", a.json, "Write the rows as JSON");
  app.add_option("--host-cache", a.host_cache, "Host tier for every arena row: BYTES or all");
  app.add_flag("--warm", a.warm, "One untimed prompt + decode on each provider first");
  app.add_flag("--ab", a.ab, "Also every arena row with the synchronous host copies of before");
  app.add_flag("--ab-huge", a.ab_huge, "Also every arena row pre-faulted without huge pages");
  app.add_option("--repeat", a.repeat, "Measure every row R times, interleaved (median)");
  app.add_option("--text", a.text, "Prompt and teacher-forced decode tokens from this text file");
  app.add_option("--make-synthetic", synth, "Write a synthetic checkpoint to this directory");
  app.add_option("--layers", s.layers);
  app.add_option("--experts", s.experts);
  app.add_option("--top-k", s.top_k);
  app.add_option("--hidden", s.hidden);
  app.add_option("--moe-inter", s.moe_inter);
  app.add_flag("--bf16", bf16, "Synthetic experts in bf16 (default MXFP4)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!synth.empty()) {
      s.mxfp4 = !bf16;
      bench::write_synthetic(synth, s);
      std::printf("wrote %s\n", synth.c_str());
      return 0;
    }
    check(!a.dir.empty(), "give a checkpoint directory");
    run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arena_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
