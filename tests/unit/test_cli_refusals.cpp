// What every command refuses before computing, each with one line and exit
// status 1, within a second: a checkpoint whose architecture `moetier check`
// refuses (the same line), a DIR that is not a checkpoint directory, and a
// sequence longer than the context (run, trace, eval), a tokenizer whose ids
// reach past the model's vocabulary (check, run, trace, eval, repack --calib).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"

namespace fs = std::filesystem;
using moetier::testutil::CliResult;
using moetier::testutil::quote;
using moetier::testutil::slurp;

namespace {

// A scratch directory removed at the end of the test.
struct Scratch {
  fs::path dir;
  Scratch() {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("moetier_refusals_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// A copy of the bf16 fixture (256 positions, 16 experts) with config.json edited.
fs::path edited_fixture(const Scratch& s, const std::string& field, const nlohmann::json& v) {
  const fs::path dir = s / "ck";
  fs::copy(fixture("qwen3moe-bf16"), dir, fs::copy_options::recursive);
  auto cfg = nlohmann::json::parse(slurp(dir / "config.json"));
  cfg[field] = v;
  write_text(dir / "config.json", cfg.dump(1));
  return dir;
}

struct Timed {
  CliResult r;
  double seconds;
};

Timed run_timed(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  CliResult r = moetier::testutil::run_cli(args);
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// A refusal comes before any model work: well within this many seconds of
// wall time even on 2 loaded cores (ctest -j8 there took a 1 s limit past it;
// a hang or a refusal after generating takes far longer).
constexpr double kRefusalSeconds = 10.0;

// Exit 1, stderr exactly "moetier: error: ...LINE...\n" (one line holding
// `line`), within kRefusalSeconds.
void expect_refused(const std::string& args, const std::string& line) {
  SCOPED_TRACE(args);
  const Timed t = run_timed(args);
  EXPECT_EQ(t.r.rc, 1) << t.r.err;
  EXPECT_TRUE(t.r.err.starts_with("moetier: error: ")) << t.r.err;
  EXPECT_EQ(std::count(t.r.err.begin(), t.r.err.end(), '\n'), 1) << t.r.err;
  EXPECT_NE(t.r.err.find(line), std::string::npos) << "expected: " << line << "\ngot: " << t.r.err;
  EXPECT_TRUE(t.r.out.empty()) << t.r.out;
  EXPECT_LT(t.seconds, kRefusalSeconds);
}

// The command `name` (run, trace, eval, prune, repack, info) on DIR.
std::string command_on(const std::string& name, const std::string& dir, const Scratch& s) {
  write_text(s / "corpus.txt", "The quick brown fox jumps over the lazy dog.\n");
  write_text(s / "counts.json",
             "{\"layers\": [[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], [], "
             "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]]}");
  const std::string d = quote(dir);
  if (name == "run") return "run " + d + " -p 'The fox' -n 4";
  if (name == "trace")
    return "trace " + d + " --corpus " + s / "corpus.txt" + " --tokens 8 -o " + s / "t.trace";
  if (name == "eval")
    return "eval --arm a=" + d + " --corpus c=" + s / "corpus.txt" + " --max-tokens 4";
  if (name == "prune")
    return "prune " + d + " --trace " + s / "counts.json" + " --keep 8 -o " + s / "pruned";
  if (name == "repack") return "repack " + d + " --experts cb3 -o " + s / "repacked";
  return "info " + d;
}

// One instance per command that takes a checkpoint directory.
class EveryCommand : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(EveryCommand, RefusesAnUnsupportedArchitectureWithChecksLine) {
  for (const auto& [field, value] :
       {std::pair<std::string, nlohmann::json>{"model_type", "no_such_arch"},
        {"architectures", nlohmann::json::array({"NoSuchForCausalLM"})}}) {
    Scratch s;
    const fs::path dir = edited_fixture(s, field, value);
    // The line moetier check gives.
    const CliResult chk = moetier::testutil::run_cli("check " + quote(dir.string()));
    ASSERT_EQ(chk.rc, 1);
    const std::string line = chk.err.substr(0, chk.err.find('\n'));
    ASSERT_NE(line.find("is not supported"), std::string::npos) << chk.err;
    ASSERT_NE(line.find((dir / "config.json").string()), std::string::npos) << line;
    expect_refused(command_on(GetParam(), dir.string(), s), line);
    EXPECT_FALSE(fs::exists(s / "pruned") || fs::exists(s / "repacked") ||
                 fs::exists(s / "t.trace"));
  }
}

TEST_P(EveryCommand, SaysWhyDirIsNotACheckpointDirectory) {
  Scratch s;
  fs::create_directories(s / "empty");
  write_text(s / "file", "not a checkpoint");
  const std::string cases[][2] = {
      {s / "file", s / "file" + " is a file, not a checkpoint directory"},
      {s / "missing", s / "missing" + ": no such directory"},
      {s / "empty", s / "empty" + ": no config.json (not a checkpoint directory)"}};
  for (const auto& [dir, line] : cases) expect_refused(command_on(GetParam(), dir, s), line);
}

INSTANTIATE_TEST_SUITE_P(CliRefusals, EveryCommand,
                         ::testing::Values("run", "trace", "eval", "prune", "repack", "info"),
                         [](const auto& p) { return p.param; });

TEST(CliRefusals, CheckSaysWhyDirIsNotACheckpointDirectory) {
  Scratch s;
  fs::create_directories(s / "empty");
  write_text(s / "file", "not a checkpoint");
  for (const auto& [dir, line] :
       {std::pair{s / "file", s / "file" + " is a file, not a checkpoint directory"},
        {s / "missing", s / "missing" + ": no such directory"},
        {s / "empty", s / "empty" + ": no config.json (not a checkpoint directory)"}}) {
    const CliResult chk = moetier::testutil::run_cli("check " + quote(dir));
    EXPECT_EQ(chk.rc, 1);
    EXPECT_TRUE(chk.err.starts_with(line + "\n")) << chk.err;
  }
}

TEST(CliRefusals, RunRefusesAPromptBeyondTheContext) {
  const std::string dir = fixture("qwen3moe-bf16").string();  // max_position_embeddings 256
  std::string prompt;
  for (int i = 0; i < 400; ++i) prompt += "fox ";
  const Timed t = run_timed("run " + quote(dir) + " -p " + quote(prompt) + " -n 64");
  ASSERT_EQ(t.r.rc, 1) << t.r.err;
  // "prompt P tokens + 64 to generate = P+64 exceed the context of 256 (...)"
  const std::string& e = t.r.err;
  ASSERT_TRUE(e.starts_with("moetier: error: prompt ")) << e;
  const long p = std::stol(e.substr(std::string("moetier: error: prompt ").size()));
  EXPECT_GT(p, 256);
  EXPECT_EQ(e, "moetier: error: prompt " + std::to_string(p) +
                   " tokens + 64 to generate = " + std::to_string(p + 64) +
                   " exceed the context of 256 (max_position_embeddings in " + dir +
                   "/config.json); shorten the prompt, lower -n, or pass --ctx N\n");
  EXPECT_LT(t.seconds, kRefusalSeconds);
  // A prompt that fits plus -n that does not; then --ctx below the model's.
  expect_refused("run " + quote(dir) + " -p fox -n 300",
                 " + 300 to generate = 30");  // 301 or 302 (the prompt is 1-2 tokens)
  expect_refused("run " + quote(dir) + " -p fox -n 20 --ctx 16",
                 "exceed the context of 16 (--ctx); shorten the prompt, lower -n, or pass a "
                 "larger --ctx");
  expect_refused("run " + quote(dir) + " -p fox -n 2 --ctx -1", "--ctx: -1 must not be negative");
}

TEST(CliRefusals, CtxAboveTheModelsContextWarnsAndRuns) {
  const std::string dir = fixture("qwen3moe-bf16").string();
  const CliResult r =
      moetier::testutil::run_cli("run " + quote(dir) + " -p fox -n 3 --temp 0 --ctx 1024 --mapped");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: warning: --ctx 1024 exceeds max_position_embeddings 256 of " +
                       dir + "/config.json"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("generated 3 tokens"), std::string::npos) << r.err;
}

TEST(CliRefusals, TraceAndEvalRefuseWindowsBeyondTheContext) {
  Scratch s;
  const std::string dir = fixture("qwen3moe-bf16").string();
  std::string text;
  for (int i = 0; i < 200; ++i) text += "The quick brown fox jumps over the lazy dog.\n";
  write_text(s / "corpus.txt", text);
  const std::string ctx = " (max_position_embeddings in " + dir + "/config.json); ";
  expect_refused("trace " + quote(dir) + " --corpus " + s / "corpus.txt" +
                     " --tokens 1000 --window 250 --decode 10 -o " + s / "t",
                 "--window 250 + --decode 10 = 260 exceed the context of 256" + ctx +
                     "lower --window or --decode, or pass --ctx N");
  expect_refused("trace " + quote(dir) + " --corpus " + s / "corpus.txt" +
                     " --tokens 1000 --window 100 -o " + s / "t" + " --ctx 64",
                 "--window 100 + --decode 0 = 100 exceed the context of 64 (--ctx)");
  EXPECT_FALSE(fs::exists(s / "t"));
  expect_refused(
      "eval --arm a=" + quote(dir) + " --corpus c=" + s / "corpus.txt" + " --max-tokens 512",
      "--arm a: --max-tokens 512 exceeds the context of 256" + ctx +
          "lower --max-tokens or pass --ctx N");
}

namespace {

// A copy of the bf16 fixture (vocab_size 384) whose tokenizer.json has one
// more added token, id 390: ids reach past the model's vocabulary.
fs::path tokenizer_past_vocab(const Scratch& s) {
  const fs::path dir = s / "ck";
  fs::copy(fixture("qwen3moe-bf16"), dir, fs::copy_options::recursive);
  auto tok = nlohmann::json::parse(slurp(dir / "tokenizer.json"));
  tok["added_tokens"].push_back({{"id", 390},
                                 {"content", "<|past|>"},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  write_text(dir / "tokenizer.json", tok.dump());
  return dir;
}

std::string vocab_line(const fs::path& dir) {
  return (dir / "tokenizer.json").string() +
         ": token ids reach 390 (a vocabulary of 391 ids), past the model's vocab_size 384 (" +
         (dir / "config.json").string() + ")";
}

class TokenizerPastVocab : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(TokenizerPastVocab, EveryCommandLoadingBothRefusesNamingBothSizes) {
  Scratch s;
  const fs::path dir = tokenizer_past_vocab(s);
  std::string cmd = command_on(GetParam(), dir.string(), s);  // writes corpus.txt
  if (GetParam() == "repack")  // calibration tokenizes a corpus with the model's tokenizer
    cmd = "repack " + quote(dir.string()) + " --experts cb3 --calib " + s / "corpus.txt" + " -o " +
          s / "repacked";
  expect_refused(cmd, vocab_line(dir));
}

INSTANTIATE_TEST_SUITE_P(CliRefusals, TokenizerPastVocab,
                         ::testing::Values("run", "trace", "eval", "repack"));

TEST(CliRefusals, CheckRefusesATokenizerPastTheVocabulary) {
  Scratch s;
  const fs::path dir = tokenizer_past_vocab(s);
  const CliResult r = moetier::testutil::run_cli("check " + quote(dir.string()));
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, vocab_line(dir) + "\nmoetier: error: " + dir.string() + ": 1 problem found\n");
  // the fixture as it is passes
  const CliResult ok = moetier::testutil::run_cli("check " + quote(fixture("qwen3moe-bf16")));
  EXPECT_EQ(ok.rc, 0) << ok.err;
}
