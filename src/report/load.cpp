// Reading result files: moetier-bench/1 documents, and `moetier simulate -o`
// studies turned into "simulate" curves (docs/bench-format.md).
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "report/report.h"

namespace moetier::report {
namespace {

using nlohmann::json;

bool is_study(const json& doc) {
  return doc.is_object() && !doc.contains("schema") && doc.contains("budgets") &&
         doc.contains("model");
}

// Bytes of one budget in the study model's encoding (the slot size the
// engine would give it), or absent.
std::optional<double> budget_bytes(const json& model, const json& b) {
  if (model.contains("encoding") && b.contains("bytes") && b["bytes"].is_object()) {
    const auto& bytes = b["bytes"];
    const std::string enc =
        model["encoding"].is_string() ? model["encoding"].get<std::string>() : "";
    if (bytes.contains(enc) && bytes[enc].is_number()) return bytes[enc].get<double>();
  }
  return std::nullopt;
}

}  // namespace

json simulate_curves(const json& study, const std::string& file) {
  auto need = [&](bool ok, const std::string& field, const char* what) {
    check(ok, "{}: {}: {}", file, field, what);
  };
  need(study.contains("budgets") && study["budgets"].is_array(), "budgets", "expected an array");
  need(study.contains("model") && study["model"].is_object(), "model", "expected an object");
  std::map<std::string, json> curves;  // key -> curve
  std::vector<std::string> order;
  const json& budgets = study["budgets"];
  for (size_t i = 0; i < budgets.size(); ++i) {
    const json& b = budgets[i];
    const std::string p = fmt::format("budgets[{}]", i);
    need(b.is_object() && b.contains("experts") && b["experts"].is_number(), p + ".experts",
         "expected a number");
    need(b.contains("results") && b["results"].is_array(), p + ".results", "expected an array");
    const auto bytes = budget_bytes(study["model"], b);
    for (size_t j = 0; j < b["results"].size(); ++j) {
      const json& r = b["results"][j];
      const std::string rp = fmt::format("{}.results[{}]", p, j);
      need(r.is_object() && r.contains("policy") && r["policy"].is_string(), rp + ".policy",
           "expected a string");
      need(r.contains("hit_rate") && r["hit_rate"].is_number(), rp + ".hit_rate",
           "expected a number");
      const bool ring = r.contains("transient_slots") && r["transient_slots"].is_number() &&
                        r["transient_slots"].get<double>() > 0;
      const std::string key = r["policy"].get<std::string>() + (ring ? "+ring" : "");
      if (!curves.count(key)) {
        order.push_back(key);
        curves[key] = {{"policy", key},
                       {"budget_experts", json::array()},
                       {"hit_rate", json::array()},
                       {"all_k_share", json::array()}};
        if (bytes) curves[key]["budget_bytes"] = json::array();
      }
      json& c = curves[key];
      c["budget_experts"].push_back(b["experts"]);
      c["hit_rate"].push_back(r["hit_rate"]);
      // absent in a result: null here, and the curve loses the array below
      c["all_k_share"].push_back(r.contains("all_k_share") ? r["all_k_share"] : json());
      if (c.contains("budget_bytes")) {
        need(bytes.has_value(), p + ".bytes", "missing the model's encoding");
        c["budget_bytes"].push_back(*bytes);
      }
    }
  }
  json out = json::array();
  for (const auto& k : order) {
    json& c = curves[k];
    const auto& share = c["all_k_share"];
    if (std::any_of(share.begin(), share.end(), [](const json& v) { return !v.is_number(); }))
      c.erase("all_k_share");  // a share not measured everywhere is left out, not invented
    out.push_back(std::move(c));
  }
  return out;
}

ResultFile load_result(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(static_cast<bool>(f), "{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  check(!f.bad(), "{}: cannot read", path);
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    const std::string what = e.what();
    const size_t at = what.find("] ");
    fail("{}: not JSON ({})", path, at == std::string::npos ? what : what.substr(at + 2));
  }
  if (is_study(doc)) {
    const json study = std::move(doc);
    doc = {
        {"schema", kSchema}, {"arms", json::array()}, {"simulate", simulate_curves(study, path)}};
    if (study.contains("trace") && study["trace"].is_string())
      doc["command"] = "moetier simulate " + study["trace"].get<std::string>();
  }
  validate_result(doc, path);
  return {path, std::move(doc)};
}

}  // namespace moetier::report
