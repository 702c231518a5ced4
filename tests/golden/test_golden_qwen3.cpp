// Golden tests: the CPU engine against transformers 5.17 on the fixtures in
// tests/data/fixtures/<name>/ (made by scripts/gen_fixtures.py; see that file
// for the layout). For every fixture and prompt:
//   - logits at ALL prompt positions: max |engine - ref| / max |ref| <= 1e-4.
//     Both sides compute in f32 from the same stored (bf16 / MXFP4) weights;
//     only the summation order differs (ours: blocked/vectorized dots, torch's
//     GEMM), which moves logits by ~1e-6 relative. 1e-4 leaves margin for that
//     and still catches a wrong op (a missing norm, bias or rope moves them by
//     > 1e-2).
//   - the greedy continuation tokens exactly (the fixture generator picked
//     seeds whose top-1 and router top-k gaps clear f32 rounding).
//   - tokenizer.encode(prompt) == the stored input_ids (the forward pass itself
//     runs the stored ids, so it does not depend on the tokenizer).
// No fixture dirs is a failure, not a skip: fixtures are committed with the tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "runtime/generate.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "golden/golden_fixture.h"
#include "unit/numeric.h"

using namespace moetier::testing;

using namespace moetier;
namespace fs = std::filesystem;

namespace {

constexpr double kLogitTolerance = 1e-4;

}  // namespace

TEST(GoldenQwen3, FixturesArePresent) {
  auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty()) << "no fixture directories under " << fixtures_root()
                             << " (run scripts/gen_fixtures.py; fixtures are committed)";
  std::vector<std::string> names;
  for (const auto& d : dirs) names.push_back(d.filename().string());
  for (const char* want : {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST(GoldenQwen3, PromptLogitsAndGreedyContinuation) {
  auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    Fixture fx(dir);
    const std::unique_ptr<Model> model_owned = load_model(*fx.ck);
  const Model& model = *model_owned;
    MappedExperts experts(*fx.ck, model.spec());
    const int64_t vocab = model.spec().vocab_size;
    const size_t n_gen = fx.meta.at("n_generate").get<size_t>();
    ASSERT_GT(fx.prompts(), 0u);
    for (size_t i = 0; i < fx.prompts(); ++i) {
      SCOPED_TRACE("prompt " + std::to_string(i));
      const auto ids = as_ids(fx.get(i, "input_ids"));
      const auto ref_logits = as_f32(fx.get(i, "logits"));
      const auto greedy = as_ids(fx.get(i, "greedy"));
      ASSERT_EQ(ref_logits.size(), ids.size() * size_t(vocab));
      ASSERT_EQ(greedy.size(), n_gen);

      auto kv = model.new_state(int64_t(ids.size() + n_gen));
      ForwardOptions all;
      all.all_logits = true;
      auto logits = model.forward(ids, 0, *kv, experts, all);  // [T, vocab]
      const double d = max_rel_diff(logits, ref_logits);
      EXPECT_LE(d, kLogitTolerance);
      std::printf("[golden] %s prompt %zu: %zu positions, max|diff|/max|ref| = %.3g\n",
                  dir.filename().c_str(), i, ids.size(), d);

      // Greedy continuation through the KV cache (no eos stop, as the reference).
      std::vector<float> last(logits.end() - vocab, logits.end());
      std::vector<int32_t> got;
      for (size_t s = 0; s < n_gen; ++s) {
        got.push_back(argmax(last));
        if (s + 1 < n_gen) {
          const int32_t tok[1] = {got.back()};
          last = model.forward(tok, int64_t(ids.size() + s), *kv, experts);
        }
      }
      EXPECT_EQ(got, greedy);

      // The generation loop gives the same tokens.
      GenerateOptions go;
      go.max_new_tokens = int64_t(n_gen);
      EXPECT_EQ(generate(model, experts, ids, go).tokens, greedy);
    }
  }
}

TEST(GoldenQwen3, TokenizerEncodesPromptsToStoredIds) {
  auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    Fixture fx(dir);
    Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
    for (size_t i = 0; i < fx.prompts(); ++i) {
      const std::string prompt = fx.meta.at("prompts")[i].get<std::string>();
      EXPECT_EQ(tok.encode(prompt), as_ids(fx.get(i, "input_ids"))) << "prompt " << i;
    }
  }
}
