// The simulator against the engine: run the real forward pass with the arena
// (LRU, LFU, pinned; with and without the ring; with a host tier), record the
// trace at the same time, replay it, and require every counter to be equal.
// Belady's MIN: at least every policy's hits with as many slots, on real and
// random traces; equal to a brute-force optimum on tiny ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "core/error.h"
#include "experts/arena_experts.h"
#include "experts/index.h"
#include "experts/options.h"
#include "experts/simulate.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "qwen3_fixture.h"
#include "runtime/model.h"
#include "runtime/trace_recorder.h"
#include "trace_fixture.h"

using namespace moetier;
using namespace moetier::testing;

namespace {

struct Window {
  std::vector<int32_t> prompt;
  int64_t decode;
};

std::vector<Window> random_windows(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Window> w;
  for (auto [n, d] : {std::pair{13, 6}, std::pair{9, 5}, std::pair{1, 3}, std::pair{17, 0}}) {
    Window x{std::vector<int32_t>(size_t(n)), d};
    for (auto& t : x.prompt) t = int32_t(rng() % uint64_t(vocab));
    w.push_back(std::move(x));
  }
  return w;
}

TraceHeader header_for(const Model& model) {
  TraceHeader h;
  h.model = trace_model_of(model);
  h.corpus = {"test"};
  return h;
}

// A random ranking of every MoE expert, as a --ranking file.
fs::path random_ranking(const TempDir& tmp, const ModelSpec& c, uint32_t seed) {
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l))
      for (int64_t e = 0; e < c.num_experts; ++e) all.push_back({l, e});
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  std::string s = "# random ranking\n";
  for (auto [l, e] : all) s += std::to_string(l) + " " + std::to_string(e) + " 1\n";
  const fs::path p = tmp / ("ranking" + std::to_string(seed) + ".txt");
  write_file(p, s);
  return p;
}

void expect_same_counters(const ExpertStats& engine, const ExpertStats& sim,
                          const std::string& what) {
  EXPECT_EQ(engine.pinned, sim.pinned) << what;
  ASSERT_EQ(engine.layers.size(), sim.layers.size()) << what;
  for (size_t l = 0; l < engine.layers.size(); ++l) {
    const LayerCounters &a = engine.layers[l], &b = sim.layers[l];
    const std::string w = what + " layer " + std::to_string(l);
    EXPECT_EQ(a.uses, b.uses) << w;
    EXPECT_EQ(a.hits_hot, b.hits_hot) << w;
    EXPECT_EQ(a.hits_transient, b.hits_transient) << w;
    EXPECT_EQ(a.hits_host, b.hits_host) << w;
    EXPECT_EQ(a.misses, b.misses) << w;
    EXPECT_EQ(a.read_bytes, b.read_bytes) << w;
    EXPECT_EQ(a.hot_evictions, b.hot_evictions) << w;
    EXPECT_EQ(a.ring_evictions, b.ring_evictions) << w;
    EXPECT_EQ(a.steps, b.steps) << w;
    EXPECT_EQ(a.all_hit_steps, b.all_hit_steps) << w;
  }
}

struct Variant {
  std::string arena;
  int64_t arena_experts, transient;
  std::string host;
};

// Runs the engine with `o` over `windows` while recording the trace, replays
// the trace with the same policy and sizes, and compares every counter.
// `overlapped` (if given) adds up the engine's overlapped submits.
void engine_vs_simulator(const fs::path& dir, const std::vector<Window>& windows,
                         const std::vector<Variant>& variants, const TempDir& tmp,
                         uint64_t* overlapped = nullptr) {
  auto ck = Checkpoint::open(dir);
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  const ModelSpec& cfg = model.spec();
  const fs::path ranking = random_ranking(tmp, cfg, 5);
  int run = 0;
  for (const Variant& v : variants) {
    for (const char* policy : {"lru", "lfu", "pinned"}) {
      const std::string what = dir.filename().string() + " " + policy + " arena '" + v.arena +
                               "'/" + std::to_string(v.arena_experts) + " transient " +
                               std::to_string(v.transient) + " host '" + v.host + "'";
      ExpertOptions o;
      o.arena = v.arena;
      o.arena_experts = v.arena_experts;
      o.transient = v.transient;
      o.host_cache = v.host;
      o.policy = policy;
      if (o.policy == "pinned") o.ranking = ranking.string();
      o.quiet = true;
      ExpertStats stats;
      auto arena = make_expert_provider(*ck, cfg, o, &stats);
      const fs::path tp = tmp / ("run" + std::to_string(run++) + ".trace");
      TraceWriter w(tp, header_for(model));
      TraceRecorder rec(w, cfg);
      for (size_t i = 0; i < windows.size(); ++i)
        rec.run_window(model, *arena, windows[i].prompt, windows[i].decode, uint32_t(i), 0);
      w.commit();

      const Trace t = read_trace(tp);
      const ReplayStream s = build_replay(t, Replay::Chunk);
      PolicySim p;
      p.kind = parse_policy_kind(policy);
      p.hot_slots = stats.hot_slots;
      p.transient_slots = stats.transient_slots;
      p.host_slots = stats.host_slots;
      if (p.kind == PolicyKind::Pinned) {
        p.ranking = read_ranking(ranking, cfg.num_layers, cfg.num_experts);
        p.max_pinned = engine_max_pinned(p.hot_slots, cfg.experts_per_token);
      }
      const SimResult r = simulate_policy(t, s, p);
      expect_same_counters(stats, r.stats, what);
      if (overlapped) *overlapped += stats.overlapped_submits;
      const LayerCounters e = stats.total();
      EXPECT_GT(e.misses, 0u) << what;
      EXPECT_GT(e.hits(), 0u) << what;
      // The phase split adds up.
      const LayerCounters pre = r.phase_stats[0].total(), dec = r.phase_stats[1].total();
      EXPECT_EQ(pre.uses + dec.uses, e.uses) << what;
      EXPECT_EQ(pre.all_hit_steps + dec.all_hit_steps, e.all_hit_steps) << what;
      EXPECT_GT(dec.steps, 0u) << what;
      if (stats.host_slots == 0) {  // MIN with as many slots hits at least as often
        const SimResult m = simulate_min(t, s, p.hot_slots + p.transient_slots);
        EXPECT_GE(m.stats.total().hits(), e.hits()) << what;
      }
    }
  }
}

}  // namespace

TEST(Simulate, ReproducesTheEngineCountersOnEveryFixture) {
  TempDir tmp;
  uint32_t seed = 40;
  for (const char* name : {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"}) {
    const fs::path dir = fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
    auto ck = Checkpoint::open(dir);
    const std::unique_ptr<Model> model_owned = load_model(*ck);
    const Model& model = *model_owned;
    const int64_t total = int64_t(ExpertIndex::build(*ck, model.spec()).total_experts());
    const auto windows = random_windows(model.spec().vocab_size, seed++);
    engine_vs_simulator(dir, windows,
                        {{"25%", -1, 0, ""},
                         {"25%", -1, -1, ""},
                         {"", total / 2 + 1, 3, ""},
                         {"", total / 3, 2, "64KiB"}},
                        tmp);
  }
}

TEST(Simulate, ReproducesTheEngineCountersOnMoetierTiny) {
  TempDir tmp;
  const fs::path dir = fs::path(MOETIER_SOURCE_DIR) / "models/moetier-tiny";
  const Tokenizer tok = Tokenizer::load(dir);
  const std::string text =
      read_file(fs::path(MOETIER_SOURCE_DIR) / "tests/data/moetier-tiny/eval_prose.txt");
  const std::vector<int32_t> ids = tok.encode(text.substr(0, 2000), false);
  ASSERT_GT(ids.size(), 40u);
  std::vector<Window> windows = {{std::vector<int32_t>(ids.begin(), ids.begin() + 19), 7},
                                 {std::vector<int32_t>(ids.begin() + 19, ids.begin() + 30), 4}};
  engine_vs_simulator(dir, windows, {{"10%", -1, -1, ""}, {"", 96, 0, ""}}, tmp);
}

// A ring larger than a batch: the engine reads prefill batch i + 1 while it
// computes batch i (can_overlap), and the synchronous simulator still
// reproduces every counter.
TEST(Simulate, ReproducesTheEngineCountersWhenBatchesOverlap) {
  TempDir tmp;
  const fs::path dir = fs::path(MOETIER_SOURCE_DIR) / "models/moetier-tiny";
  auto ck = Checkpoint::open(dir);
  const auto windows = random_windows(load_model(*ck)->spec().vocab_size, 77);
  uint64_t overlapped = 0;
  engine_vs_simulator(dir, windows, {{"", 8, 64, ""}, {"", 20, 40, "64KiB"}}, tmp, &overlapped);
  EXPECT_GT(overlapped, 0u);
}

TEST(Simulate, TokenReplayMakesOneAcquirePerToken) {
  TempDir tmp;
  Synth sy;
  const fs::path p = tmp / "s.trace";
  const uint64_t n = write_synth(p, sy);
  const Trace t = read_trace(p);
  const ReplayStream tok = build_replay(t, Replay::Token), chunk = build_replay(t, Replay::Chunk);
  EXPECT_EQ(tok.keys.size(), n * sy.moe.size() * size_t(sy.k));
  EXPECT_LT(chunk.keys.size(), tok.keys.size());  // prefill chunks share experts
  EXPECT_EQ(tok.groups.size(), n * sy.moe.size());
  PolicySim ps;
  ps.hot_slots = 6;
  const SimResult r = simulate_policy(t, tok, ps);
  EXPECT_EQ(r.stats.total().uses, tok.keys.size());
  EXPECT_EQ(r.stats.total().steps, n * sy.moe.size());
}

TEST(Simulate, MinBoundsEveryPolicyOnRandomTraces) {
  TempDir tmp;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    Synth sy;
    sy.seed = seed;
    sy.experts = 9 + int64_t(seed) * 3;
    sy.k = 1 + int64_t(seed % 3);
    sy.skew = 0.5 + 0.3 * seed;
    sy.windows = 6;
    const fs::path p = tmp / ("r" + std::to_string(seed) + ".trace");
    write_synth(p, sy);
    const Trace t = read_trace(p);
    const std::vector<ExpertKey> ranking = rank_experts(t, count_uses(t));
    for (Replay rp : {Replay::Chunk, Replay::Token}) {
      const ReplayStream s = build_replay(t, rp);
      const size_t total = t.header.model.total_experts();
      for (size_t hot = size_t(sy.k); hot <= total; hot += 1 + total / 7) {
        for (size_t ring : {size_t(0), size_t(sy.k), size_t(2)}) {
          const uint64_t min_hits = simulate_min(t, s, hot + ring).stats.total().hits();
          for (PolicyKind kind : {PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Pinned}) {
            PolicySim ps;
            ps.kind = kind;
            ps.hot_slots = hot;
            ps.transient_slots = ring;
            ps.ranking = ranking;
            ps.max_pinned = engine_max_pinned(hot, sy.k);
            const SimResult r = simulate_policy(t, s, ps);
            EXPECT_GE(min_hits, r.stats.total().hits())
                << "seed " << seed << " hot " << hot << " ring " << ring << " "
                << policy_kind_name(kind);
          }
        }
      }
    }
  }
}

namespace {

// The most hits any demand-paging cache of `cap` slots gets on `seq`.
uint64_t brute_force_optimum(const std::vector<ExpertKey>& seq, size_t cap) {
  std::map<uint32_t, uint64_t> states{{0u, 0u}};  // resident set -> best hits so far
  for (ExpertKey k : seq) {
    std::map<uint32_t, uint64_t> next;
    auto keep = [&](uint32_t m, uint64_t h) {
      auto [it, fresh] = next.emplace(m, h);
      if (!fresh) it->second = std::max(it->second, h);
    };
    const uint32_t bit = 1u << k;
    for (auto [m, h] : states) {
      if (m & bit) {
        keep(m, h + 1);
      } else if (size_t(__builtin_popcount(m)) < cap) {
        keep(m | bit, h);
      } else {
        for (uint32_t v = m; v; v &= v - 1) keep((m & ~(v & -v)) | bit, h);
      }
    }
    states.swap(next);
  }
  uint64_t best = 0;
  for (auto [m, h] : states) best = std::max(best, h);
  return best;
}

}  // namespace

TEST(Simulate, MinEqualsTheBruteForceOptimum) {
  TempDir tmp;
  int checked = 0;
  for (uint32_t seed = 11; seed < 31; ++seed) {
    Synth sy;
    sy.layers = 1;
    sy.moe = {0};
    sy.experts = 4 + int64_t(seed % 4);
    sy.k = 1 + int64_t(seed % 2);
    sy.windows = 2;
    sy.max_prefill = 4;
    sy.max_decode = 5;
    sy.skew = 0.3 + 0.1 * double(seed % 5);
    sy.seed = seed;
    const fs::path p = tmp / ("b" + std::to_string(seed) + ".trace");
    write_synth(p, sy);
    const Trace t = read_trace(p);
    for (Replay rp : {Replay::Chunk, Replay::Token}) {
      const ReplayStream s = build_replay(t, rp);
      for (size_t cap = 1; cap < size_t(sy.experts); ++cap) {
        const SimResult r = simulate_min(t, s, cap);
        EXPECT_EQ(r.stats.total().hits(), brute_force_optimum(s.keys, cap))
            << "seed " << seed << " cap " << cap << " uses " << s.keys.size();
        EXPECT_EQ(r.stats.total().uses, s.keys.size());
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Simulate, StudyRowsAndBudgets) {
  TempDir tmp;
  Synth sy;  // 2 MoE layers x 12 experts, k 3
  const fs::path p = tmp / "s.trace";
  write_synth(p, sy);
  const Trace t = read_trace(p);
  const TraceModel& m = t.header.model;
  EXPECT_EQ(parse_budget("5", m, ""), 5u);
  EXPECT_EQ(parse_budget("10%", m, ""), 3u);  // ceil(2.4)
  EXPECT_EQ(parse_budget("100%", m, ""), 24u);
  EXPECT_EQ(parse_budget("48KiB", m, ""), 3u);      // slot 16 KiB
  EXPECT_EQ(parse_budget("36KiB", m, "bf16"), 3u);  // 12 KiB per (logical) bf16 expert
  EXPECT_EQ(parse_budget("36KiB", m, ""), 2u);      // as --arena: 16 KiB slots
  EXPECT_EQ(m.bytes_of("mxfp4"), 3264u);            // 3 x (32 x 34) bytes
  EXPECT_EQ(parse_budget("9792B", m, "mxfp4"), 3u);
  EXPECT_THROW(parse_budget("1MB", m, "mxfp4"), Error);
  EXPECT_THROW(parse_budget("25", m, ""), Error);
  EXPECT_THROW(parse_budget("0.5%x", m, ""), Error);
  StudyOptions o;
  o.budgets = {"4", "50%"};
  o.transient = 2;
  const Study st = run_study(t, o);
  ASSERT_EQ(st.json["budgets"].size(), 2u);
  const auto& rows = st.json["budgets"][0]["results"];
  ASSERT_EQ(rows.size(), 10u);
  double min_ring = -1, lru_ring = -1, static_hit = -1;
  for (const auto& r : rows) {
    const std::string policy = r["policy"].get<std::string>();
    const bool ring = r["transient_slots"].get<int>() == 2;
    if (policy == "min" && ring) min_ring = r["hit_rate"].get<double>();
    if (policy == "lru" && ring) lru_ring = r["hit_rate"].get<double>();
    if (policy == "static") static_hit = r["hit_rate"].get<double>();
    EXPECT_EQ(r["uses"].get<uint64_t>(), rows[0]["uses"].get<uint64_t>());  // same uses for all
  }
  EXPECT_GE(min_ring, lru_ring);
  EXPECT_GT(static_hit, 0.0);
  EXPECT_GT(st.json["budgets"][0]["static_coverage"].get<double>(), 4.0 / 24);
  EXPECT_EQ(std::count(st.csv.begin(), st.csv.end(), '\n'), 21);
}
