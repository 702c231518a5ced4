// moetier report (src/report, tools/cmd_report.cpp): a page from the committed
// fixture (tests/data/bench/moetier-fixture.json) holds every arm and workload
// value, requests nothing from the network, embeds its data safely, and bad
// inputs fail with one line naming the file and field; where node exists the
// page's script runs against a minimal DOM (tests/support/report_dom.js).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_runner.h"
#include "core/error.h"
#include "report/report.h"

namespace moetier::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testutil::quote;
using testutil::run_cli;
using testutil::slurp;

const std::string kFixture =
    std::string(MOETIER_SOURCE_DIR) + "/tests/data/bench/moetier-fixture.json";
const std::string kLlama =
    std::string(MOETIER_SOURCE_DIR) + "/bench/results/peers-llama.cpp-bench-moetier-tiny.json";
const std::string kStudy =
    std::string(MOETIER_SOURCE_DIR) + "/bench/results/study-miniature-simulate.json";

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("moetier_report_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

json fixture() { return json::parse(slurp(kFixture)); }

// The message validate_result throws for DOC, or "" when it passes.
std::string problem(const json& doc) {
  try {
    validate_result(doc, "r.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Report, ThePageHoldsEveryArmAndWorkloadValue) {
  const json doc = fixture();
  const std::string page = render_report({load_result(kFixture)});
  // The memory table: the most peak_device_bytes of the runs (15712345 of code's three).
  EXPECT_NE(page.find("<td class=num title=\"" + format_number(15712345) + " B\">"),
            std::string::npos);
  for (const auto& arm : doc["arms"]) {
    EXPECT_NE(page.find("<td>" + arm["name"].get<std::string>() + "</td>"), std::string::npos)
        << arm["name"];
    for (const auto& w : arm["workloads"]) {
      EXPECT_NE(page.find("<td>" + w["name"].get<std::string>() + "</td>"), std::string::npos);
      for (const char* k : {"decode_tps", "prompt_tps", "ttft_s"}) {
        const std::string v = format_number(w["median"][k].get<double>());
        EXPECT_NE(page.find(">" + v), std::string::npos) << w["name"] << " " << k << " " << v;
      }
      const std::string frac =
          format_number(w["fraction_of_bound"]["decode_tps"].get<double>() * 100);
      EXPECT_NE(page.find(frac + "%"), std::string::npos) << frac;
      for (const auto& r : w["runs"]) {
        EXPECT_NE(page.find(format_number(r["expert_read_bytes"].get<double>()) + " B"),
                  std::string::npos);
      }
    }
  }
  for (const auto& c : doc["simulate"]) {
    EXPECT_NE(page.find("<td>" + c["policy"].get<std::string>() + "</td>"), std::string::npos);
  }
  EXPECT_NE(page.find("<td>random-8k</td>"), std::string::npos);  // the phase table
  EXPECT_NE(page.find("hw_thermal (1)"), std::string::npos);
  EXPECT_NE(page.find("sw_power_cap ("), std::string::npos);
}

TEST(Report, ThePageMakesNoNetworkRequest) {
  const std::string page = render_report({load_result(kFixture), load_result(kLlama)});
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  for (const char* bad : {" src=", "<link", "@import", "url(", "fetch(", "XMLHttpRequest",
                          "import(", "<iframe", "<img", "sendBeacon", "WebSocket"})
    EXPECT_EQ(page.find(bad), std::string::npos) << bad;
  EXPECT_NE(page.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
}

TEST(Report, EmbeddedDataRoundTripsAndCannotCloseTheScript) {
  json doc = fixture();
  doc["arms"][0]["name"] = "evil </script><script>alert(1)</script> & \"q\"";
  const std::string page = render_report({{"x.json", doc}});
  EXPECT_EQ(page.find("</script><script>alert"), std::string::npos);
  EXPECT_NE(page.find("<td>evil &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; "
                      "&quot;q&quot;</td>"),
            std::string::npos);
  const std::regex re("<script type=\"application/json\" id=\"moetier-data\">([^<]*)</script>");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(page, m, re));
  const json back = json::parse(m[1].str());
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0]["doc"], doc);
}

TEST(Report, ArmNamesRepeatedAcrossFilesAreMadeUnique) {
  const std::string page = render_report({{"a/one.json", fixture()}, {"b/two.json", fixture()}});
  EXPECT_NE(page.find("<td>moetier cpu arena 50% [one.json]</td>"), std::string::npos);
  EXPECT_NE(page.find("<td>moetier cpu arena 50% [two.json]</td>"), std::string::npos);
}

TEST(Report, ASimulateStudyBecomesCurvesWithMin) {
  const ResultFile f = load_result(kStudy);
  const json& sim = f.doc["simulate"];
  bool min = false, ring = false;
  for (const auto& c : sim) {
    min |= c["policy"] == "min";
    ring |= c["policy"] == "lru+ring";
    ASSERT_EQ(c["budget_bytes"].size(), c["hit_rate"].size());
  }
  EXPECT_TRUE(min);
  EXPECT_TRUE(ring);
  const json study = json::parse(slurp(kStudy));
  EXPECT_EQ(sim[0]["budget_experts"][0], study["budgets"][0]["experts"]);
  EXPECT_EQ(sim[0]["budget_bytes"][0], study["budgets"][0]["bytes"]["mxfp4"]);
  EXPECT_EQ(sim[0]["hit_rate"][0], study["budgets"][0]["results"][0]["hit_rate"]);
  EXPECT_TRUE(sim[0].contains("all_k_share"));
  json partial = study;
  partial["budgets"][1]["results"][0].erase("all_k_share");
  const json curves = simulate_curves(partial, "p.json");
  EXPECT_FALSE(curves[0].contains("all_k_share")) << "not measured everywhere: left out";
  EXPECT_TRUE(curves[1].contains("all_k_share"));
  partial["budgets"][2]["results"][1].erase("hit_rate");
  EXPECT_THROW(
      {
        try {
          simulate_curves(partial, "p.json");
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "p.json: budgets[2].results[1].hit_rate: expected a number");
          throw;
        }
      },
      Error);
}

TEST(ReportValidate, NamesTheFileAndTheField) {
  EXPECT_EQ(problem(fixture()), "");
  json d = fixture();
  d.erase("schema");
  EXPECT_EQ(problem(d), "r.json: schema: missing");
  d = fixture();
  d["schema"] = "moetier-bench/9";
  EXPECT_EQ(problem(d), "r.json: schema: expected \"moetier-bench/1\", got \"moetier-bench/9\"");
  EXPECT_EQ(problem(json::array()), "r.json: (top level): expected an object, got an array");
  d = fixture();
  d["arms"][1].erase("name");
  EXPECT_EQ(problem(d), "r.json: arms[1].name: missing");
  d = fixture();
  d["arms"][0]["workloads"][1]["median"]["decode_tps"] = "fast";
  EXPECT_EQ(problem(d),
            "r.json: arms[0].workloads[1].median.decode_tps: expected a number, got a string");
  d = fixture();
  d["arms"][0]["workloads"][0]["runs"][2]["cold"] = 1;
  EXPECT_EQ(problem(d),
            "r.json: arms[0].workloads[0].runs[2].cold: expected a boolean, got a number");
  d = fixture();
  d["arms"][0]["memory"]["arena_bytes"] = nullptr;
  EXPECT_EQ(problem(d), "r.json: arms[0].memory.arena_bytes: expected a number, got null");
  d = fixture();
  d["monitor"][3].erase("phase");
  EXPECT_EQ(problem(d), "r.json: monitor[3].phase: missing");
  d = fixture();
  d["monitor"][0]["throttle"] = json::array({4});
  EXPECT_EQ(problem(d), "r.json: monitor[0].throttle[0]: expected a string, got a number");
  d = fixture();
  d["simulate"][2]["hit_rate"].push_back(0.99);
  EXPECT_EQ(problem(d), "r.json: simulate[2].hit_rate: has 5 values, budget_experts has 4");
  d = fixture();
  d["arms"] = json::object();
  EXPECT_EQ(problem(d), "r.json: arms: expected an array, got an object");
}

TEST(ReportCli, WritesThePageAndFailsCleanlyOnBadInput) {
  TempDir t;
  const std::string out = (t.path / "report.html").string();
  auto r = run_cli("report " + quote(kFixture) + " " + quote(kLlama) + " " + quote(kStudy) +
                   " -o " + quote(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string page = slurp(out);
  EXPECT_NE(page.find("llama.cpp cpu t2"), std::string::npos);
  EXPECT_NE(page.find("moetier cpu all resident"), std::string::npos);
  EXPECT_NE(page.find("</html>"), std::string::npos);

  json missing = fixture();
  missing["arms"][0]["workloads"][2].erase("name");
  const std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"not-json", {t.write("bad.json", "{\"schema\": "), "bad.json: not JSON (parse error"}},
      {"schema",
       {t.write("s.json", "{\"schema\": \"x\", \"arms\": []}"),
        "s.json: schema: expected \"moetier-bench/1\""}},
      {"field", {t.write("m.json", missing.dump()), "m.json: arms[0].workloads[2].name: missing"}},
      {"absent", {(t.path / "none.json").string(), "none.json: cannot open"}},
  };
  std::ofstream(out) << "before";
  for (const auto& [what, c] : cases) {
    r = run_cli("report " + quote(kFixture) + " " + quote(c.first) + " -o " + quote(out));
    EXPECT_EQ(r.rc, 1) << what;
    EXPECT_EQ(r.signal, 0) << what;
    EXPECT_NE(r.err.find(c.second), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
    EXPECT_EQ(slurp(out), "before") << what << ": the old page stays";
  }
  r = run_cli("report " + quote(kFixture));
  EXPECT_NE(r.rc, 0);
}

// The script itself, where node exists (scripts/deps.sh --with-npm brings it).
TEST(ReportScript, RunsAndDrawsEveryChartInNode) {
  if (std::system("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "no node";
  TempDir t;
  const std::string page =
      t.write("page.html",
              render_report({load_result(kFixture), load_result(kLlama), load_result(kStudy)}));
  const std::string cmd = "node " +
                          quote(std::string(MOETIER_SOURCE_DIR) + "/tests/support/report_dom.js") +
                          " " + quote(page) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const json f = json::parse(out);
  for (const auto& [id, n] : f["charts"].items()) EXPECT_GE(n.get<int>(), 1) << id;
  EXPECT_GE(f["charts"]["monitor-charts"].get<int>(), 5);  // temperature, power, clock, memory...
  EXPECT_GT(f["tips"].get<int>(), 20);
  bool decode = false;
  for (const auto& tip : f["decodeTips"])
    decode |= tip.get<std::string>().find("decode_tps: 508.65 tok/s") != std::string::npos;
  EXPECT_TRUE(decode) << f["decodeTips"];
  EXPECT_NE(f["peakTip"].get<std::string>().find("peak device memory: 15712345 B"),
            std::string::npos)
      << f["peakTip"];
  EXPECT_NE(f["simulateTip"].get<std::string>().find(" B ("), std::string::npos);
  EXPECT_NE(f["simulateTip"].get<std::string>().find("min (optimal)"), std::string::npos);
  EXPECT_NE(f["monitorTip"].get<std::string>().find("t = "), std::string::npos);
  EXPECT_GE(f["clicks"].get<int>(), 5);  // all + four phases
  EXPECT_EQ(f["hoverTip"], "x\ny");
  EXPECT_EQ(f["ready"], "1");
}

}  // namespace
}  // namespace moetier::report

namespace moetier::report {
namespace {

// scripts/peers/llama_bench_to_moetier.py on the committed llama-bench output: a
// valid moetier-bench/1 file whose workloads take the moetier fixture's names.
TEST(ReportPeer, LlamaBenchConvertsToTheSchema) {
  TempDir t;
  const std::string src = MOETIER_SOURCE_DIR;
  const std::string raw = src + "/bench/results/peers-llama.cpp-bench-moetier-tiny.raw.json";
  const std::string out = (t.path / "llama.json").string();
  const std::string version =
      t.write("llama.cpp.version", "commit=de3ff815ea7d559ee917f063901b8986f038abc6\n");
  const std::string conv =
      "/usr/bin/python3 " + quote(src + "/scripts/peers/llama_bench_to_moetier.py");
  ASSERT_EQ(std::system((conv + " " + quote(raw) + " -o " + quote(out) + " --like " +
                         quote(kFixture) + " --version-file " + quote(version) + " 2>/dev/null")
                            .c_str()),
            0);
  const ResultFile f = load_result(out);
  const json& arm = f.doc["arms"][0];
  EXPECT_EQ(arm["engine"], "llama.cpp");
  EXPECT_EQ(arm["version"], "de3ff815ea7d559ee917f063901b8986f038abc6");
  EXPECT_NE(arm["flags"].get<std::string>().find("-t 2"), std::string::npos);
  const json r = json::parse(slurp(raw));
  ASSERT_EQ(arm["workloads"].size(), 2u);  // code and prose; random-8k was not run
  EXPECT_EQ(arm["workloads"][0]["name"], "code");
  EXPECT_EQ(arm["workloads"][0]["prompt_tokens"], 412);
  std::vector<double> s = r[0]["samples_ts"].get<std::vector<double>>();
  std::sort(s.begin(), s.end());
  EXPECT_EQ(arm["workloads"][0]["median"]["prompt_tps"].get<double>(), s[1]);
  EXPECT_EQ(arm["workloads"][0]["runs"].size(), s.size());
  EXPECT_FALSE(arm["workloads"][0]["runs"][0]["cold"].get<bool>());

  const std::string bad = t.write("bad.json", "{\"not\": \"a list\"}");
  EXPECT_NE(std::system((conv + " " + quote(bad) + " -o " + quote(out) + " 2>/dev/null").c_str()),
            0);
  EXPECT_EQ(load_result(out).doc["arms"][0]["engine"], "llama.cpp") << "the old output stays";
}

}  // namespace
}  // namespace moetier::report
