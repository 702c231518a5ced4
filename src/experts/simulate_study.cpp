// run_study: every policy at every budget, as JSON, CSV and a table.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "experts/simulate.h"

namespace moetier {

namespace {

double share(uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; }

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

size_t parse_budget(const std::string& text, const TraceModel& m, const std::string& encoding) {
  const size_t total = m.total_experts();
  size_t n = 0;
  std::string how;
  if (!text.empty() && text.back() == '%') {
    const std::string num = text.substr(0, text.size() - 1);
    double pct = 0;
    size_t used = 0;
    try {
      pct = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == num.size() && used > 0 && pct > 0 && std::isfinite(pct),
          "--budgets: invalid percentage '{}'", text);
    check(pct <= 100, "--budgets: {} is more than the model's {} experts", text, total);
    n = std::max<size_t>(1, size_t(std::ceil(pct / 100.0 * double(total) - 1e-9)));
  } else if (all_digits(text)) {
    check(text.size() <= 18, "--budgets: {} experts is more than the model's {} experts", text,
          total);
    n = size_t(std::stoull(text));
    check(n > 0, "--budgets: a budget of 0 experts holds nothing");
  } else {
    const uint64_t bytes = parse_bytes(text, "--budgets");
    const bool native = encoding.empty();
    const uint64_t per = native ? m.slot_bytes : m.bytes_of(encoding);
    n = size_t(bytes / per);
    check(n > 0, "--budgets: {} holds no expert (one {} expert is {})", text,
          native ? m.encoding : encoding, format_bytes(per));
    how =
        fmt::format(" ({} {} experts of {})", n, native ? m.encoding : encoding, format_bytes(per));
  }
  check(n <= total, "--budgets: {}{} is more than the model's {} experts", text, how, total);
  return n;
}

namespace {

nlohmann::json phase_json(const ExpertStats& s) {
  const LayerCounters c = s.total();
  return {{"uses", c.uses},
          {"hit_rate", share(c.hits(), c.uses)},
          {"steps", c.steps},
          {"all_k_share", share(c.all_hit_steps, c.steps)}};
}

nlohmann::json row_json(const SimResult& r) {
  const LayerCounters c = r.stats.total();
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < r.stats.layers.size(); ++l) {
    const LayerCounters& x = r.stats.layers[l];
    if (x.steps == 0) continue;
    layers.push_back({{"layer", l},
                      {"hit_rate", share(x.hits(), x.uses)},
                      {"all_k_share", share(x.all_hit_steps, x.steps)}});
  }
  return {{"policy", r.policy},
          {"hot_slots", r.hot_slots},
          {"transient_slots", r.transient_slots},
          {"pinned", r.stats.pinned},
          {"uses", c.uses},
          {"hits", {{"hot", c.hits_hot}, {"transient", c.hits_transient}, {"host", c.hits_host}}},
          {"misses", c.misses},
          {"hit_rate", share(c.hits(), c.uses)},
          {"read_bytes", c.read_bytes},
          {"evictions", {{"hot", c.hot_evictions}, {"transient", c.ring_evictions}}},
          {"steps", c.steps},
          {"all_hit_steps", c.all_hit_steps},
          {"all_k_share", share(c.all_hit_steps, c.steps)},
          {"prefill", phase_json(r.phase_stats[0])},
          {"decode", phase_json(r.phase_stats[1])},
          {"layers", layers}};
}

// The top `n` keys of `ranking`: globally, or an equal share per MoE layer
// (the remainder to the first layers).
std::vector<uint8_t> top_set(const TraceModel& m, const std::vector<ExpertKey>& ranking, size_t n,
                             bool per_layer) {
  std::vector<uint8_t> in(m.num_keys(), 0);
  if (!per_layer) {
    for (size_t i = 0; i < n && i < ranking.size(); ++i) in[ranking[i]] = 1;
    return in;
  }
  const size_t M = m.moe_layers.size();
  std::vector<size_t> quota(size_t(m.num_layers), 0);
  for (size_t i = 0; i < M; ++i) quota[size_t(m.moe_layers[i])] = n / M + (i < n % M ? 1 : 0);
  for (ExpertKey k : ranking) {
    size_t& q = quota[size_t(int64_t(k) / m.num_experts)];
    if (q == 0) continue;
    --q;
    in[k] = 1;
  }
  return in;
}

struct BudgetRun {
  std::string text;
  size_t experts = 0, transient = 0;
  double coverage = 0;  // token-level share of the selections in the global top set
  std::vector<SimResult> rows;
};

void run_budget(const Trace& t, const ReplayStream& s, const StudyOptions& o,
                const std::vector<ExpertKey>& ranking, const std::vector<uint64_t>& uses,
                BudgetRun& b) {
  const TraceModel& m = t.header.model;
  const size_t B = b.experts, M = b.transient;
  std::vector<size_t> rings{0};
  if (M > 0) rings.push_back(M);
  auto want = [&](const char* p) {
    return std::find(o.policies.begin(), o.policies.end(), p) != o.policies.end();
  };
  const auto global = top_set(m, ranking, B, false);
  uint64_t covered = 0, all = 0;
  for (size_t k = 0; k < uses.size(); ++k) {
    all += uses[k];
    covered += global[k] ? uses[k] : 0;
  }
  b.coverage = share(covered, all);
  if (want("static")) b.rows.push_back(simulate_static(t, s, global, "static"));
  if (want("static_layer"))
    b.rows.push_back(simulate_static(t, s, top_set(m, ranking, B, true), "static_layer"));
  for (auto [name, kind] : {std::pair{"lru", PolicyKind::Lru}, std::pair{"lfu", PolicyKind::Lfu},
                            std::pair{"pinned", PolicyKind::Pinned}}) {
    if (!want(name)) continue;
    for (size_t ring : rings) {
      PolicySim p;
      p.kind = kind;
      p.hot_slots = B;
      p.transient_slots = ring;
      if (kind == PolicyKind::Pinned) {
        p.ranking = ranking;
        p.max_pinned = engine_max_pinned(B, m.k);
      }
      b.rows.push_back(simulate_policy(t, s, p));
    }
  }
  if (want("min")) {
    for (size_t ring : rings) {
      SimResult r = simulate_min(t, s, B + ring);
      r.hot_slots = B;
      r.transient_slots = ring;  // MIN with the same slots in total
      b.rows.push_back(std::move(r));
    }
  }
}

std::string csv_header(const TraceModel& m) {
  std::string h =
      "budget,experts,share,policy,hot_slots,transient_slots,pinned,uses,hits_hot,"
      "hits_transient,misses,hit_rate,all_k_share,prefill_hit_rate,decode_hit_rate,"
      "prefill_all_k_share,decode_all_k_share,read_bytes,hot_evictions,ring_evictions,"
      "static_coverage";
  for (const EncodingBytes& e : m.encodings) h += ",bytes_" + e.name;
  return h + "\n";
}

std::string csv_row(const TraceModel& m, const BudgetRun& b, const SimResult& r) {
  const LayerCounters c = r.stats.total(), p = r.phase_stats[0].total(),
                      d = r.phase_stats[1].total();
  std::string s = fmt::format(
      "\"{}\",{},{:.6f},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{},{},"
      "{:.6f}",
      b.text, b.experts, share(b.experts, m.total_experts()), r.policy, r.hot_slots,
      r.transient_slots, r.stats.pinned, c.uses, c.hits_hot, c.hits_transient, c.misses,
      share(c.hits(), c.uses), share(c.all_hit_steps, c.steps), share(p.hits(), p.uses),
      share(d.hits(), d.uses), share(p.all_hit_steps, p.steps), share(d.all_hit_steps, d.steps),
      c.read_bytes, c.hot_evictions, c.ring_evictions, b.coverage);
  for (const EncodingBytes& e : m.encodings) s += fmt::format(",{}", b.experts * e.bytes);
  return s + "\n";
}

std::string table_row(const SimResult& r) {
  const LayerCounters c = r.stats.total(), d = r.phase_stats[1].total();
  return fmt::format("  {:<13} {:>6} {:>6} {:>7.2f}% {:>8.2f}% {:>8.2f}% {:>8.2f}%\n", r.policy,
                     r.transient_slots, r.stats.pinned, 100 * share(c.hits(), c.uses),
                     100 * share(c.all_hit_steps, c.steps), 100 * share(d.hits(), d.uses),
                     100 * share(d.all_hit_steps, d.steps));
}

// Appends budget b's rows to the CSV and the table; returns its JSON.
nlohmann::json report_budget(const TraceModel& m, const BudgetRun& b, Study& out) {
  nlohmann::json bytes = nlohmann::json::object();
  for (const EncodingBytes& e : m.encodings) bytes[e.name] = b.experts * e.bytes;
  nlohmann::json rows = nlohmann::json::array();
  out.table +=
      fmt::format("budget {} = {} experts ({:.1f}% of {}), ring {}\n", b.text, b.experts,
                  100 * share(b.experts, m.total_experts()), m.total_experts(), b.transient);
  for (const SimResult& r : b.rows) {
    rows.push_back(row_json(r));
    out.csv += csv_row(m, b, r);
    out.table += table_row(r);
  }
  return {{"budget", b.text},
          {"experts", b.experts},
          {"share", share(b.experts, m.total_experts())},
          {"slot_bytes", b.experts * m.slot_bytes},
          {"bytes", bytes},
          {"transient", b.transient},
          {"static_coverage", b.coverage},
          {"results", rows}};
}

}  // namespace

Study run_study(const Trace& t, const StudyOptions& o) {
  const TraceModel& m = t.header.model;
  check(!o.budgets.empty(), "--budgets: give at least one budget");
  check(t.size() > 0, "{}: the trace has no tokens", t.file.string());
  for (const std::string& p : o.policies) {
    check(p == "static" || p == "static_layer" || p == "lru" || p == "lfu" || p == "pinned" ||
              p == "min",
          "--policies: unknown policy '{}' (static, static_layer, lru, lfu, pinned, min)", p);
  }
  check(o.transient >= -1, "--transient: {} must not be negative", o.transient);
  if (!o.encoding.empty()) (void)m.bytes_of(o.encoding);  // unknown encoding: one-line error
  std::vector<BudgetRun> runs;
  for (const std::string& text : o.budgets) {
    BudgetRun b;
    b.text = text;
    b.experts = parse_budget(text, m, o.encoding);
    b.transient = o.transient >= 0 ? size_t(o.transient)
                                   : engine_default_transient(b.experts, m.num_experts, m.k);
    runs.push_back(std::move(b));
  }
  const UseCounts uses = count_uses(t);
  const std::vector<ExpertKey> ranking = o.ranking.empty() ? rank_experts(t, uses) : o.ranking;
  for (ExpertKey k : ranking) {
    check(k < m.num_keys(), "--ranking: expert key {} outside this trace's model", k);
  }
  const ReplayStream s = build_replay(t, o.replay);
  Study out;
  out.csv = csv_header(m);
  nlohmann::json budgets = nlohmann::json::array();
  out.table = fmt::format("{:<15} {:>6} {:>6} {:>8} {:>9} {:>9} {:>9}\n", "  policy", "ring",
                          "pinned", "hit", "all-k", "dec hit", "dec all-k");
  for (BudgetRun& b : runs) {
    run_budget(t, s, o, ranking, uses.total, b);
    budgets.push_back(report_budget(m, b, out));
  }
  uint64_t prefill = size_t(std::count(t.phase.begin(), t.phase.end(), Phase::Prefill));
  out.json = {{"trace", t.file.string()},
              {"model", t.header.to_json()["model"]},
              {"tokens", t.size()},
              {"prefill_tokens", prefill},
              {"decode_tokens", t.size() - prefill},
              {"total_experts", m.total_experts()},
              {"replay", o.replay == Replay::Chunk ? "chunk" : "token"},
              {"ranking", o.ranking.empty() ? "the trace's own (in-sample)" : o.ranking_source},
              {"budgets", budgets}};
  return out;
}

}  // namespace moetier
