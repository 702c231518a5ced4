// `moetier report`: one self-contained HTML page from moetier-bench/1 result
// files (docs/bench-format.md), drawn side by side: memory bars, throughput and
// TTFT bars beside their bounds, storage traffic, hit-rate-versus-budget
// curves, per-phase monitor charts with a shared crosshair, and the exact
// values in tables. The page makes no network request (a Content-Security-
// Policy of default-src 'none' says so to the browser; all CSS and JS are
// inline; the charts are hand-written SVG, docs/report.md says why).
//
// Library code: errors are thrown as moetier::Error with one line naming the
// file and the field ("r.json: arms[0].workloads[1].median.decode_tps:
// expected a number, got string"); nothing is printed. Stateless and
// reentrant.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetier::report {

inline constexpr const char* kSchema = "moetier-bench/1";

struct ResultFile {
  std::string path;    // as given (named in errors and on the page)
  nlohmann::json doc;  // a valid moetier-bench/1 document
};

// Reads PATH and validates it. A `moetier simulate -o` study (PREFIX.json) is
// accepted too and becomes a result with only its "simulate" curves.
ResultFile load_result(const std::string& path);

// Throws Error "FILE: FIELD: problem" for the first problem found.
void validate_result(const nlohmann::json& doc, const std::string& file);

// A `moetier simulate` study's JSON -> the "simulate" array: one curve per
// policy (ring variants as "POLICY+ring"), hit rates and all-k shares per
// budget, budget bytes in the model's own encoding.
nlohmann::json simulate_curves(const nlohmann::json& study, const std::string& file);

struct ReportOptions {
  std::string title = "moetier bench report";
};

// The page. Arm names repeated across files get " [FILE]" appended.
std::string render_report(std::vector<ResultFile> files, const ReportOptions& opt = {});

// Number formatting shared by the tables: shortest form with up to 6
// significant digits ("512.3", "0.0512", "2.8e+09").
std::string format_number(double v);

}  // namespace moetier::report
