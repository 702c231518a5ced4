// The page: head (CSP, inline CSS), one section per view with its chart
// container and exact-value table, the results as inline JSON, the inline
// script (assets/report.js) that draws the charts as SVG.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "report/assets.h"
#include "report/html.h"

namespace moetier::report {

std::string format_number(double v) {
  if (v == 0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

namespace detail {

using nlohmann::json;

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string human_bytes(double b) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  double v = b;
  while (std::fabs(v) >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", format_number(b));
  return fmt::format("{:.{}f} {}", v,
                     std::fabs(v) >= 100  ? 0
                     : std::fabs(v) >= 10 ? 1
                                          : 2,
                     kUnits[u]);
}

std::optional<double> number_at(const json& obj, const std::string& path) {
  const json* cur = &obj;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string key = path.substr(pos, dot == std::string::npos ? dot : dot - pos);
    if (!cur->is_object() || !cur->contains(key)) return std::nullopt;
    cur = &(*cur)[key];
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  if (!cur->is_number()) return std::nullopt;
  return cur->get<double>();
}

std::vector<ArmRef> all_arms(const std::vector<ResultFile>& files) {
  std::vector<ArmRef> out;
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& a : files[i].doc["arms"]) out.push_back({i, &a});
  return out;
}

namespace {

// JSON safe inside <script>: no '<', '>' or '&' survive (they occur only
// inside strings, where \u escapes mean the same characters).
std::string script_json(const json& j) {
  const std::string raw = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(raw.size());
  for (char c : raw) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

// Arm names repeated across files get " [FILE]" appended (names are bar labels).
void unique_arm_names(std::vector<ResultFile>& files) {
  std::map<std::string, int> seen;
  for (auto& f : files)
    for (auto& a : f.doc["arms"]) ++seen[a["name"].get<std::string>()];
  for (auto& f : files) {
    const std::string base = std::filesystem::path(f.path).filename().string();
    for (auto& a : f.doc["arms"])
      if (seen[a["name"].get<std::string>()] > 1)
        a["name"] = a["name"].get<std::string>() + " [" + base + "]";
  }
}

std::string section(const char* id, const char* title, const std::string& note,
                    const std::string& charts, const std::string& table) {
  return fmt::format(
      "<section id=\"{}\"><h2>{}</h2><p class=note>{}</p>{}<details><summary>exact "
      "values</summary>{}</details></section>\n",
      id, title, note, charts, table);
}

std::string chart_div(const char* id) {
  return fmt::format("<div class=chart id=\"{}\"></div>", id);
}

}  // namespace

std::string render_page(std::vector<ResultFile>& files, const ReportOptions& opt) {
  unique_arm_names(files);
  const auto arms = all_arms(files);
  json data = json::array();
  for (const auto& f : files) data.push_back({{"path", f.path}, {"doc", f.doc}});
  std::string s;
  s += "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\n";
  s += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
       "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n";
  s += "<meta name=viewport content=\"width=device-width, initial-scale=1\">\n";
  s += "<title>" + escape(opt.title) + "</title>\n<style>" + std::string(kReportCss) +
       "</style></head><body>\n";
  s += "<header><h1>" + escape(opt.title) + "</h1><p class=note>" +
       fmt::format(
           "{} result file{}, {} arm{}. Hover a bar or a point for its exact value; "
           "every table below a chart holds the same values.",
           files.size(), files.size() == 1 ? "" : "s", arms.size(), arms.size() == 1 ? "" : "s") +
       "</p>" + files_table(files) + "</header>\n";
  s += section("arms", "Arms", "Each arm is one engine with its flags on one model.", "",
               arms_table(arms));
  s += section("throughput", "Throughput and time to first token",
               "Medians of the runs (warm runs when there are several), whiskers from min to "
               "max; the dark tick is the physical bound measured on the same machine. Higher "
               "is better for tok/s, lower for TTFT.",
               chart_div("chart-decode") + chart_div("chart-prompt") + chart_div("chart-ttft"),
               throughput_table(arms));
  s += section("memory", "Memory",
               "Where each arm's memory went: resident core, expert arena, "
               "KV cache and headroom; the line is the budget it ran under. The thin bars: the "
               "host RAM tier, and the most device memory the backend held during a run "
               "(peak_device_bytes; on the CPU backend, the host memory it allocated for the KV "
               "cache and activations).",
               chart_div("chart-memory"), memory_table(arms));
  s += section("storage", "Storage traffic",
               "Logical expert reads (the engine's counter) and physical process reads "
               "(/proc/self/io) per request; cold runs apart from warm ones. Lower is better.",
               chart_div("chart-storage"), storage_table(arms));
  s += section("simulate", "Hit rate versus budget",
               "Replayed routing traces: each cache policy's hit rate at each hot-set budget, "
               "Belady's MIN (the optimum) included; the tooltip gives the budget in bytes.",
               chart_div("chart-simulate"), simulate_table(files));
  s += section("monitor", "Device monitor",
               "Samples of the machine's state per phase (default every 5 s). Pick a phase; the "
               "charts share a crosshair. A missing sample is a gap, never filled in. "
               "sw_power_cap is the software power limit, not a thermal limit.",
               chart_div("monitor-charts"), monitor_table(files));
  s += "<div id=tip role=tooltip hidden></div>\n";
  s += "<script type=\"application/json\" id=\"moetier-data\">" + script_json(data) +
       "</script>\n<script>" + std::string(kReportJs) + "</script>\n</body></html>\n";
  return s;
}

}  // namespace detail

std::string render_report(std::vector<ResultFile> files, const ReportOptions& opt) {
  return detail::render_page(files, opt);
}

}  // namespace moetier::report
