// check_checkpoint on valid tiny checkpoints (every expert layout) and on
// corrupted copies; the `moetier check` and `moetier info` commands.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "cli_runner.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "model/check.h"
#include "qwen3_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t nl = s.find('\n', at);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

std::string shard_of(const TempDir& tmp, const Written& w, const std::string& name) {
  return (tmp / "ck" / w.file.at(name)).string();
}

}  // namespace

TEST(Check, ValidInEveryLayoutAndForm) {
  for (Layout layout : {Layout::Stacked, Layout::PerExpert, Layout::Mxfp4}) {
    for (bool tf : {true, false}) {
      TempDir tmp;
      Tiny t;
      t.layout = layout;
      t.transformers_form = tf;
      t.shards = tf ? 2 : 1;
      write_tiny(tmp / "ck", t);
      EXPECT_THAT(check_checkpoint(tmp / "ck"), IsEmpty())
          << "layout " << int(layout) << " transformers form " << tf;
      auto ck = Checkpoint::open(tmp / "ck");
      ExpertLayout want = layout == Layout::Stacked     ? ExpertLayout::Stacked
                          : layout == Layout::PerExpert ? ExpertLayout::PerExpert
                                                        : ExpertLayout::PerExpertMxfp4;
      EXPECT_EQ(detect_expert_layout(*ck, MoeTensorNames{}, 2), want);
      EXPECT_THROW(detect_expert_layout(*ck, MoeTensorNames{}, 1),
                   Error);  // dense layer: no experts
      const ModelSpec spec = model_spec(*ck);
      ExpertTensors e = expert_tensors(*ck, spec, 2, 4);
      if (layout == Layout::Stacked) {
        EXPECT_EQ(e.gate, "model.layers.2.mlp.experts.gate_up_proj");
        EXPECT_EQ(e.index, 4);
        EXPECT_THROW(expert_tensors(*ck, spec, 2, 5), Error);
      } else {
        EXPECT_EQ(e.down, "model.layers.2.mlp.experts.4.down_proj.weight");
        EXPECT_EQ(e.up_scale,
                  layout == Layout::Mxfp4 ? "model.layers.2.mlp.experts.4.up_proj.scale" : "");
      }
    }
  }
}

TEST(Check, ValidWithBiasTiedAlignedAndSparseStep) {
  TempDir tmp;
  Tiny t;
  t.bias = true;
  t.tie = true;
  t.align = 4096;
  write_tiny(tmp / "ck", t);
  EXPECT_THAT(check_checkpoint(tmp / "ck"), IsEmpty());
  // attention_bias true in config but the biases absent: each one is named.
  Tiny nb;
  nb.omit = {"model.layers.1.self_attn.k_proj.bias"};
  nb.bias = true;
  write_tiny(tmp / "ck2", nb);
  EXPECT_THAT(check_checkpoint(tmp / "ck2"),
              ElementsAre((tmp / "ck2" / "model.safetensors.index.json").string() +
                          ": tensor 'model.layers.1.self_attn.k_proj.bias': missing (expected "
                          "shape [48])"));
}

TEST(Check, MissingRequiredTensor) {
  TempDir tmp;
  Tiny t;
  t.omit = {"model.norm.weight", "model.layers.2.mlp.gate.weight"};
  write_tiny(tmp / "ck", t);
  std::string idx = (tmp / "ck" / "model.safetensors.index.json").string();
  EXPECT_THAT(check_checkpoint(tmp / "ck"),
              ElementsAre(idx + ": tensor 'model.layers.2.mlp.gate.weight': missing (expected "
                                "shape [5, 64])",
                          idx + ": tensor 'model.norm.weight': missing (expected shape [64])"));
}

TEST(Check, WrongShapeAndDtype) {
  TempDir tmp;
  Tiny t;
  t.reshape["model.layers.0.self_attn.k_proj.weight"] = {32, 64};
  t.retype["model.layers.1.mlp.up_proj.weight"] = DType::I32;
  t.reshape["model.layers.1.mlp.up_proj.weight"] = {48, 64};
  Written w = write_tiny(tmp / "ck", t);
  EXPECT_THAT(
      check_checkpoint(tmp / "ck"),
      ElementsAre(shard_of(tmp, w, "model.layers.0.self_attn.k_proj.weight") +
                      ": tensor 'model.layers.0.self_attn.k_proj.weight': shape [32, 64], "
                      "expected [48, 64]",
                  shard_of(tmp, w, "model.layers.1.mlp.up_proj.weight") +
                      ": tensor 'model.layers.1.mlp.up_proj.weight': dtype I32, expected F32, "
                      "F16 or BF16"));
}

TEST(Check, ExpertProblems) {
  TempDir tmp;
  Tiny t;
  t.layout = Layout::PerExpert;
  t.omit = {"model.layers.0.mlp.experts.3.up_proj.weight"};
  t.reshape["model.layers.2.mlp.experts.1.down_proj.weight"] = {64, 31};
  Written w = write_tiny(tmp / "ck", t);
  std::string idx = (tmp / "ck" / "model.safetensors.index.json").string();
  std::string d = "model.layers.2.mlp.experts.1.down_proj.weight";
  EXPECT_THAT(
      check_checkpoint(tmp / "ck"),
      ElementsAre(idx + ": tensor 'model.layers.0.mlp.experts.3.up_proj.weight': "
                        "missing (expected shape [32, 64])",
                  shard_of(tmp, w, d) + ": tensor '" + d + "': shape [64, 31], expected [64, 32]"));
  // A MoE layer with no experts at all is one line, not one per expert.
  Tiny s;
  s.omit = {"model.layers.2.mlp.experts.gate_up_proj", "model.layers.2.mlp.experts.down_proj"};
  write_tiny(tmp / "ck2", s);
  EXPECT_THAT(check_checkpoint(tmp / "ck2"),
              ElementsAre((tmp / "ck2" / "model.safetensors.index.json").string() +
                          ": tensor 'model.layers.2.mlp.experts.gate_up_proj': missing (MoE "
                          "layer 2 has no expert tensors in any supported layout)"));
}

TEST(Check, Mxfp4ExpertsInWrongDtype) {
  TempDir tmp;
  Tiny t;
  t.layout = Layout::Mxfp4;
  t.retype["model.layers.0.mlp.experts.2.gate_proj.scale"] = DType::F32;
  t.reshape["model.layers.0.mlp.experts.2.gate_proj.scale"] = {32, 2};
  t.retype["model.layers.0.mlp.experts.2.gate_proj.scale"] = DType::F32;
  Written w = write_tiny(tmp / "ck", t);
  std::string n = "model.layers.0.mlp.experts.2.gate_proj.scale";
  EXPECT_THAT(check_checkpoint(tmp / "ck"),
              ElementsAre(shard_of(tmp, w, n) + ": tensor '" + n +
                          "': dtype F32, expected F8_E8M0 or U8 (MXFP4 scales)"));
}

TEST(Check, ShardProblemsAreCollectedWithTensorProblems) {
  TempDir tmp;
  Tiny t;
  t.omit = {"model.norm.weight"};
  write_tiny(tmp / "ck", t);
  fs::path idx = tmp / "ck" / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(read_file(idx));
  j["metadata"]["total_size"] = 5;
  write_file(idx, j.dump());
  auto p = check_checkpoint(tmp / "ck");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_THAT(p[0], ::testing::HasSubstr("field 'metadata.total_size': 5 does not match"));
  EXPECT_THAT(p[1], ::testing::HasSubstr("tensor 'model.norm.weight': missing"));
}

TEST(Check, TruncatedShard) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  fs::path f = tmp / "ck" / "model-00002-of-00002.safetensors";
  auto rs = sorted_ranges(read_raw(f).header);
  std::string raw = read_file(f);
  write_file(f, raw.substr(0, raw.size() - 7));
  EXPECT_THAT(check_checkpoint(tmp / "ck"),
              Contains(fmt::format("{}: tensor '{}': data_offsets [{}, {}] run past the end of "
                                   "the file (data section is {} bytes)",
                                   f.string(), rs.back().name, rs.back().begin, rs.back().end,
                                   rs.back().end - 7)));
}

TEST(Check, ConfigProblems) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  fs::path cfg = tmp / "ck" / "config.json";
  auto good = nlohmann::json::parse(read_file(cfg));

  write_file(cfg, "{\"model_type\": \"qwen3_moe\",\n \"vocab_size\": 37,,\n}");
  auto p = check_checkpoint(tmp / "ck");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(p[0], ::testing::StartsWith(cfg.string() +
                                          ": invalid JSON: parse error at line 2, column 19:"));

  auto j = good;
  j["model_type"] = "llama";
  j["architectures"] = {"LlamaForCausalLM"};
  write_file(cfg, j.dump());
  EXPECT_THAT(
      check_checkpoint(tmp / "ck"),
      ElementsAre(cfg.string() + ": architecture 'llama' is not supported (supported: qwen3_moe)"));

  j = good;
  j["use_sliding_window"] = true;
  j["hidden_act"] = "gelu";
  write_file(cfg, j.dump());
  EXPECT_THAT(check_checkpoint(tmp / "ck"),
              ElementsAre(cfg.string() + ": field 'use_sliding_window': sliding-window "
                                         "attention is not supported",
                          cfg.string() + ": field 'hidden_act': 'gelu' is not supported (only "
                                         "'silu')"));

  j = good;
  j["hidden_size"] = 48;  // every shape now disagrees; the config itself is fine
  write_file(cfg, j.dump());
  p = check_checkpoint(tmp / "ck");
  EXPECT_GT(p.size(), 20u);
  EXPECT_THAT(
      p, Contains(::testing::HasSubstr("tensor 'model.norm.weight': shape [64], expected [48]")));
}

TEST(Check, ExtraExpertsAndLayersAreReported) {
  TempDir tmp;
  Tiny t;
  t.layout = Layout::PerExpert;
  write_tiny(tmp / "ck", t);
  fs::path cfg = tmp / "ck" / "config.json";
  auto j = nlohmann::json::parse(read_file(cfg));
  j["num_local_experts"] = 4;
  j["num_hidden_layers"] = 2;
  write_file(cfg, j.dump());
  auto p = check_checkpoint(tmp / "ck");
  EXPECT_THAT(p, Contains(::testing::HasSubstr(
                     "tensor 'model.layers.0.mlp.experts.4.gate_proj.weight': expert 4 out of "
                     "range (num_experts 4)")));
  EXPECT_THAT(p, Contains(::testing::HasSubstr(
                     "tensor 'model.layers.2.input_layernorm.weight': layer 2 does not exist "
                     "(the config gives 2 layers)")));
  EXPECT_THAT(p, Contains(::testing::HasSubstr(
                     "tensor 'model.layers.0.mlp.gate.weight': shape [5, 64], expected [4, 64]")));
}

// --- The CLI ---

TEST(CheckCli, OkLine) {
  TempDir tmp;
  Written w = write_tiny(tmp / "ck", Tiny{});
  uint64_t bytes = 0;
  for (const auto& [n, b] : w.data) bytes += b.size();
  CliResult r = run_cli("check '" + (tmp / "ck").string() + "'");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("ok: {} ({} tensors in 2 shards, {} bytes)\n", (tmp / "ck").string(),
                               w.data.size(), bytes));
  EXPECT_EQ(r.err, "");
}

TEST(CheckCli, ProblemsOnStderrAndNonZeroExit) {
  TempDir tmp;
  Written w = write_tiny(tmp / "ck", Tiny{});
  fs::path cfg = tmp / "ck" / "config.json";
  auto j = nlohmann::json::parse(read_file(cfg));
  j["model_type"] = "mixtral";
  write_file(cfg, j.dump());
  fs::remove(tmp / "ck" / "model-00001-of-00002.safetensors");
  CliResult r = run_cli("check '" + (tmp / "ck").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  size_t n = 0;
  for (const auto& [name, f] : w.file) n += f == "model-00001-of-00002.safetensors";
  EXPECT_THAT(
      lines(r.err),
      ElementsAre(fmt::format("{}: shard named by model.safetensors.index.json does not exist ({} "
                              "tensors map to it)",
                              (tmp / "ck" / "model-00001-of-00002.safetensors").string(), n),
                  cfg.string() + ": architecture 'mixtral' is not supported (supported: qwen3_moe)",
                  "moetier: error: " + (tmp / "ck").string() + ": 2 problems found"));
}

TEST(CheckCli, GarbageShardNeverCrashes) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  fs::path f = tmp / "ck" / "model-00002-of-00002.safetensors";
  write_file(f, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f garbage", 16));
  CliResult r = run_cli("check '" + (tmp / "ck").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(lines(r.err),
              Contains(f.string() + ": header length 9223372036854775807 is larger than the "
                                    "file (8 bytes after the 8-byte length)"));
  r = run_cli("info '" + (tmp / "ck").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, ::testing::StartsWith("moetier: error: " + f.string() + ": header length"));
}

// --- Golden fixtures made by transformers (scripts/), when present ---

TEST(Check, GoldenFixturesHaveNoProblems) {
  fs::path root = fs::path(MOETIER_SOURCE_DIR) / "tests" / "data" / "fixtures";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) GTEST_SKIP() << "no " << root;
  int n = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory() || !fs::exists(e.path() / "config.json")) continue;
    ++n;
    EXPECT_THAT(check_checkpoint(e.path()), IsEmpty()) << e.path();
  }
  if (n == 0) GTEST_SKIP() << "no fixture with config.json under " << root;
}
