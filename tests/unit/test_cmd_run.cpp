// `moetier run` end to end on the committed fixtures: the streamed text is the
// decode of what the library generates, the figures line is printed, sampling
// is reproducible by seed and follows generation_config.json over llama.cpp's
// defaults (flags over both), and errors exit 1 with one line.
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
#include "runtime/generation_config.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

using Result = moetier::testutil::CliResult;
using moetier::testutil::quote;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

// What the library generates from `dir` (every expert mapped) after `prompt`.
GenerateStats library_generate(const fs::path& dir, const std::string& prompt,
                               const GenerateOptions& go) {
  Tokenizer tok = Tokenizer::load(dir);
  auto ck = Checkpoint::open(dir);
  auto model = load_model(*ck);
  MappedExperts ex(*ck, model->spec());
  return generate(*model, ex, tok.encode(prompt), go);
}

}  // namespace

TEST(CmdRun, StreamsTheGreedyContinuation) {
  const fs::path dir = fixture("qwen3moe-sharded");
  const std::string prompt = "The quick brown fox jumps over the lazy dog, and";
  Result r = run_cli("run " + quote(dir.string()) + " --prompt " + quote(prompt) +
                     " -n 9 --threads 2 --temp 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: sampling: greedy (temperature 0: --temp)\n"), std::string::npos)
      << r.err;

  Tokenizer tok = Tokenizer::load(dir);
  GenerateOptions go;
  go.max_new_tokens = 9;
  go.eos = {0};  // config.json eos_token_id
  auto st = library_generate(dir, prompt, go);
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
  Result m = run_cli("run " + quote(dir.string()) + " --prompt " + quote(prompt) +
                     " -n 9 --mapped --temp 0");
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

namespace {

// The text the library generates from the sharded fixture with `sampling`
// (eos off), as `moetier run --ignore-eos` streams it.
std::string library_text(const fs::path& dir, const std::string& prompt, int64_t n,
                         const SamplerConfig& sampling) {
  GenerateOptions go;
  go.max_new_tokens = n;
  go.sampling = sampling;
  return Tokenizer::load(dir).decode(library_generate(dir, prompt, go).tokens) + "\n";
}

struct CopiedFixture {
  fs::path dir;
  explicit CopiedFixture(const char* name) {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("moetier_cmd_run_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::copy(fixture(name), dir, fs::copy_options::recursive);
  }
  ~CopiedFixture() { fs::remove_all(dir); }
};

}  // namespace

TEST(CmdRun, SamplesWithLlamaCppDefaultsOrTheCheckpointsGenerationConfig) {
  CopiedFixture f("qwen3moe-sharded");
  const std::string prompt = "The quick brown fox";
  const std::string base =
      "run " + quote(f.dir.string()) + " -p " + quote(prompt) + " -n 12 --ignore-eos --mapped";
  // No generation_config.json: llama.cpp's defaults.
  Result r = run_cli(base);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: sampling: temperature 0.8 (llama.cpp default), top-k 40 "
                       "(llama.cpp default), top-p 0.95 (llama.cpp default), min-p 0.05 "
                       "(llama.cpp default), seed 0\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, library_text(f.dir, prompt, 12, llama_cpp_sampling()));

  // The checkpoint's fields replace the defaults they give; flags replace both.
  std::ofstream(f.dir / "generation_config.json")
      << R"({"do_sample": true, "temperature": 1.3, "top_k": 0, "top_p": 0.9, "min_p": null})";
  r = run_cli(base + " --seed 5");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: sampling: temperature 1.3 (generation_config.json), top-k 0 "
                       "(generation_config.json), top-p 0.9 (generation_config.json), min-p "
                       "0.05 (llama.cpp default), seed 5\n"),
            std::string::npos)
      << r.err;
  SamplerConfig want{1.3f, 0, 0.9f, 5, 0.05f};
  EXPECT_EQ(r.out, library_text(f.dir, prompt, 12, want));
  r = run_cli(base + " --seed 5 --top-k 7 --min-p 0.2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("top-k 7 (--top-k), top-p 0.9 (generation_config.json), min-p 0.2 "
                       "(--min-p), seed 5\n"),
            std::string::npos)
      << r.err;
  want.top_k = 7;
  want.min_p = 0.2f;
  EXPECT_EQ(r.out, library_text(f.dir, prompt, 12, want));

  // do_sample false is greedy, unless --temp says otherwise.
  std::ofstream(f.dir / "generation_config.json") << R"({"do_sample": false, "temperature": 0.6})";
  r = run_cli(base);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: sampling: greedy (temperature 0: do_sample false in "
                       "generation_config.json)\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, library_text(f.dir, prompt, 12, SamplerConfig{}));
  r = run_cli(base + " --temp 0.7");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: sampling: temperature 0.7 (--temp), top-k 40 (llama.cpp "
                       "default)"),
            std::string::npos)
      << r.err;

  // A field of the wrong type or range: one line naming the file and the field.
  std::ofstream(f.dir / "generation_config.json") << R"({"top_p": 1.5})";
  r = run_cli(base);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "moetier: error: " + (f.dir / "generation_config.json").string() +
                       ": field 'top_p': 1.5 is outside (0, 1]\n");
  std::ofstream(f.dir / "generation_config.json") << R"({"temperature": "hot"})";
  r = run_cli(base);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "moetier: error: " + (f.dir / "generation_config.json").string() +
                       ": field 'temperature': is a string, expected a number\n");
  fs::remove(f.dir / "generation_config.json");
  r = run_cli(base + " --min-p 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("min-p 2 must be in [0, 1]"), std::string::npos) << r.err;
}
