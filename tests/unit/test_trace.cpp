// Trace files: round trip of every field, the summary and ranking, and bad
// input (every truncation, flipped bytes, foreign files) -> one-line Error;
// `moetier trace` / `moetier simulate` end to end and their bad-input exits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_runner.h"
#include "core/dtype.h"
#include "core/error.h"
#include "experts/policy.h"
#include "experts/trace.h"
#include "qwen3_fixture.h"
#include "trace_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using moetier::testutil::CliResult;
using moetier::testutil::run_cli;

namespace {

// Reading `p` must fail with one line that names the file.
void expect_bad(const fs::path& p, const std::string& what, const std::string& needle = "") {
  try {
    read_trace(p);
    ADD_FAILURE() << what << ": read_trace accepted it";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find(p.string()), std::string::npos) << what << ": " << msg;
    if (!needle.empty()) {
      EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
    }
  }
}

// A failed command: non-zero exit, exactly one stderr line "moetier: error: ...".
void expect_one_line_error(const CliResult& r, const std::string& needle) {
  EXPECT_NE(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.rfind("moetier: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace

TEST(Trace, RoundTripKeepsEveryField) {
  TempDir tmp;
  for (bool f32 : {false, true}) {
    Synth s;
    s.f32 = f32;
    s.seed = f32 ? 7 : 8;
    const fs::path p = tmp / (f32 ? "f32.trace" : "f16.trace");
    const uint64_t n = write_synth(p, s);
    const Trace t = read_trace(p, /*with_weights=*/true);
    ASSERT_EQ(t.size(), n);
    EXPECT_EQ(t.header.model.moe_layers, s.moe);
    EXPECT_EQ(t.header.model.k, s.k);
    EXPECT_EQ(t.header.f32_weights, f32);
    EXPECT_EQ(t.header.model.encodings.front().name, "bf16");
    EXPECT_TRUE(t.header.model.encodings.front().measured);
    ASSERT_EQ(t.experts.size(), n * s.moe.size() * size_t(s.k));
    ASSERT_EQ(t.weights.size(), t.experts.size());
    uint64_t prefill = 0;
    for (size_t i = 0; i < n; ++i) {
      prefill += t.phase[i] == Phase::Prefill;
      if (i > 0 && t.chunk[i] == t.chunk[i - 1]) {
        EXPECT_EQ(t.position[i], t.position[i - 1] + 1);
        EXPECT_EQ(t.phase[i], Phase::Prefill);
      }
      EXPECT_EQ(t.corpus[i], t.sequence[i] % 2);
    }
    EXPECT_GT(prefill, 0u);
    EXPECT_LT(prefill, n);
    for (float w : t.weights) {
      EXPECT_GE(w, 0.04f);
      EXPECT_LE(w, 1.0f);
    }
  }
}

TEST(Trace, WeightsAndIdsMatchWhatWasWritten) {
  TempDir tmp;
  const TraceHeader h = synth_header(Synth{});
  const fs::path p = tmp / "x.trace";
  TraceWriter w(p, h);
  // 3 tokens, 2 MoE layers, k 3; layer-major as the forward pass reports.
  const std::vector<int32_t> toks = {5, 9, 11};
  const std::vector<int32_t> ex = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 10, 0, 3, 9, 2, 9, 8, 7};
  std::vector<float> wt(ex.size());
  for (size_t i = 0; i < wt.size(); ++i) wt[i] = 0.1f + 0.037f * float(i);
  w.add_chunk(4, 1, 17, Phase::Prefill, toks, ex, wt);
  const std::vector<int32_t> one = {3};
  const std::vector<int32_t> ex1 = {2, 0, 1, 11, 10, 9};
  const std::vector<float> wt1 = {0.5f, 0.25f, 0.125f, 0.7f, 0.2f, 0.1f};
  w.add_chunk(4, 1, 20, Phase::Decode, one, ex1, wt1);
  w.commit();
  const Trace t = read_trace(p, true);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t.token, (std::vector<uint32_t>{5, 9, 11, 3}));
  EXPECT_EQ(t.position, (std::vector<uint32_t>{17, 18, 19, 20}));
  EXPECT_EQ(t.chunk, (std::vector<uint32_t>{0, 0, 0, 1}));
  EXPECT_EQ(t.phase[3], Phase::Decode);
  // Token 1 at MoE layer 1 (index 1): ex[(1 * 3 + 1) * 3 ...] = {3, 9, 2}.
  auto ids = t.ids(1, 1);
  EXPECT_EQ(std::vector<uint16_t>(ids.begin(), ids.end()), (std::vector<uint16_t>{3, 9, 2}));
  auto ids3 = t.ids(3, 1);
  EXPECT_EQ(std::vector<uint16_t>(ids3.begin(), ids3.end()), (std::vector<uint16_t>{11, 10, 9}));
  // f16 weight of token 2, layer 0, slot 1 = wt[(0 * 3 + 2) * 3 + 1].
  EXPECT_EQ(t.weights[(2 * 2 + 0) * 3 + 1], f16_to_f32(f32_to_f16(wt[7])));
  // Summary and ranking: expert 9 of layer 2 is used by tokens 1, 2 and 3.
  const auto j = trace_summary(t);
  EXPECT_EQ(j["tokens"].get<int>(), 4);
  EXPECT_EQ(j["prefill_tokens"].get<int>(), 3);
  EXPECT_EQ(j["layers"][1]["uses"][9].get<int>(), 3);
  EXPECT_EQ(j["layers"][1]["decode_uses"][9].get<int>(), 1);
  EXPECT_EQ(j["ranking"][0].dump(), "[2,9,3]");
  write_file(tmp / "r.txt", ranking_text(t));
  const auto keys = read_ranking(tmp / "r.txt", 3, 12);
  ASSERT_EQ(keys.size(), 24u);  // every expert of both MoE layers
  EXPECT_EQ(keys[0], ExpertKey(2 * 12 + 9));
}

TEST(Trace, EveryTruncationAndForeignFileIsOneLineError) {
  TempDir tmp;
  Synth s;
  s.windows = 2;
  const fs::path good = tmp / "good.trace";
  write_synth(good, s);
  const std::string bytes = read_file(good);
  ASSERT_NO_THROW(read_trace(good));
  const fs::path cut = tmp / "cut.trace";
  for (size_t n = 0; n < bytes.size(); n += (n < 200 ? 1 : 7)) {
    write_file(cut, bytes.substr(0, n));
    expect_bad(cut, "cut at " + std::to_string(n));
  }
  write_file(cut, bytes.substr(0, bytes.size() - 1));
  expect_bad(cut, "one byte short", "truncated");
  // Flipped bytes anywhere after the magic.
  std::mt19937 rng(3);
  const fs::path flip = tmp / "flip.trace";
  for (int i = 0; i < 200; ++i) {
    std::string b = bytes;
    const size_t at = 8 + rng() % (b.size() - 8);
    b[at] = char(b[at] ^ (1 << (rng() % 8)));
    write_file(flip, b);
    expect_bad(flip, "flip at " + std::to_string(at));
  }
  // Extra bytes, foreign files, a directory.
  write_file(cut, bytes + "x");
  expect_bad(cut, "trailing byte");
  const fs::path fixture = fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures/qwen3moe-bf16";
  expect_bad(fixture / "model.safetensors", "safetensors", "not a moetier trace");
  expect_bad(fixture / "config.json", "json", "not a moetier trace");
  expect_bad(fixture, "directory");
  expect_bad(tmp / "missing.trace", "missing");
  write_file(cut, "MOETRACE");
  expect_bad(cut, "magic only", "truncated");
}

TEST(Trace, CliTraceThenSimulateAndRankingLoadsInTheEngine) {
  TempDir tmp;
  const std::string fx =
      (fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures/qwen3moe-mxfp4").string();
  const fs::path corpus = tmp / "corpus.txt";
  write_file(
      corpus,
      "The quick brown fox jumps over the lazy dog.\nPack my box with five dozen liquor "
      "jugs.\nHow vexingly quick daft zebras jump!\nSphinx of black quartz, judge my vow.\n");
  const std::string tr = (tmp / "t.trace").string();
  CliResult r = run_cli("trace " + fx + " --corpus " + corpus.string() + " " + corpus.string() +
                        " --tokens 41 --window 9 --decode 3 -t 1 -o " + tr);
  ASSERT_EQ(r.rc, 0) << r.err;
  const Trace t = read_trace(tr);
  EXPECT_EQ(t.size(), 41u);
  EXPECT_EQ(t.header.corpus.size(), 2u);
  EXPECT_EQ(t.header.model.encoding, "mxfp4");
  EXPECT_EQ(t.header.model.moe_layers.size(), 2u);
  const auto summary = nlohmann::json::parse(read_file(tr + ".json"));
  EXPECT_EQ(summary["tokens"].get<int>(), 41);
  EXPECT_EQ(summary["corpus"][0]["tokens"].get<int>(), 21);
  EXPECT_EQ(summary["corpus"][1]["tokens"].get<int>(), 20);
  EXPECT_EQ(summary["prefill_tokens"].get<int>() + summary["decode_tokens"].get<int>(), 41);
  EXPECT_GT(summary["decode_tokens"].get<int>(), 0);

  r = run_cli("simulate " + tr + " --budgets 8,25%,100% --transient 8 -o " +
              (tmp / "sim").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto sim = nlohmann::json::parse(read_file(tmp / "sim.json"));
  ASSERT_EQ(sim["budgets"].size(), 3u);
  EXPECT_EQ(sim["budgets"][1]["experts"].get<int>(), 16);
  // static, static_layer, lru x2, lfu x2, pinned x2, min x2 per budget.
  EXPECT_EQ(sim["budgets"][0]["results"].size(), 10u);
  const std::string csv = read_file(tmp / "sim.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 30);
  for (const auto& row : sim["budgets"][2]["results"]) {  // the whole model: compulsory misses only
    const std::string policy = row["policy"].get<std::string>();
    if (policy == "static" || policy == "static_layer") {
      EXPECT_EQ(row["misses"].get<int>(), 0) << row.dump();
    } else {
      EXPECT_LE(row["misses"].get<int>(), 64) << row.dump();
    }
  }
  // The ranking the trace wrote drives the engine's pinned policy.
  r = run_cli("run " + fx +
              " -p 'Sphinx of black quartz' -n 4 -t 1 --arena-experts 24 "
              "--policy pinned --ranking " +
              tr + ".ranking --stats");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("16 pinned"), std::string::npos) << r.err;
}

TEST(Trace, CliBadInputIsOneLineAndNonZero) {
  TempDir tmp;
  Synth s;
  const fs::path good = tmp / "good.trace";
  write_synth(good, s);  // 2 MoE layers x 12 experts = 24
  const std::string bytes = read_file(good);
  write_file(tmp / "cut.trace", bytes.substr(0, bytes.size() / 2));
  expect_one_line_error(run_cli("simulate " + (tmp / "cut.trace").string() + " --budgets 4"),
                        "truncated");
  const std::string fx =
      (fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures/qwen3moe-bf16").string();
  expect_one_line_error(run_cli("simulate " + fx + "/model.safetensors --budgets 4"),
                        "not a moetier trace");
  const std::string g = "simulate " + good.string();
  expect_one_line_error(run_cli(g + " --budgets 25"), "more than the model's 24 experts");
  expect_one_line_error(run_cli(g + " --budgets 4,101%"), "more than the model's");
  expect_one_line_error(run_cli(g + " --budgets 1TB"), "more than the model's");
  expect_one_line_error(run_cli(g + " --budgets 1KB"), "holds no expert");
  expect_one_line_error(run_cli(g + " --budgets 0"), "0 experts");
  expect_one_line_error(run_cli(g + " --budgets 4 --encoding zz9"), "unknown encoding");
  expect_one_line_error(run_cli(g + " --budgets 4 --policies lru,mru"), "mru");
  expect_one_line_error(run_cli(g + " --budgets 4 --replay bogus"), "bogus");
  write_file(tmp / "rank.txt", "0 99\n");
  expect_one_line_error(run_cli(g + " --budgets 4 --ranking " + (tmp / "rank.txt").string()),
                        "out of range");
  expect_one_line_error(run_cli("trace " + fx + " --corpus " + (tmp / "nope.txt").string() +
                                " --tokens 5 -o " + (tmp / "x.trace").string()),
                        "nope.txt");
  write_file(tmp / "empty.txt", "");
  expect_one_line_error(run_cli("trace " + fx + " --corpus " + (tmp / "empty.txt").string() +
                                " --tokens 5 -o " + (tmp / "x.trace").string()),
                        "empty.txt: no text");
  EXPECT_FALSE(fs::exists(tmp / "x.trace"));  // nothing half-written is left behind
  expect_one_line_error(run_cli("trace " + fx + " --corpus " + (tmp / "empty.txt").string() +
                                " --tokens 0 -o " + (tmp / "x.trace").string()),
                        "--tokens");
}
