// moetier prune: keeping every expert changes no logit (bit for bit, every
// layout); keeping K < E gives the original logits when the routing only ever
// selects kept experts (moetier-tiny, norm_topk_prob); use-count files; bad
// input is one line and a non-zero exit; a failure or an interruption midway
// leaves no output directory; the output passes check and runs.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "convert/prune.h"
#include "convert/usage.h"
#include "convert_fixture.h"
#include "core/error.h"
#include "experts/index.h"
#include "model/check.h"
#include "runtime/routing.h"

using namespace moetier;
using namespace moetier::testing;

namespace {

std::vector<std::vector<int32_t>> all_kept(const ModelSpec& c) {
  std::vector<std::vector<int32_t>> k(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int32_t e = 0; c.is_moe_layer(l) && e < c.num_experts; ++e) k[size_t(l)].push_back(e);
  return k;
}

// Routing of a chunk: layer -> [n, k] expert ids.
struct Routes {
  std::map<int64_t, std::vector<int32_t>> ids;
  RoutingObserver observer() {
    return [this](const RoutingEvent& e) { ids[e.layer] = e.routing->experts; };
  }
};

// Plain ranking file {"layers": [[count per expert], ...]}.
fs::path write_counts(const fs::path& p, const std::vector<std::vector<double>>& layers) {
  write_file(p, nlohmann::json({{"layers", layers}}).dump());
  return p;
}

}  // namespace

// Every layout: stacked bf16, per-expert bf16 (sharded, with an index),
// per-expert MXFP4 (norm_topk_prob false), and a written per-expert fixture.
TEST(Prune, KeepingEveryExpertIsBitIdentical) {
  TempDir tmp;
  Tiny t;
  t.layout = Layout::PerExpert;
  write_tiny(tmp / "tiny", t);
  for (const fs::path& src : {golden("qwen3moe-bf16"), golden("qwen3moe-sharded"),
                              golden("qwen3moe-mxfp4"), tmp / "tiny"}) {
    const fs::path out = tmp / ("out-" + src.filename().string());
    const ModelSpec c = config_of(src);
    {
      auto ck = Checkpoint::open(src);
      const PruneReport r = prune_checkpoint(*ck, all_kept(c), out);
      EXPECT_EQ(r.expert_bytes_after, r.expert_bytes_before);
    }
    EXPECT_EQ(check_checkpoint(out), std::vector<std::string>{}) << out;
    const auto toks = random_tokens(c.vocab_size, 11, 3);
    const auto a = prefill_logits(src, toks), b = prefill_logits(out, toks);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << src;
    const auto cfg = read_json(out / "config.json");
    EXPECT_EQ(cfg["moetier"]["pruned_from"], c.num_experts);
    EXPECT_EQ(cfg.contains("num_local_experts"),
              read_json(src / "config.json").contains("num_local_experts"));
    EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"),
              fs::exists(src / "model.safetensors.index.json"));
  }
}

// moetier-tiny (64 experts, top-8, norm_topk_prob): keep exactly the experts
// that a short prompt selects (padded to one K for all layers). The pruned
// model selects the same experts (renumbered) and gives the same logits up to
// f32 rounding of the softmax denominators.
TEST(Prune, RestrictedRouterMatchesWhenOnlyKeptExpertsAreSelected) {
  TempDir tmp;
  const fs::path src = tiny_model();
  const ModelSpec c = config_of(src);
  ASSERT_TRUE(read_json(src / "config.json")["norm_topk_prob"].get<bool>());
  const auto toks = random_tokens(c.vocab_size, 3, 9);
  Routes orig;
  const RoutingObserver oo = orig.observer();
  const auto a = prefill_logits(src, toks, &oo);
  std::vector<std::set<int32_t>> used(size_t(c.num_layers));
  size_t keep = 0;
  for (auto& [l, ids] : orig.ids) {
    used[size_t(l)].insert(ids.begin(), ids.end());
    keep = std::max(keep, used[size_t(l)].size());
  }
  ASSERT_LT(keep, size_t(c.num_experts));  // a real restriction
  std::vector<std::vector<int32_t>> kept(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int32_t e = 0; used[size_t(l)].size() < keep; ++e) used[size_t(l)].insert(e);
    kept[size_t(l)].assign(used[size_t(l)].begin(), used[size_t(l)].end());
  }
  {
    auto ck = Checkpoint::open(src);
    prune_checkpoint(*ck, kept, tmp / "out");
  }
  EXPECT_EQ(check_checkpoint(tmp / "out"), std::vector<std::string>{});
  EXPECT_EQ(config_of(tmp / "out").num_experts, int64_t(keep));
  Routes pruned;
  const RoutingObserver po = pruned.observer();
  const auto b = prefill_logits(tmp / "out", toks, &po);
  for (auto& [l, ids] : pruned.ids) {
    std::vector<int32_t> mapped;
    for (int32_t id : ids) mapped.push_back(kept[size_t(l)][size_t(id)]);
    EXPECT_EQ(mapped, orig.ids[l]) << "layer " << l;
  }
  const double rel = max_rel_diff(b, a);
  std::printf("keep %zu of %lld: max rel logit diff %.3g\n", keep, (long long)c.num_experts, rel);
  EXPECT_LT(rel, 1e-5);
}

// Without norm_topk_prob the kept experts' weights are the original ones
// times Z_E / Z_K >= 1 (the softmax lost the removed experts' mass).
TEST(Prune, WithoutRenormalizationWeightsGrowByOneFactorPerToken) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t E = 9, H = 12, K = 5, k = 2, n = 6;
  std::vector<float> router(size_t(E * H)), x(size_t(n * H));
  for (auto& v : router) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const std::vector<int32_t> kept_ids = {0, 2, 3, 6, 8};
  std::vector<float> sub;
  for (int32_t e : kept_ids)
    sub.insert(sub.end(), router.begin() + e * H, router.begin() + (e + 1) * H);
  const Routing full = route({WeightEncoding::F32, E, H, router.data()}, x.data(), n, k, false);
  const Routing part = route({WeightEncoding::F32, K, H, sub.data()}, x.data(), n, k, false);
  int checked = 0;
  for (int64_t t = 0; t < n; ++t) {
    bool inside = true;
    for (int64_t j = 0; j < k; ++j)
      inside &=
          kept_ids[size_t(part.experts[size_t(t * k + j)])] == full.experts[size_t(t * k + j)];
    if (!inside) continue;
    ++checked;
    const double f = part.weights[size_t(t * k)] / full.weights[size_t(t * k)];
    EXPECT_GE(f, 1.0);
    EXPECT_NEAR(part.weights[size_t(t * k + 1)] / full.weights[size_t(t * k + 1)], f, 1e-5 * f);
  }
  EXPECT_GT(checked, 0);
}

TEST(Prune, MostUsedExpertsAndCountFiles) {
  TempDir tmp;
  const ModelSpec c = config_of(golden("qwen3moe-bf16"));  // 3 layers, layer 1 dense, 16 experts
  std::vector<double> l0(16, 1.0), l2(16, 0.0);
  l0[5] = 9, l0[3] = 9, l0[11] = 4, l0[0] = 4;  // ties go to the smaller id
  for (int e = 0; e < 16; ++e) l2[size_t(e)] = 16 - e;
  const fs::path per_layer = write_counts(tmp / "a.json", {l0, {}, l2});
  const fs::path per_moe = write_counts(tmp / "b.json", {l0, l2});
  for (const fs::path& f : {per_layer, per_moe}) {
    const ExpertUsage u = read_expert_usage(f, c);
    const auto kept = most_used_experts(u, c, 4);
    EXPECT_EQ(kept[0], (std::vector<int32_t>{0, 3, 5, 11}));
    EXPECT_TRUE(kept[1].empty());
    EXPECT_EQ(kept[2], (std::vector<int32_t>{0, 1, 2, 3}));
  }
  // The summary form of moetier trace (TRACE.json next to TRACE).
  nlohmann::json sum = {{"header", {{"model", {{"num_experts", 16}}}}},
                        {"layers", {{{"layer", 0}, {"uses", l0}}, {{"layer", 2}, {"uses", l2}}}}};
  write_file(tmp / "t.trace", "MOETRACE not read: the summary is");
  write_file(tmp / "t.trace.json", sum.dump());
  const ExpertUsage u = read_expert_usage(tmp / "t.trace", c);
  EXPECT_EQ(u.source, (tmp / "t.trace.json").string());
  EXPECT_EQ(most_used_experts(u, c, 4)[0], (std::vector<int32_t>{0, 3, 5, 11}));
  // The ranking text of moetier trace (unlisted experts count 0).
  std::string ranking = "# LAYER EXPERT USES\n";
  for (int e = 0; e < 16; ++e)
    ranking += fmt::format("0 {} {}\n2 {} {}\n", e, l0[size_t(e)], e, l2[size_t(e)]);
  write_file(tmp / "t.ranking", ranking + "\n");
  EXPECT_EQ(most_used_experts(read_expert_usage(tmp / "t.ranking", c), c, 4)[2],
            (std::vector<int32_t>{0, 1, 2, 3}));
  write_file(tmp / "bad.ranking", ranking + "1 0 5\n");  // layer 1 is dense
  EXPECT_THROW(read_expert_usage(tmp / "bad.ranking", c), Error);
  // Bad files: one-line errors naming the file.
  auto bad = [&](const std::string& text) {
    write_file(tmp / "bad.json", text);
    try {
      read_expert_usage(tmp / "bad.json", c);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return;
    }
    ADD_FAILURE() << "accepted: " << text;
  };
  bad("{\"layers\": [[1, 2, 3], [1, 2, 3]]}");                 // 3 counts, 16 experts
  bad(nlohmann::json({{"layers", {l0, {}, l2, l2}}}).dump());  // 4 lists
  bad(nlohmann::json({{"layers", {l0, l0, l2}}}).dump());      // counts for a dense layer
  std::vector<double> negative = l0;
  negative[2] = -1;
  bad(nlohmann::json({{"layers", {negative, l2}}}).dump());
  bad("{\"layers\": 3}");
  bad("{\"layers\": [{\"layer\": 1, \"uses\": []}]}");  // layer 1 is dense
  bad("{\"layers\": [{\"layer\": 0, \"uses\": " + nlohmann::json(l0).dump() + "}]}");  // no layer 2
  bad("{\"layers\": [[1, 2,");
  sum["header"]["model"]["num_experts"] = 32;
  bad(sum.dump());
  EXPECT_THROW(read_expert_usage(tmp / "missing.json", c), Error);
}

TEST(Prune, KeepIsACountOrAShareRoundedUp) {
  EXPECT_EQ(parse_keep("26", 64), 26);
  EXPECT_EQ(parse_keep("40%", 64), 26);  // 25.6
  EXPECT_EQ(parse_keep("25%", 64), 16);  // exact: not rounded up past 16
  EXPECT_EQ(parse_keep("12.5%", 16), 2);
  EXPECT_EQ(parse_keep("100%", 16), 16);
  EXPECT_EQ(parse_keep("1%", 16), 1);
  EXPECT_EQ(parse_keep("0", 16), 0);  // check_keep refuses it
  for (const char* bad : {"", "abc", "8x", "-", "5%%", "%", " 5%", "0x10%", "nan%", "200%"})
    EXPECT_THROW(parse_keep(bad, 16), Error) << bad;
}

TEST(Prune, BadInputIsOneLineAndLeavesNothing) {
  TempDir tmp;
  const fs::path src = golden("qwen3moe-bf16");  // 16 experts, top-4
  std::vector<double> l(16, 1.0);
  const fs::path counts = write_counts(tmp / "c.json", {l, {}, l});
  write_file(tmp / "junk.bin", "not a trace");
  fs::create_directory(tmp / "exists");
  struct Case {
    std::string args, expect;
  };
  const std::string base = src.string() + " ";
  for (const Case& k :
       {Case{"--trace " + counts.string() + " --keep 0", "--keep: 0"},
        Case{"--trace " + counts.string() + " --keep 17", "exceeds num_experts 16"},
        Case{"--trace " + counts.string() + " --keep 3", "less than num_experts_per_tok 4"},
        Case{"--trace " + counts.string() + " --keep 10%", "--keep: 2 is less than"},
        Case{"--trace " + counts.string() + " --keep 0%", "--keep: invalid percentage '0%'"},
        Case{"--trace " + counts.string() + " --keep 101%", "--keep: invalid percentage '101%'"},
        Case{"--trace " + counts.string() + " --keep 8x", "--keep: '8x' is not a count"},
        Case{"--trace " + (tmp / "none.json").string() + " --keep 8", "cannot open"},
        Case{"--trace " + (tmp / "junk.bin").string() + " --keep 8", "neither a trace"},
        Case{"--trace " + counts.string() + " --keep 8 -o " + (tmp / "exists").string(),
             "already exists"}}) {
    const bool has_o = k.args.find(" -o ") != std::string::npos;
    const CliResult r =
        run_cli("prune " + base + k.args + (has_o ? "" : " -o " + (tmp / "out").string()));
    EXPECT_EQ(r.rc, 1) << k.args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("moetier: error: ")) << r.err;
    EXPECT_NE(r.err.find(k.expect), std::string::npos) << r.err;
    EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{}) << k.args;
  }
  // A checkpoint that fails check is refused before anything is written.
  copy_dir(src, tmp / "broken");
  write_file(tmp / "broken/config.json", "{\"model_type\": \"qwen3_moe\"}");
  const CliResult r = run_cli("prune " + (tmp / "broken").string() + " --trace " + counts.string() +
                              " --keep 8 -o " + (tmp / "out").string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{});
}

// A failure or an interruption midway leaves neither OUT nor OUT.tmp-*; a
// killed writer leaves only OUT.tmp-*, which the next writer removes.
TEST(Prune, FailureMidwayLeavesNoOutput) {
  TempDir tmp;
  const fs::path src = golden("qwen3moe-sharded");
  {
    auto ck = Checkpoint::open(src);
    ConvertControl ctl;
    ctl.fail_after = 7;
    EXPECT_THROW(prune_checkpoint(*ck, all_kept(config_of(src)), tmp / "api", ctl), Error);
  }
  EXPECT_EQ(leftovers(tmp.path(), "api"), std::vector<std::string>{});
  std::vector<double> l(8, 1.0);
  const fs::path counts = write_counts(tmp / "c.json", {l, l});
  const std::string args = "prune " + src.string() + " --trace " + counts.string() +
                           " --keep 4 -o " + (tmp / "out").string();
  CliResult r = run_cli(args, "MOETIER_CONVERT_FAULT=error:9 ");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("injected fault"), std::string::npos) << r.err;
  EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{});
  r = run_cli(args, "MOETIER_CONVERT_FAULT=sigint:9 ");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
  EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{});
  r = run_cli(args, "MOETIER_CONVERT_FAULT=sigkill:9 ");
  EXPECT_EQ(r.signal, 9) << r.rc << " " << r.err;
  const auto left = leftovers(tmp.path(), "out");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(left[0].starts_with("out.tmp-")) << left[0];
  r = run_cli(args);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{"out"});
  EXPECT_EQ(check_checkpoint(tmp / "out"), std::vector<std::string>{});
}

// A prune of a pruned checkpoint records the ids of the original model; each
// expert record starts 4 KiB-aligned and is read in one extent.
TEST(Prune, ComposesAndAlignsRecords) {
  TempDir tmp;
  const fs::path src = golden("qwen3moe-sharded");  // 8 experts, top-2, per-expert bf16
  {
    auto ck = Checkpoint::open(src);
    prune_checkpoint(*ck, {{1, 2, 4, 5, 7}, {0, 1, 3, 6, 7}}, tmp / "p1");
  }
  {
    auto ck = Checkpoint::open(tmp / "p1");
    prune_checkpoint(*ck, {{0, 3, 4}, {1, 2, 4}}, tmp / "p2");
  }
  EXPECT_EQ(check_checkpoint(tmp / "p2"), std::vector<std::string>{});
  const auto cfg = read_json(tmp / "p2/config.json");
  EXPECT_EQ(cfg["num_experts"], 3);
  EXPECT_EQ(cfg["moetier"]["pruned_from"], 8);
  EXPECT_EQ(cfg["moetier"]["kept_experts"], nlohmann::json({{1, 5, 7}, {1, 3, 7}}));
  auto ck = Checkpoint::open(tmp / "p2");
  const ModelSpec c = config_of(tmp / "p2");
  const ExpertIndex ix = ExpertIndex::build(*ck, c);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const ExpertRecord& r = ix.record(l, e);
      EXPECT_EQ(r.extents.size(), 1u) << l << " " << e;
      EXPECT_EQ(r.extents[0].offset % 4096, 0u) << l << " " << e;
    }
  }
  // The pruned experts are byte-identical to the originals they came from.
  auto orig = Checkpoint::open(src);
  const auto a = ck->bytes(ck->get("model.layers.1.mlp.experts.2.up_proj.weight"));
  const auto b = orig->bytes(orig->get("model.layers.1.mlp.experts.7.up_proj.weight"));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
}

// End to end on moetier-tiny: moetier trace, then prune with its summary; the
// output passes check and runs with the mmap and with the arena.
TEST(Prune, TraceThenPruneThenRun) {
  TempDir tmp;
  write_file(tmp / "corpus.txt",
             "The quick brown fox jumps over the lazy dog.\nint main() { return 0; }\n"
             "A small model routes every token to eight of its sixty-four experts.\n");
  const fs::path tiny = tiny_model();
  CliResult r = run_cli("trace " + tiny.string() + " --corpus " + (tmp / "corpus.txt").string() +
                        " --tokens 48 --window 16 -o " + (tmp / "t.trace").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(fs::exists(tmp / "t.trace.json"));
  r = run_cli("prune " + tiny.string() + " --trace " + (tmp / "t.trace").string() +
              " --keep 40% -o " + (tmp / "p").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("kept 26 of 64"), std::string::npos) << r.out;  // 40% of 64, rounded up
  r = run_cli("check " + (tmp / "p").string());
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const std::string flags : {"--mapped", "--arena-experts 30"}) {
    r = run_cli("run " + (tmp / "p").string() + " -p \"The fox\" -n 6 " + flags);
    EXPECT_EQ(r.rc, 0) << flags << ": " << r.err;
    EXPECT_NE(r.err.find("tok/s decode"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::exists(tmp / "p/tokenizer.json"));
  EXPECT_FALSE(fs::exists(tmp / "p/reference_eval.json"));  // describes the source model
}

// moetier check validates the "moetier" object a prune writes.
TEST(Prune, CheckValidatesKeptExperts) {
  TempDir tmp;
  {
    auto ck = Checkpoint::open(golden("qwen3moe-bf16"));
    prune_checkpoint(*ck, {{0, 2, 4, 6, 8, 10}, {}, {1, 3, 5, 7, 9, 11}}, tmp / "p");
  }
  ASSERT_EQ(check_checkpoint(tmp / "p"), std::vector<std::string>{});
  const auto good = read_json(tmp / "p/config.json");
  auto with = [&](const std::string& field, const nlohmann::json& v) {
    nlohmann::json c = good;
    c["moetier"][field] = v;
    write_file(tmp / "p/config.json", c.dump());
    const auto problems = check_checkpoint(tmp / "p");
    EXPECT_EQ(problems.size(), 1u) << v;
    return problems.empty() ? std::string() : problems[0];
  };
  EXPECT_NE(with("kept_experts", {{0, 2, 4, 6, 8, 10}, {}}).find("kept_experts"),
            std::string::npos);
  EXPECT_NE(with("kept_experts", {{0, 2, 2, 6, 8, 10}, {}, {1, 3, 5, 7, 9, 11}})
                .find("kept_experts[0]': expected 6 ascending expert ids in [0, 16)"),
            std::string::npos);
  EXPECT_NE(with("kept_experts", {{0, 2, 4, 6, 8, 10}, {1}, {1, 3, 5, 7, 9, 11}})
                .find("kept_experts[1]': expected 0"),
            std::string::npos);
  EXPECT_NE(with("pruned_from", 4).find("pruned_from"), std::string::npos);
}
