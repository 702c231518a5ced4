// Parameter counts, bytes and memory plans of tiny checkpoints; `moetier info`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli_runner.h"
#include "format/safetensors.h"
#include "model/info.h"
#include "qwen3_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using moetier::testutil::CliResult;
using moetier::testutil::run_cli;

namespace {
// Tiny{}: H 64, head_dim 24 (q 96, kv 48), vocab 37, 3 layers (1 dense), 5 experts of I 32.
constexpr int64_t kCore = 2 * 37 * 64 + 64  // embed, lm_head, norm
                          + 3 * (2 * 64 + 2 * 96 * 64 + 2 * 48 * 64 + 2 * 24)  // attention
                          + 2 * 5 * 64                                         // routers
                          + 3 * 48 * 64;  // dense MLP of layer 1
constexpr int64_t kPerExpert = 3 * 32 * 64;
}  // namespace

TEST(Info, CountsBf16Stacked) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  ModelInfo m = model_info(tmp / "ck");
  EXPECT_EQ(kCore, 70480);
  EXPECT_EQ(m.core_params, kCore);
  EXPECT_EQ(m.params_per_expert, kPerExpert);
  EXPECT_EQ(m.moe_layers, 2);
  EXPECT_EQ(m.total_experts, 10);
  EXPECT_EQ(m.total_params, kCore + 10 * kPerExpert);
  EXPECT_EQ(m.active_params, kCore + 2 * 2 * kPerExpert);
  EXPECT_EQ(m.core_bytes, uint64_t(2 * kCore));
  EXPECT_EQ(m.expert_bytes, uint64_t(2 * 10 * kPerExpert));
  EXPECT_EQ(m.max_expert_bytes, uint64_t(2 * kPerExpert));
  EXPECT_EQ(m.min_expert_bytes, uint64_t(2 * kPerExpert));
  ASSERT_EQ(m.expert_encodings.size(), 1u);
  EXPECT_EQ(m.expert_encodings["bf16"].experts, 10);
  EXPECT_EQ(m.kv_bytes_per_token, 3u * 2 * 2 * 24 * 2);
  EXPECT_EQ(m.tensors, int64_t(Checkpoint::open(tmp / "ck")->tensors().size()));
}

TEST(Info, CountsMxfp4PerExpert) {
  TempDir tmp;
  Tiny t;
  t.layout = Layout::Mxfp4;
  t.tie = true;
  write_tiny(tmp / "ck", t);
  ModelInfo m = model_info(tmp / "ck");
  EXPECT_EQ(m.core_params, kCore - 37 * 64);  // tied: one embedding matrix
  EXPECT_EQ(m.total_params, kCore - 37 * 64 + 10 * kPerExpert);
  uint64_t per = kPerExpert / 2 + kPerExpert / 32;  // e2m1 pairs + e8m0 scales
  EXPECT_EQ(m.max_expert_bytes, per);
  EXPECT_EQ(m.expert_bytes, 10 * per);
  EXPECT_EQ(m.expert_encodings["mxfp4"].bytes, 10 * per);
}

TEST(Info, MemoryPlan) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  ModelInfo m = model_info(tmp / "ck");
  MemoryPlan p = plan_memory(m, 300000, 100000);
  EXPECT_TRUE(p.core_fits);
  EXPECT_EQ(p.arena, 300000u - 2 * kCore - 100000);
  EXPECT_EQ(p.slot_bytes, 12288u);
  EXPECT_EQ(p.experts_fit, int64_t((300000 - 2 * kCore - 100000) / 12288));
  EXPECT_EQ(p.experts_fit, 4);
  EXPECT_DOUBLE_EQ(p.share, 0.4);
  EXPECT_FALSE(p.all_fit);
  p = plan_memory(m, 1ull << 30);  // default headroom: KV for 4096 tokens + 256 MiB
  EXPECT_EQ(p.kv_bytes, 576u * 4096);
  EXPECT_EQ(p.headroom, 576u * 4096 + (256u << 20));
  EXPECT_EQ(p.experts_fit, 10);
  EXPECT_TRUE(p.all_fit);
  p = plan_memory(m, 1000, 0, 16);
  EXPECT_FALSE(p.core_fits);
  EXPECT_EQ(p.experts_fit, 0);
  EXPECT_THAT(to_text(m, &p), ::testing::HasSubstr("the core and headroom alone exceed"));
}

TEST(InfoCli, JsonAndText) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  const std::string base = "info " + testutil::quote((tmp / "ck").string());
  CliResult r = run_cli(base + " --budget 300000 --headroom 97.65625KiB --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"]["total"], kCore + 10 * kPerExpert);
  EXPECT_EQ(j["params"]["active_per_token"], kCore + 4 * kPerExpert);
  EXPECT_EQ(j["plan"]["headroom"], 100000);
  EXPECT_EQ(j["plan"]["experts_fit"], 4);
  r = run_cli(base + " --budget 8GB");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("memory plan for a budget of 7.45 GiB"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("100.0% of 10 experts (all fit)"));
  r = run_cli(base + " --budget 8XB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err,
            "moetier: error: --budget: invalid size '8XB' (unknown unit 'xb'; e.g. 512MB, 8GiB, "
            "81GB)\n");
}
