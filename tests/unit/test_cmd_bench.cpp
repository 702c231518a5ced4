// moetier bench: the moetier-bench/1 file it writes (docs/bench-format.md)
// holds what was measured and counts that must be exact; --append adds arms;
// bad flags and inputs get one line and exit status 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/workloads.h"
#include "cli_runner.h"
#include "format/tokenizer.h"

namespace fs = std::filesystem;
using moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;
using nlohmann::json;

namespace {

const std::string kTiny = std::string(MOETIER_SOURCE_DIR) + "/models/moetier-tiny";

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json");
}

int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(CmdBench, WritesTheSchemaWithExactCounts) {
  const fs::path out = scratch("moetier_bench");
  const CliResult r = run_cli(
      "bench " + kTiny + " --prompt-tokens 24 --gen 8 --runs 2 --no-probe --json " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(slurp(out));
  EXPECT_EQ(j["schema"], "moetier-bench/1");
  EXPECT_NE(j["command"].get<std::string>().find("--prompt-tokens 24"), std::string::npos);
  ASSERT_EQ(j["arms"].size(), 1u);
  const json& arm = j["arms"][0];
  EXPECT_EQ(arm["engine"], "moetier");
  const json& m = arm["model"];
  EXPECT_EQ(m["layers"], 8);
  EXPECT_EQ(m["top_k"], 8);
  ASSERT_EQ(arm["workloads"].size(), 1u);
  const json& w = arm["workloads"][0];
  EXPECT_EQ(w["prompt_tokens"], 24);
  ASSERT_EQ(w["runs"].size(), 2u);
  const uint64_t expert_bytes = m["expert_bytes"].get<uint64_t>();
  for (int i = 0; i < 2; ++i) {
    const json& run = w["runs"][i];
    EXPECT_EQ(run["cold"].get<bool>(), i == 0);
    EXPECT_GT(run["decode_tps"].get<double>(), 0);
    EXPECT_GT(run["ttft_s"].get<double>(), 0);
    // 7 decode steps x 8 MoE layers x 8 distinct experts, plus the prompt's.
    EXPECT_GE(run["expert_uses"].get<uint64_t>(), 7u * 8 * 8);
    EXPECT_EQ(run["expert_read_bytes"].get<uint64_t>(),
              run["expert_reads"].get<uint64_t>() * expert_bytes);
  }
  // The default arena holds the whole tiny model: the cold run reads, the warm one hits.
  EXPECT_GT(w["runs"][0]["expert_reads"].get<uint64_t>(), 0u);
  EXPECT_EQ(w["runs"][1]["expert_reads"], 0);
  EXPECT_DOUBLE_EQ(w["runs"][1]["hit_rate"]["all"].get<double>(), 1.0);
  // Warm runs only in the summary.
  EXPECT_DOUBLE_EQ(w["median"]["decode_tps"].get<double>(),
                   w["runs"][1]["decode_tps"].get<double>());
  EXPECT_FALSE(w.contains("bound"));  // --no-probe: no bound, no fraction
  fs::remove(out);
}

// peak_device_bytes per run: on the CPU backend alloc()'s buffers (the KV
// cache, activations; the arena is the expert store's own host memory), so at
// least the run's KV cache (8 layers x K and V x 2 heads x 64 x f32 = 8192
// bytes a position), growing with the context, and less than the run's RSS.
TEST(CmdBench, RecordsPeakDeviceMemoryPerRun) {
  const fs::path out = scratch("moetier_bench_peak");
  std::vector<uint64_t> peaks;
  for (int prompt : {24, 400}) {
    const CliResult r = run_cli("bench " + kTiny + " --prompt-tokens " + std::to_string(prompt) +
                                " --gen 8 --runs 2 --no-probe --json " + out.string());
    ASSERT_EQ(r.rc, 0) << r.err;
    const json arm = json::parse(slurp(out))["arms"][0];
    const uint64_t kv = 8192u * uint64_t(prompt + 8 + 1);
    for (const json& run : arm["workloads"][0]["runs"]) {
      ASSERT_TRUE(run.contains("peak_device_bytes")) << run;
      EXPECT_GE(run["peak_device_bytes"].get<uint64_t>(), kv);
      EXPECT_LT(run["peak_device_bytes"].get<uint64_t>(), run["peak_host_bytes"].get<uint64_t>());
    }
    peaks.push_back(arm["workloads"][0]["runs"][1]["peak_device_bytes"].get<uint64_t>());
  }
  EXPECT_GE(peaks[1] - peaks[0], 8192u * (400 - 24)) << "the longer context's KV cache";
  fs::remove(out);
}

TEST(CmdBench, ProbedBoundsGiveFractions) {
  const fs::path out = scratch("moetier_bench_probe");
  const CliResult r = run_cli(
      "bench " + kTiny + " --prompt-tokens 16 --gen 4 --runs 1 --mapped --json " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json w = json::parse(slurp(out))["arms"][0]["workloads"][0];
  for (const char* k : {"decode_tps", "prompt_tps"}) {
    const double f = w["fraction_of_bound"][k].get<double>();
    EXPECT_NEAR(f, w["median"][k].get<double>() / w["bound"][k].get<double>(), 1e-12);
    EXPECT_GT(f, 0);
  }
  fs::remove(out);
}

TEST(CmdBench, AppendAddsAnArmAndRefusesOtherFiles) {
  const fs::path out = scratch("moetier_bench_append");
  const std::string base =
      kTiny + " --prompt-tokens 8 --gen 2 --runs 1 --no-probe --json " + out.string();
  ASSERT_EQ(run_cli("bench " + base + " --name first").rc, 0);
  ASSERT_EQ(run_cli("bench " + base + " --name second --mapped --append").rc, 0);
  const json j = json::parse(slurp(out));
  ASSERT_EQ(j["arms"].size(), 2u);
  EXPECT_EQ(j["arms"][0]["name"], "first");
  EXPECT_EQ(j["arms"][1]["name"], "second");
  std::ofstream(out) << "{\"not\": \"bench\"}";
  const CliResult bad = run_cli("bench " + base + " --append");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_EQ(lines(bad.err.substr(bad.err.find("moetier: error"))), 1) << bad.err;
  EXPECT_NE(bad.err.find("not a moetier-bench/1 file"), std::string::npos) << bad.err;
  EXPECT_EQ(slurp(out), "{\"not\": \"bench\"}");  // unchanged
  fs::remove(out);
}

TEST(CmdBench, RefusesBadWorkloadsBeforeComputing) {
  CliResult r = run_cli("bench " + kTiny + " --workload code,nope --no-probe");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unknown workload 'nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("chat_long_context"), std::string::npos);
  r = run_cli("bench " + kTiny + " --workload random-8k --no-probe");  // 8172 + 256 > 512 positions
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("exceed the context 512"), std::string::npos) << r.err;
  r = run_cli("bench " + kTiny + " --prompt-tokens 8 --gen 0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--gen"), std::string::npos) << r.err;
}

TEST(CmdBench, CoherenceGateCountsFailures) {
  const fs::path out = scratch("moetier_bench_gate"), file = scratch("moetier_gate_prompts");
  // The built-in code prompts pass on the embedded model (greedy).
  CliResult r = run_cli("bench " + kTiny + " --prompt-tokens 8 --gen 2 --runs 1 --no-probe " +
                        "--coherence --json " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  json g = json::parse(slurp(out))["arms"][0]["coherence"];
  EXPECT_EQ(g["prompts"], 5);
  EXPECT_EQ(g["failures"], 0) << g.dump();
  // A file with one answer no model gives: one failure, with what it got.
  std::ofstream(file) << R"([{"prompt": "for i := 0; i < n; i", "expect": "++"},
                            {"prompt": "x", "expect": "qqqqqqqq", "max_tokens": 3}])";
  r = run_cli("bench " + kTiny + " --prompt-tokens 8 --gen 2 --runs 1 --no-probe " +
              "--coherence-file " + file.string() + " --json " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  g = json::parse(slurp(out))["arms"][0]["coherence"];
  EXPECT_EQ(g["failures"], 1);
  EXPECT_EQ(g["failed"][0]["expect"], "qqqqqqqq");
  // A malformed file is refused before anything runs.
  std::ofstream(file) << R"({"prompt": "x"})";
  r = run_cli("bench " + kTiny + " --prompt-tokens 8 --gen 2 --coherence-file " + file.string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not a non-empty JSON array"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("run 1/"), std::string::npos) << r.err;
  fs::remove(out), fs::remove(file);
}

TEST(Workloads, PromptsHaveTheirSizes) {
  const moetier::Tokenizer tok = moetier::Tokenizer::load(kTiny);
  const moetier::Workload lc = moetier::workload("chat_long_context");
  EXPECT_EQ(moetier::prompt_ids(lc, &tok, 4096, 1).size(), 8192u);
  const auto code = moetier::prompt_ids(moetier::workload("code"), &tok, 4096, 1);
  EXPECT_EQ(code, tok.encode(moetier::workload("code").text));
  const auto rnd = moetier::prompt_ids(moetier::workload("random-8k"), &tok, 100, 3);
  ASSERT_EQ(rnd.size(), 8172u);
  EXPECT_TRUE(std::all_of(rnd.begin(), rnd.end(), [](int32_t t) { return t >= 0 && t < 100; }));
  EXPECT_NE(rnd, moetier::prompt_ids(moetier::workload("random-8k"), &tok, 100, 4));
}

}  // namespace
