// `moetier eval` end to end: the JSON report holds, per corpus and arm, the
// window scores the library computes for the same ids and windows, paired
// differences and standard errors that follow from them; the same checkpoint
// as both arms differs by exactly zero; bad input (tokenizers that differ, a
// corpus shorter than one window, a missing file, arm syntax, a missing
// checkpoint) exits 1 with one line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_runner.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "runtime/eval.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using namespace moetier;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;

class CmdEval : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moetier_test_cmd_eval_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result run(const std::string& args) { return run_cli("eval " + args); }

  // Random words (letters, digits, punctuation, newlines): a corpus file.
  fs::path corpus(const std::string& name, int words, unsigned seed) {
    std::mt19937 rng(seed);
    const char* pool[] = {"the", "model",  "routes", "each", "token", "to", "experts",
                          "of",  "int",    "x",      "=",    "3;",    "{",  "}",
                          "\n",  "Hello,", "world",  "42",   "(a,",   "b)"};
    std::uniform_int_distribution<int> ud(0, int(std::size(pool)) - 1);
    std::string text;
    for (int i = 0; i < words; ++i) text += std::string(pool[ud(rng)]) + " ";
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  static std::string fixture(const char* name) {
    return (fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name).string();
  }
  static std::string tiny() {
    return (fs::path(MOETIER_SOURCE_DIR) / "models/moetier-tiny").string();
  }

  fs::path dir_;
};

int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

std::vector<WindowScore> library_scores(const std::string& dir, const fs::path& text,
                                        int64_t window, int64_t max_windows) {
  Tokenizer tok = Tokenizer::load(dir);
  const std::vector<int32_t> ids = tok.encode(slurp(text), false);
  auto ck = Checkpoint::open(dir);
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  MappedExperts ex(*ck, model.spec());
  EvalOptions eo;
  eo.window = window;
  eo.max_windows = max_windows;
  return score_windows(model, ex, ids, eo);
}

void expect_arm(const json& got, const std::vector<WindowScore>& want) {
  ASSERT_EQ(got["per_window_nll_sum"].size(), want.size());
  double nll = 0;
  int64_t correct = 0, predicted = 0;
  for (size_t w = 0; w < want.size(); ++w) {
    EXPECT_NEAR(got["per_window_nll_sum"][w].get<double>(), want[w].nll_sum,
                1e-6 * want[w].nll_sum);
    EXPECT_EQ(got["per_window_top1_correct"][w].get<int64_t>(), want[w].correct);
    nll += want[w].nll_sum, correct += want[w].correct, predicted += want[w].predicted;
  }
  EXPECT_EQ(got["predicted_tokens"].get<int64_t>(), predicted);
  EXPECT_EQ(got["correct"].get<int64_t>(), correct);
  EXPECT_NEAR(got["mean_nll"].get<double>(), nll / double(predicted), 1e-6);
  EXPECT_NEAR(got["perplexity"].get<double>(), std::exp(nll / double(predicted)), 1e-4);
  EXPECT_NEAR(got["top1"].get<double>(), double(correct) / double(predicted), 1e-12);
  EXPECT_GT(got["mean_nll_se"].get<double>(), 0.0);
}

}  // namespace

TEST_F(CmdEval, TwoArmsScoreTheSameWindows) {
  const fs::path text = corpus("words.txt", 400, 5), prose = corpus("more.txt", 300, 6);
  const fs::path out = dir_ / "report.json";
  const std::string a = fixture("qwen3moe-bf16"), b = fixture("qwen3moe-mxfp4");
  Result r = run("--arm base=" + a + " --arm q4=" + b + " --corpus words=" + text.string() +
                 " --corpus more=" + prose.string() + " --max-tokens 29 --windows 5 -t 2 -o " +
                 out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(slurp(out));
  EXPECT_EQ(j["schema"], "moetier.eval/1");
  EXPECT_EQ(j["max_tokens"], 29);
  EXPECT_EQ(j["baseline"], "base");
  ASSERT_EQ(j["arms"].size(), 2u);
  EXPECT_EQ(j["arms"][1]["name"], "q4");
  EXPECT_EQ(j["arms"][1]["experts"], "mapped");
  ASSERT_EQ(j["corpora"].size(), 2u);
  const json& c = j["corpora"][0];
  EXPECT_EQ(c["name"], "words");
  EXPECT_EQ(c["windows"], 5);
  EXPECT_EQ(c["predicted_tokens_per_window"], 28);

  const auto sa = library_scores(a, text, 29, 5), sb = library_scores(b, text, 29, 5);
  expect_arm(c["scores"]["base"], sa);
  expect_arm(c["scores"]["q4"], sb);
  // The difference and its paired standard error, from the per-window scores.
  std::vector<double> d;
  double mean = 0;
  for (size_t w = 0; w < 5; ++w) d.push_back((sb[w].nll_sum - sa[w].nll_sum) / 28.0);
  for (double x : d) mean += x / 5.0;
  double ss = 0;
  for (double x : d) ss += (x - mean) * (x - mean);
  const json& diff = c["differences"]["q4-base"];
  EXPECT_NEAR(diff["mean_nll"].get<double>(), mean, 1e-6);
  EXPECT_NEAR(diff["mean_nll_se"].get<double>(), std::sqrt(ss / 4.0 / 5.0), 1e-6);
  EXPECT_GT(std::abs(mean), 1e-5);  // bf16 and mxfp4 experts are different weights
  // The table: one row per arm and one for the difference, per corpus.
  EXPECT_NE(r.out.find("q4 - base"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out), 1 + 2 * 3) << r.out;
}

TEST_F(CmdEval, SameCheckpointTwiceDiffersByZero) {
  const fs::path text = corpus("words.txt", 200, 9);
  const fs::path out = dir_ / "r.json";
  const std::string a = fixture("qwen3moe-sharded");
  Result r = run("--arm A=" + a + " --arm B=" + a + " --corpus t=" + text.string() +
                 " --max-tokens 16 -o " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(slurp(out));
  const json& d = j["corpora"][0]["differences"]["B-A"];
  EXPECT_EQ(d["mean_nll"].get<double>(), 0.0);
  EXPECT_EQ(d["mean_nll_se"].get<double>(), 0.0);
  EXPECT_EQ(d["top1"].get<double>(), 0.0);
  EXPECT_EQ(j["windows_limit"], nullptr);
  EXPECT_GE(j["corpora"][0]["windows"].get<int64_t>(), 3);
}

TEST_F(CmdEval, ArmsWhoseTokenizersDifferAreAnError) {
  const fs::path text = corpus("words.txt", 200, 3);
  Result r = run("--arm fx=" + fixture("qwen3moe-bf16") + " --arm tiny=" + tiny() +
                 " --corpus t=" + text.string() + " --max-tokens 16");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("tokenizers differ"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(fixture("qwen3moe-bf16")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(tiny()), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(CmdEval, SameVocabularyDifferentMergesIsAnError) {
  // A copy of the fixture whose tokenizer has no merges: the same vocabulary,
  // byte-level ids for the corpus instead of merged ones.
  const fs::path src = fixture("qwen3moe-bf16"), copy = dir_ / "no-merges";
  fs::create_directories(copy);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(src / f, copy / f);
  json tok = json::parse(slurp(src / "tokenizer.json"));
  ASSERT_GT(tok["model"]["merges"].size(), 0u);
  tok["model"]["merges"] = json::array();
  std::ofstream(copy / "tokenizer.json") << tok.dump();
  const fs::path text = corpus("words.txt", 200, 3);
  Result r = run("--arm A=" + src.string() + " --arm B=" + copy.string() +
                 " --corpus t=" + text.string() + " --max-tokens 16");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("tokenizers differ: corpus t (" + text.string()), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(copy.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("first different at id"), std::string::npos) << r.err;
}

TEST_F(CmdEval, ArenaFlagsApplyToEveryArmAndChangeNothing) {
  const fs::path text = corpus("words.txt", 300, 12);
  const std::string a = fixture("qwen3moe-mxfp4"), b = fixture("qwen3moe-sharded");
  const std::string common = "--arm A=" + a + " --arm B=" + b + " --corpus t=" + text.string() +
                             " --max-tokens 20 --windows 4 -o ";
  ASSERT_EQ(run(common + (dir_ / "mapped.json").string()).rc, 0);
  Result r = run(common + (dir_ / "arena.json").string() +
                 " --arena-experts 3 --transient 2 --io pool --no-direct");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json m = json::parse(slurp(dir_ / "mapped.json")),
             x = json::parse(slurp(dir_ / "arena.json"));
  for (const char* arm : {"A", "B"}) {
    const json& sm = m["corpora"][0]["scores"][arm];
    const json& sx = x["corpora"][0]["scores"][arm];
    EXPECT_EQ(sm["per_window_nll_sum"], sx["per_window_nll_sum"]) << arm;
    EXPECT_EQ(sm["per_window_top1_correct"], sx["per_window_top1_correct"]) << arm;
  }
  EXPECT_EQ(m["arms"][0]["experts"], "mapped");
  EXPECT_NE(x["arms"][0]["experts"].get<std::string>().find("--arena-experts 3"),
            std::string::npos);
  EXPECT_GT(x["arms"][1]["expert_stats"].size(), 0u);
}

TEST_F(CmdEval, CorpusShorterThanOneWindowIsAnError) {
  const fs::path text = corpus("short.txt", 10, 4);
  Result r = run("--arm A=" + fixture("qwen3moe-bf16") + " --corpus s=" + text.string() +
                 " --max-tokens 200");  // the fixture's context is 256
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("shorter than one window of 200"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(text.string()), std::string::npos) << r.err;
  std::ofstream(dir_ / "empty.txt");
  r = run("--arm A=" + fixture("qwen3moe-bf16") + " --corpus e=" + (dir_ / "empty.txt").string() +
          " --max-tokens 64");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("0 tokens"), std::string::npos) << r.err;
}

TEST_F(CmdEval, MissingFilesAreAnError) {
  const fs::path text = corpus("words.txt", 200, 3);
  Result r = run("--arm A=" + fixture("qwen3moe-bf16") +
                 " --corpus c=" + (dir_ / "nope.txt").string() + " --max-tokens 64");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("nope.txt"), std::string::npos) << r.err;
  r = run("--arm A=" + (dir_ / "no-model").string() + " --corpus c=" + text.string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--arm A: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no-model"), std::string::npos) << r.err;
  // A directory with a tokenizer but no weights fails when the arm loads.
  fs::create_directories(dir_ / "tok-only");
  fs::copy_file(fs::path(fixture("qwen3moe-bf16")) / "tokenizer.json",
                dir_ / "tok-only/tokenizer.json");
  r = run("--arm A=" + (dir_ / "tok-only").string() + " --corpus c=" + text.string() +
          " --max-tokens 16");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--arm A: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok-only"), std::string::npos) << r.err;
}

TEST_F(CmdEval, BadArmAndCorpusSyntaxIsAnError) {
  const fs::path text = corpus("words.txt", 200, 3);
  const std::string a = fixture("qwen3moe-bf16");
  for (const std::string& args :
       {"--arm " + a + " --corpus c=" + text.string(),                      // no NAME=
        "--arm =" + a + " --corpus c=" + text.string(),                     // empty name
        "--arm A= --corpus c=" + text.string(),                             // empty dir
        "--arm 'a b=" + a + "' --corpus c=" + text.string(),                // bad name
        "--arm A=" + a + " --arm A=" + a + " --corpus c=" + text.string(),  // twice
        "--arm A=" + a + " --corpus " + text.string(),                      // corpus without NAME=
        "--arm A=" + a + " --corpus c=" + text.string() + " --max-tokens 1",
        "--arm A=" + a + " --corpus c=" + text.string() + " --windows -2"}) {
    Result r = run(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("moetier: error: "), std::string::npos) << r.err;
  }
}
