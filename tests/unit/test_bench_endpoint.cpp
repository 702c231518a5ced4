// moetier bench --endpoint: the workloads through an OpenAI-compatible
// streaming server (tests/support/fake_openai.py streams max_tokens events and
// a usage event), the stream parser on split and malformed input, and bad
// URLs / server errors as one-line errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/endpoint.h"
#include "bench/http_client.h"
#include "cli_runner.h"
#include "core/error.h"

namespace fs = std::filesystem;
using moetier::testutil::CliResult;
using moetier::testutil::run_cli;
using moetier::testutil::slurp;
using nlohmann::json;

namespace {

// The fake server, killed at scope exit.
struct FakeServer {
  pid_t pid = -1;
  int port = 0;
  FakeServer() {
    const fs::path portfile =
        fs::temp_directory_path() / ("moetier_fake_" + std::to_string(::getpid()));
    fs::remove(portfile);
    const std::string script = std::string(MOETIER_SOURCE_DIR) + "/tests/support/fake_openai.py";
    pid = ::fork();
    if (pid == 0) {
      ::execl("/usr/bin/python3", "python3", script.c_str(), portfile.c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !fs::exists(portfile); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    if (fs::exists(portfile)) port = std::stoi(slurp(portfile));
    fs::remove(portfile);
  }
  ~FakeServer() {
    if (pid > 0) ::kill(pid, SIGTERM), ::waitpid(pid, nullptr, 0);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

TEST(BenchEndpoint, StreamsTheWorkloadsAndCountsTokens) {
  FakeServer srv;
  ASSERT_GT(srv.port, 0) << "the fake server did not start";
  const fs::path out = fs::temp_directory_path() / ("moetier_ep_" + std::to_string(::getpid()));
  const std::string tiny = std::string(MOETIER_SOURCE_DIR) + "/models/moetier-tiny";
  const CliResult r = run_cli("bench " + tiny + " --endpoint " + srv.url() +
                              " --prompt-tokens 20 --gen 12 --runs 2 --json " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const json arm = json::parse(slurp(out))["arms"][0];
  EXPECT_EQ(arm["engine"], "endpoint");
  const json& w = arm["workloads"][0];
  ASSERT_EQ(w["runs"].size(), 2u);
  for (const json& run : w["runs"]) {
    EXPECT_EQ(run["gen_tokens"], 12);     // from the usage event
    EXPECT_EQ(run["prompt_tokens"], 20);  // random ids, counted by the server
    EXPECT_GT(run["decode_tps"].get<double>(), 0);
    EXPECT_GT(run["ttft_s"].get<double>(), 0.005);  // the server's "prefill" sleep
  }
  EXPECT_TRUE(w["median"].contains("decode_tps"));
  // The gate through the endpoint (non-streamed completions: " t0 t1 ...").
  const fs::path file = out.string() + ".gate";
  std::ofstream(file) << R"([{"prompt": "a", "expect": "t2", "max_tokens": 4},
                            {"prompt": "b", "expect": "t9", "max_tokens": 4}])";
  const CliResult g = run_cli("bench --endpoint " + srv.url() +
                              " --workload chat_short --runs 1 --coherence-file " + file.string() +
                              " --json " + out.string());
  ASSERT_EQ(g.rc, 0) << g.err;
  const json gate = json::parse(slurp(out))["arms"][0]["coherence"];
  EXPECT_EQ(gate["prompts"], 2);
  EXPECT_EQ(gate["failures"], 1);
  fs::remove(out), fs::remove(file);
}

TEST(BenchEndpoint, ServerAndUrlErrorsAreOneLine) {
  FakeServer srv;
  ASSERT_GT(srv.port, 0);
  CliResult r = run_cli("bench --endpoint " + srv.url() + " --model fail --workload chat_short");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("HTTP 500"), std::string::npos) << r.err;
  r = run_cli("bench --endpoint https://example.invalid --workload chat_short");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("only http://"), std::string::npos) << r.err;
  r = run_cli("bench --endpoint http://127.0.0.1:1 --workload chat_short --timeout 5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot connect"), std::string::npos) << r.err;
  r = run_cli("bench --endpoint " + srv.url() + " --prompt-tokens 8 --gen 2");  // no DIR
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("random prompt needs token ids"), std::string::npos) << r.err;
}

TEST(SseTimer, EventsSplitAcrossReadsAndUsage) {
  moetier::SseTimer t;
  const std::string s =
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"\"}]}\n\n"
      "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
      "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
  // \r\n\r\n ends an event only through its \n\n: feed byte by byte
  for (size_t i = 0; i < s.size(); ++i) t.feed(s.substr(i, 1), double(i));
  EXPECT_TRUE(t.done());
  EXPECT_EQ(t.events(), 2);
  EXPECT_LT(t.first_s(), t.last_s());
  EXPECT_EQ(t.usage()["completion_tokens"], 2);
  moetier::SseTimer bad;
  bad.feed("data: {not json\n\n", 0);
  EXPECT_TRUE(bad.done());
  EXPECT_NE(bad.error().find("not JSON"), std::string::npos);
}

TEST(HttpClient, ParsesUrls) {
  const moetier::Url u = moetier::parse_url("http://localhost:8080/v1/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.path, "/v1");
  EXPECT_EQ(moetier::parse_url("http://h").port, 80);
  EXPECT_THROW(moetier::parse_url("http://h:99999"), moetier::Error);
  EXPECT_THROW(moetier::parse_url("http://:80"), moetier::Error);
  EXPECT_THROW(moetier::parse_url("ftp://h"), moetier::Error);
}

}  // namespace
