// `moetier run DIR --arena-experts K --transient M --stats` on every fixture:
// same text as all-resident (--mapped), counters printed and exported as JSON
// with their identities; MOETIER_FAULT makes a run fail with one clean line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.h"

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

using Result = moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;

fs::path scratch() {
  static int n = 0;
  fs::path d = fs::temp_directory_path() /
               ("moetier_expert_cli_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  fs::create_directories(d);
  return d;
}

std::string fixture(const char* name) {
  return (fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name).string();
}

const char* kFixtures[] = {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"};

}  // namespace

TEST(ExpertCli, ArenaRunMatchesMappedAndReportsCounters) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const std::string base = "run "s + fixture(name) + " -p 'The quick brown fox' -n 12 --temp 0";
    Result ref = run_cli(base + " --mapped");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    fs::path dir = scratch();
    fs::path json = dir / "stats.json";
    Result r =
        run_cli(base + " --arena-experts 3 --transient 2 --stats --stats-json " + json.string());
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, ref.out);
    EXPECT_NE(r.err.find("moetier: experts: arena 3 hot + 2 transient slots"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("all-k-hit steps"), std::string::npos) << r.err;
    auto j = nlohmann::json::parse(slurp(json));
    const auto& t = j["total"];
    uint64_t uses = t["uses"], misses = t["misses"];
    uint64_t hits = t["hits"]["hot"].get<uint64_t>() + t["hits"]["transient"].get<uint64_t>() +
                    t["hits"]["host"].get<uint64_t>();
    EXPECT_EQ(hits + misses, uses);
    EXPECT_GT(misses, 0u);
    EXPECT_EQ(t["reads"]["bytes"].get<uint64_t>(),
              misses * j["config"]["expert_bytes"].get<uint64_t>());
    EXPECT_EQ(j["config"]["hot_slots"], 3);
    EXPECT_GT(t["steps"].get<uint64_t>(), 0u);
    EXPECT_FALSE(j["layers"].empty());
    fs::remove_all(dir);
  }
}

TEST(ExpertCli, DefaultsComeFromFreeMemoryAndArePrinted) {
  Result r = run_cli("run "s + fixture("qwen3moe-bf16") + " -p hi -n 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("default: half of MemAvailable"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("capped at the model's 32 experts"), std::string::npos) << r.err;
}

TEST(ExpertCli, OtherSizingFlags) {
  const std::string base = "run "s + fixture("qwen3moe-mxfp4") + " -p hi -n 3";
  Result ref = run_cli(base + " --mapped");
  for (const char* flags :
       {"--arena 25%", "--arena 100KiB --transient 0 --policy lfu",
        "--arena-experts 5 --host-cache 64KiB --io pool", "--arena 10% --no-direct",
        "--arena-experts 12 --prefetch next-layer"}) {
    Result r = run_cli(base + " " + flags);
    EXPECT_EQ(r.rc, 0) << flags << ": " << r.err;
    EXPECT_EQ(r.out, ref.out) << flags;
  }
  Result bad = run_cli(base + " --arena 12");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--arena: 12 holds no expert"), std::string::npos) << bad.err;
  Result both = run_cli(base + " --arena 1GiB --arena-experts 4");
  EXPECT_EQ(both.rc, 1);
  Result pf = run_cli(base + " --arena 25% --prefetch sometimes");
  EXPECT_NE(pf.rc, 0);
  EXPECT_NE(pf.err.find("--prefetch"), std::string::npos) << pf.err;
  Result pinned = run_cli(base + " --arena-experts 8 --policy pinned");
  EXPECT_EQ(pinned.rc, 1);
  EXPECT_NE(pinned.err.find("--ranking"), std::string::npos) << pinned.err;
}

TEST(ExpertCli, PinnedPolicyWithARankingFile) {
  fs::path dir = scratch();
  std::ofstream(dir / "rank.txt") << "# layer expert\n0 3\n1 3\n0 7\n1 0\n";
  const std::string base = "run "s + fixture("qwen3moe-mxfp4") + " -p 'a b c' -n 4 --temp 0";
  Result ref = run_cli(base + " --mapped");
  Result r = run_cli(base + " --arena-experts 12 --policy pinned --ranking " +
                     (dir / "rank.txt").string() + " --stats");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, ref.out);
  EXPECT_NE(r.err.find("4 pinned"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(ExpertCli, InjectedFaultExitsWithOneLine) {
  for (const char* spec : {"eio", "short", "truncate:size=4096", "corrupt:count=0"}) {
    Result r = run_cli("run "s + fixture("qwen3moe-bf16") + " -p hello -n 4 --arena-experts 4",
                       "MOETIER_FAULT="s + spec);
    EXPECT_EQ(r.rc, 1) << spec;
    auto pos = r.err.find("moetier: error: ");
    ASSERT_NE(pos, std::string::npos) << spec << ": " << r.err;
    std::string line = r.err.substr(pos);
    EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
    EXPECT_NE(line.find("model.safetensors"), std::string::npos) << line;
    EXPECT_NE(line.find("layer "), std::string::npos) << line;
  }
  Result bad =
      run_cli("run "s + fixture("qwen3moe-bf16") + " -p hello -n 1", "MOETIER_FAULT=explode");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("unknown kind 'explode'"), std::string::npos) << bad.err;
}

TEST(ExpertCli, RefusedDirectIsReportedAndCounted) {
  fs::path dir = scratch();
  Result r =
      run_cli("run "s + fixture("qwen3moe-sharded") +
                  " -p hello -n 4 --arena-experts 4 --stats-json " + (dir / "s.json").string(),
              "MOETIER_FAULT=refuse-direct:count=0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("moetier: note: "), std::string::npos) << r.err;
  auto j = nlohmann::json::parse(slurp(dir / "s.json"));
  EXPECT_EQ(j["io"]["fallback_files"], 3);
  EXPECT_GT(j["io"]["buffered_reads"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["io"]["direct_reads"], 0);
  fs::remove_all(dir);
}
