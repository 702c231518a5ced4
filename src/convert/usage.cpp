#include "convert/usage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "experts/trace.h"
#include "format/json_util.h"

namespace moetier {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::vector<int64_t> moe_layers(const ModelSpec& cfg) { return cfg.moe_layers(); }

// First non-blank byte of the file is '{'.
bool looks_like_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char ch = 0;
  while (in.get(ch))
    if (!std::isspace(static_cast<unsigned char>(ch))) return ch == '{';
  return false;
}

bool looks_like_trace(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, 8) && std::string_view(magic, 8) == "MOETRACE";
}

std::vector<double> counts_of(const json& a, const std::string& file, int64_t layer,
                              int64_t num_experts) {
  check(a.is_array(), "{}: layer {}: use counts are {}, expected a list", file, layer,
        json_kind(a));
  check(int64_t(a.size()) == num_experts,
        "{}: layer {}: {} use counts, the model has {} experts per layer", file, layer, a.size(),
        num_experts);
  std::vector<double> out;
  out.reserve(a.size());
  for (size_t e = 0; e < a.size(); ++e) {
    check(a[e].is_number() && std::isfinite(a[e].get<double>()) && a[e].get<double>() >= 0,
          "{}: layer {}: expert {}: use count {} is not a non-negative number", file, layer, e,
          printable(a[e].dump()));
    out.push_back(a[e].get<double>());
  }
  return out;
}

// "layers": [{"layer": L, "uses": [...]}, ...] (moetier trace's TRACE.json).
void from_summary(const json& layers, const std::string& file, const ModelSpec& cfg,
                  ExpertUsage& u) {
  for (const json& entry : layers) {
    check(entry.is_object() && entry.contains("layer") && entry["layer"].is_number_integer() &&
              entry.contains("uses"),
          "{}: field 'layers': every entry needs an integer 'layer' and 'uses'", file);
    const int64_t l = entry["layer"].get<int64_t>();
    check(l >= 0 && l < cfg.num_layers && cfg.is_moe_layer(l),
          "{}: layer {} is not a MoE layer of the model ({} layers)", file, l, cfg.num_layers);
    check(u.counts[size_t(l)].empty(), "{}: layer {} appears twice", file, l);
    u.counts[size_t(l)] = counts_of(entry["uses"], file, l, cfg.num_experts);
  }
}

// "layers": [[...], ...]: one list per layer, or one per MoE layer.
void from_plain(const json& layers, const std::string& file, const ModelSpec& cfg, ExpertUsage& u) {
  const auto moe = moe_layers(cfg);
  const bool per_layer = int64_t(layers.size()) == cfg.num_layers;
  check(per_layer || layers.size() == moe.size(),
        "{}: field 'layers': {} lists, expected {} (one per layer) or {} (one per MoE layer)", file,
        layers.size(), cfg.num_layers, moe.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t l = per_layer ? int64_t(i) : moe[i];
    if (!cfg.is_moe_layer(l)) {
      check(layers[i].is_array() && layers[i].empty(),
            "{}: layer {} is a dense layer: its list must be empty", file, l);
      continue;
    }
    u.counts[size_t(l)] = counts_of(layers[i], file, l, cfg.num_experts);
  }
}

void from_json(const fs::path& p, const ModelSpec& cfg, ExpertUsage& u) {
  std::string problem;
  auto j = read_json_file(p, problem);
  check(j.has_value(), "{}", problem);
  const std::string file = p.string();
  check(j->is_object() && j->contains("layers") && (*j)["layers"].is_array(),
        "{}: field 'layers': missing (a trace summary or {{\"layers\": [[count per expert], "
        "...]}})",
        file);
  const json& layers = (*j)["layers"];
  if (const json* h = j->contains("header") ? &(*j)["header"] : nullptr;
      h && h->is_object() && h->contains("model") && (*h)["model"].contains("num_experts")) {
    const json& ne = (*h)["model"]["num_experts"];
    check(ne.is_number_integer() && ne.get<int64_t>() == cfg.num_experts,
          "{}: field 'header.model.num_experts': {} (traced on another model?), the model has {}",
          file, printable(ne.dump()), cfg.num_experts);
  }
  if (!layers.empty() && layers[0].is_object())
    from_summary(layers, file, cfg, u);
  else
    from_plain(layers, file, cfg, u);
}

void from_trace(const fs::path& p, const ModelSpec& cfg, ExpertUsage& u) {
  const Trace t = read_trace(p);
  const TraceModel& m = t.header.model;
  check(m.num_experts == cfg.num_experts && m.num_layers == cfg.num_layers &&
            m.moe_layers == moe_layers(cfg),
        "{}: traced a model with {} layers of {} experts, this one has {} of {}", p.string(),
        m.num_layers, m.num_experts, cfg.num_layers, cfg.num_experts);
  const UseCounts c = count_uses(t);
  for (int64_t l : m.moe_layers) {
    auto& v = u.counts[size_t(l)];
    for (int64_t e = 0; e < m.num_experts; ++e) v.push_back(double(c.total[m.key(l, e)]));
  }
}

// The ranking text of moetier trace: "LAYER EXPERT USES" per line, '#' comments.
bool from_ranking_text(const fs::path& p, const ModelSpec& cfg, ExpertUsage& u) {
  std::ifstream in(p);
  std::string line;
  int64_t lineno = 0, entries = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream ss(line);
    int64_t l = -1, e = -1;
    double uses = -1;
    std::string rest;
    if (!(ss >> l >> e >> uses) || (ss >> rest)) {
      if (entries == 0) return false;  // not a ranking file at all
      fail("{}: line {}: expected 'LAYER EXPERT USES'", p.string(), lineno);
    }
    check(l >= 0 && l < cfg.num_layers && cfg.is_moe_layer(l) && e >= 0 && e < cfg.num_experts &&
              std::isfinite(uses) && uses >= 0,
          "{}: line {}: layer {} expert {} uses {} is not in the model ({} layers of {} experts)",
          p.string(), lineno, l, e, uses, cfg.num_layers, cfg.num_experts);
    auto& c = u.counts[size_t(l)];
    c.resize(size_t(cfg.num_experts), 0.0);
    c[size_t(e)] += uses;
    ++entries;
  }
  return entries > 0;
}

}  // namespace

ExpertUsage read_expert_usage(const fs::path& trace, const ModelSpec& cfg) {
  std::error_code ec;
  check(fs::is_regular_file(trace, ec),
        "{}: cannot open (expected a trace, its .json summary, or a ranking file)", trace.string());
  ExpertUsage u;
  u.counts.resize(size_t(cfg.num_layers));
  fs::path summary = trace;
  summary += ".json";
  if (looks_like_json(trace)) {
    u.source = trace.string();
    from_json(trace, cfg, u);
  } else if (fs::is_regular_file(summary, ec)) {
    u.source = summary.string();
    from_json(summary, cfg, u);
  } else if (looks_like_trace(trace)) {
    u.source = trace.string();
    from_trace(trace, cfg, u);
  } else if (u.source = trace.string(); !from_ranking_text(trace, cfg, u)) {
    fail(
        "{}: neither a trace (MOETRACE) with its .json summary, a JSON use-count file, nor a "
        "ranking 'LAYER EXPERT USES'",
        trace.string());
  }
  for (int64_t l : moe_layers(cfg))
    check(!u.counts[size_t(l)].empty(), "{}: no use counts for MoE layer {}", u.source, l);
  return u;
}

std::vector<std::vector<int32_t>> most_used_experts(const ExpertUsage& u, const ModelSpec& cfg,
                                                    int64_t keep) {
  std::vector<std::vector<int32_t>> kept(size_t(cfg.num_layers));
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    const auto& c = u.counts.at(size_t(l));
    check(int64_t(c.size()) == cfg.num_experts && keep >= 1 && keep <= cfg.num_experts,
          "layer {}: cannot keep {} of {} experts", l, keep, c.size());
    std::vector<int32_t> ids(c.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
    ids.resize(size_t(keep));
    std::sort(ids.begin(), ids.end());
    kept[size_t(l)] = std::move(ids);
  }
  return kept;
}

}  // namespace moetier
