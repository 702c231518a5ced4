// `moetier run` end to end on the committed fixtures: the streamed text is the
// decode of what the library generates, the figures line is printed, sampling
// is reproducible by seed, and errors exit 1 with one line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_runner.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "runtime/generate.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

using Result = moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;
using moetier::testutil::quote;

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

}  // namespace

TEST(CmdRun, StreamsTheGreedyContinuation) {
  const fs::path dir = fixture("qwen3moe-sharded");
  const std::string prompt = "The quick brown fox jumps over the lazy dog, and";
  Result r =
      run_cli("run " + quote(dir.string()) + " --prompt " + quote(prompt) + " -n 9 --threads 2");
  ASSERT_EQ(r.rc, 0) << r.err;

  Tokenizer tok = Tokenizer::load(dir);
  auto ck = Checkpoint::open(dir);
  auto model = Qwen3MoeModel::load(*ck);
  MappedExperts ex(*ck, model.config());
  GenerateOptions go;
  go.max_new_tokens = 9;
  go.eos = {0};  // config.json eos_token_id
  auto st = generate(model, ex, tok.encode(prompt), go);
  ASSERT_FALSE(st.tokens.empty());
  EXPECT_EQ(r.out, tok.decode(st.tokens) + "\n");
  const std::string figures = "prompt " + std::to_string(st.prompt_tokens) + " tokens";
  EXPECT_NE(r.err.find(figures), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated " + std::to_string(st.tokens.size()) + " tokens"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tok/s decode"), std::string::npos) << r.err;
  // The figures are the last line of stderr (the expert store may print its
  // sizing before it).
  const size_t last = r.err.rfind('\n', r.err.size() - 2);
  const std::string last_line = r.err.substr(last == std::string::npos ? 0 : last + 1);
  EXPECT_EQ(last_line.rfind("moetier: prompt ", 0), 0u) << r.err;
  // --mapped (all experts through the mmap) streams the same text.
  Result m =
      run_cli("run " + quote(dir.string()) + " --prompt " + quote(prompt) + " -n 9 --mapped");
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_EQ(m.out, r.out);
}

TEST(CmdRun, SamplingIsReproducibleBySeed) {
  const std::string base =
      "run " + quote(fixture("qwen3moe-mxfp4").string()) +
      " --prompt 'def f(x):' -n 16 --ignore-eos --temperature 1.5 --top-p 0.95";
  Result a = run_cli(base + " --seed 11"), b = run_cli(base + " --seed 11");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("generated 16 tokens"), std::string::npos) << a.err;
  // Other seeds give other text (at least one of three differs).
  int differ = 0;
  for (int s : {1, 2, 3}) differ += run_cli(base + " --seed " + std::to_string(s)).out != a.out;
  EXPECT_GT(differ, 0);
}

TEST(CmdRun, HelpAndErrors) {
  Result h = run_cli("run --help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("--temperature"), std::string::npos);
  Result missing = run_cli("run /nonexistent/model --prompt hi -n 2");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_EQ(missing.err.rfind("moetier: error: ", 0), 0u) << missing.err;
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1) << missing.err;
  Result bad =
      run_cli("run " + quote(fixture("qwen3moe-bf16").string()) + " --prompt hi -n 2 --top-p 0");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("top-p"), std::string::npos) << bad.err;
}
