// Use counts, the frequency ranking and the JSON summary of a trace.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "core/error.h"
#include "experts/trace.h"

namespace moetier {

UseCounts count_uses(const Trace& t) {
  const TraceModel& m = t.header.model;
  UseCounts u;
  u.prefill.assign(m.num_keys(), 0);
  u.decode.assign(m.num_keys(), 0);
  u.total.assign(m.num_keys(), 0);
  for (size_t i = 0; i < t.size(); ++i) {
    auto& per = t.phase[i] == Phase::Prefill ? u.prefill : u.decode;
    for (size_t l = 0; l < t.moe_count(); ++l) {
      for (uint16_t e : t.ids(i, l)) {
        const ExpertKey key = m.key(m.moe_layers[l], e);
        ++per[key];
        ++u.total[key];
      }
    }
  }
  return u;
}

std::vector<ExpertKey> rank_experts(const Trace& t, const UseCounts& u) {
  const TraceModel& m = t.header.model;
  std::vector<ExpertKey> keys;
  keys.reserve(m.total_experts());
  for (int64_t l : m.moe_layers)
    for (int64_t e = 0; e < m.num_experts; ++e) keys.push_back(m.key(l, e));
  std::stable_sort(keys.begin(), keys.end(),
                   [&](ExpertKey a, ExpertKey b) { return u.total[a] > u.total[b]; });
  return keys;
}

namespace {

// Share of all uses covered by the top `share` of the ranked experts, and the
// fewest experts that cover `target` of the uses.
struct Concentration {
  std::vector<uint64_t> sorted;  // uses, descending
  uint64_t total = 0;

  double top_share(double share) const {
    size_t n = size_t(std::ceil(share * double(sorted.size()) - 1e-9));
    uint64_t s = 0;
    for (size_t i = 0; i < n && i < sorted.size(); ++i) s += sorted[i];
    return total ? double(s) / double(total) : 0.0;
  }
  size_t experts_for(double target) const {
    uint64_t s = 0;
    for (size_t i = 0; i < sorted.size(); ++i) {
      s += sorted[i];
      if (double(s) >= target * double(total) - 1e-9) return i + 1;
    }
    return sorted.size();
  }
  nlohmann::json to_json() const {
    return {{"top_10pct_share", top_share(0.10)},
            {"top_25pct_share", top_share(0.25)},
            {"top_50pct_share", top_share(0.50)},
            {"experts_for_50pct", experts_for(0.5)},
            {"experts_for_90pct", experts_for(0.9)},
            {"experts", sorted.size()},
            {"experts_used", size_t(std::count_if(sorted.begin(), sorted.end(),
                                                  [](uint64_t x) { return x > 0; }))}};
  }
};

Concentration concentration(const std::vector<uint64_t>& uses) {
  Concentration c;
  c.sorted = uses;
  std::sort(c.sorted.begin(), c.sorted.end(), std::greater<>());
  for (uint64_t x : uses) c.total += x;
  return c;
}

nlohmann::json corpus_json(const Trace& t) {
  const size_t nc = std::max<size_t>(1, t.header.corpus.size());
  std::vector<uint64_t> pre(nc, 0), dec(nc, 0);
  std::vector<std::set<uint32_t>> seqs(nc);
  for (size_t i = 0; i < t.size(); ++i) {
    const size_t c = std::min<size_t>(t.corpus[i], nc - 1);
    (t.phase[i] == Phase::Prefill ? pre : dec)[c]++;
    seqs[c].insert(t.sequence[i]);
  }
  nlohmann::json out = nlohmann::json::array();
  for (size_t c = 0; c < nc; ++c) {
    out.push_back({{"file", c < t.header.corpus.size() ? t.header.corpus[c] : ""},
                   {"tokens", pre[c] + dec[c]},
                   {"prefill_tokens", pre[c]},
                   {"decode_tokens", dec[c]},
                   {"windows", seqs[c].size()}});
  }
  return out;
}

}  // namespace

nlohmann::json trace_summary(const Trace& t) {
  const TraceModel& m = t.header.model;
  const UseCounts u = count_uses(t);
  uint64_t prefill = 0, chunks = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    prefill += t.phase[i] == Phase::Prefill;
    chunks += i == 0 || t.chunk[i] != t.chunk[i - 1];
  }
  nlohmann::json layers = nlohmann::json::array();
  std::vector<uint64_t> all;
  for (int64_t l : m.moe_layers) {
    auto slice = [&](const std::vector<uint64_t>& v) {
      return std::vector<uint64_t>(v.begin() + l * m.num_experts,
                                   v.begin() + (l + 1) * m.num_experts);
    };
    const auto total = slice(u.total);
    all.insert(all.end(), total.begin(), total.end());
    layers.push_back({{"layer", l},
                      {"uses", total},
                      {"prefill_uses", slice(u.prefill)},
                      {"decode_uses", slice(u.decode)},
                      {"concentration", concentration(total).to_json()}});
  }
  nlohmann::json ranking = nlohmann::json::array();
  for (ExpertKey k : rank_experts(t, u)) {
    ranking.push_back({int64_t(k) / m.num_experts, int64_t(k) % m.num_experts, u.total[k]});
  }
  return {{"trace", t.file.string()},
          {"header", t.header.to_json()},
          {"tokens", t.size()},
          {"prefill_tokens", prefill},
          {"decode_tokens", t.size() - prefill},
          {"chunks", chunks},
          {"corpus", corpus_json(t)},
          {"selections", t.size() * t.moe_count() * size_t(m.k)},
          {"concentration", concentration(all).to_json()},
          {"layers", layers},
          {"ranking_note", "[layer, expert, uses], hottest first (uses: token-level selections)"},
          {"ranking", ranking}};
}

std::string ranking_text(const Trace& t) {
  const TraceModel& m = t.header.model;
  const UseCounts u = count_uses(t);
  std::string s = fmt::format(
      "# moetier expert ranking of {} ({} tokens), hottest first\n"
      "# LAYER EXPERT USES  (uses: (token, layer) selections; --ranking FILE reads it)\n",
      t.file.string(), t.size());
  for (ExpertKey k : rank_experts(t, u)) {
    s += fmt::format("{} {} {}\n", int64_t(k) / m.num_experts, int64_t(k) % m.num_experts,
                     u.total[k]);
  }
  return s;
}

}  // namespace moetier
