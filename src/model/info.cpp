#include "model/info.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/tensor.h"
#include "core/units.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "model/check.h"

namespace moetier {

namespace {

// The experts' encoding (core/tensor.h's names); plain experts by their dtype
// ("bf16", "f16", "f32": f16 has no WeightEncoding of its own).
std::string encoding_of(const Checkpoint& ck, const ExpertTensors& e) {
  if (e.layout == ExpertLayout::PerExpertMxfp4)
    return std::string(encoding_name(WeightEncoding::MXFP4));
  if (e.layout == ExpertLayout::PerExpertCb3)
    return std::string(encoding_name(WeightEncoding::CB3));
  std::string n(dtype_name(ck.get(e.gate).dtype));
  std::transform(n.begin(), n.end(), n.begin(), [](char ch) { return char(std::tolower(ch)); });
  return n;
}

// Bytes of one expert: its share of the stacked tensors, or its own tensors.
uint64_t expert_bytes(const Checkpoint& ck, const ExpertTensors& e, int64_t num_experts) {
  if (e.layout == ExpertLayout::Stacked)
    return (ck.get(e.gate).nbytes() + ck.get(e.down).nbytes()) / uint64_t(num_experts);
  uint64_t b = 0;
  for (const std::string* n : {&e.gate, &e.up, &e.down, &e.gate_scale, &e.up_scale, &e.down_scale})
    if (!n->empty()) b += ck.get(*n).nbytes();
  return b;
}

// Whether `name` is an expert tensor of a layer (names.layers + "L." + names.experts...).
bool is_expert_tensor(const std::string& name, const MoeTensorNames& n) {
  if (!name.starts_with(n.layers)) return false;
  const size_t dot = name.find('.', n.layers.size());
  return dot != std::string::npos && name.compare(dot + 1, n.experts.size(), n.experts) == 0;
}

void count_experts(const Checkpoint& ck, const ModelSpec& c, ModelInfo& m) {
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    ++m.moe_layers;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      ExpertTensors t = expert_tensors(ck, c, l, e);
      uint64_t b = expert_bytes(ck, t, c.num_experts);
      auto& s = m.expert_encodings[encoding_of(ck, t)];
      ++s.experts;
      s.bytes += b;
      m.expert_bytes += b;
      m.max_expert_bytes = std::max(m.max_expert_bytes, b);
      m.min_expert_bytes = m.min_expert_bytes ? std::min(m.min_expert_bytes, b) : b;
    }
  }
  // Stacked tensors divide with a remainder only if malformed; count all bytes.
  uint64_t all = 0;
  for (const auto& t : ck.tensors())
    if (is_expert_tensor(t.name, c.names())) all += t.nbytes();
  m.expert_bytes = std::max(m.expert_bytes, all);
}

std::string count_str(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f} B", double(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f} M", double(n) / 1e6);
  if (n >= 10000) return fmt::format("{:.1f} K", double(n) / 1e3);
  return std::to_string(n);
}

}  // namespace

ModelInfo model_info(const Checkpoint& ck, const ModelSpec& c) {
  ModelInfo m;
  m.dir = ck.dir().string();
  m.architecture = std::string(c.arch->name());
  m.tensors = int64_t(ck.tensors().size());
  m.shards = int64_t(ck.shards().size());
  for (const auto& s : ck.shards()) m.file_bytes += s.file_size;
  m.layers = c.num_layers;
  m.experts_per_layer = c.num_experts;
  m.experts_per_token = c.experts_per_token;
  for (const auto& t : ck.tensors()) {
    if (is_expert_tensor(t.name, c.names())) continue;
    m.core_bytes += t.nbytes();
    m.core_params += t.numel();
  }
  count_experts(ck, c, m);
  m.total_experts = m.moe_layers * c.num_experts;
  m.params_per_expert = 3 * c.expert_intermediate * c.hidden_size;
  m.total_params = m.core_params + m.total_experts * m.params_per_expert;
  m.active_params = m.core_params + m.moe_layers * c.experts_per_token * m.params_per_expert;
  m.kv_bytes_per_token = c.kv_bytes_per_token;
  return m;
}

ModelInfo model_info(const std::filesystem::path& dir) {
  auto problems = check_checkpoint(dir);
  if (!problems.empty())
    fail("{}{}", problems.front(),
         problems.size() > 1
             ? fmt::format(" (and {} more problems; see 'moetier check')", problems.size() - 1)
             : std::string());
  auto ck = Checkpoint::open(dir);
  return model_info(*ck, model_spec(*ck));
}

MemoryPlan plan_memory(const ModelInfo& m, uint64_t budget, uint64_t headroom, int64_t context) {
  MemoryPlan p;
  p.budget = budget;
  p.core = m.core_bytes;
  p.context_tokens = context;
  p.headroom_given = headroom > 0;
  if (p.headroom_given) {
    p.headroom = headroom;
  } else {
    p.kv_bytes = m.kv_bytes_per_token * uint64_t(std::max<int64_t>(context, 0));
    p.scratch_bytes = kDefaultScratchBytes;
    p.headroom = p.kv_bytes + p.scratch_bytes;
  }
  p.core_fits = budget >= p.core + p.headroom;
  p.arena = p.core_fits ? budget - p.core - p.headroom : 0;
  p.slot_bytes = (m.max_expert_bytes + 4095) / 4096 * 4096;
  if (p.slot_bytes > 0)
    p.experts_fit = std::min<int64_t>(int64_t(p.arena / p.slot_bytes), m.total_experts);
  p.share = m.total_experts ? double(p.experts_fit) / double(m.total_experts) : 0.0;
  p.all_fit = p.core_fits && p.experts_fit == m.total_experts;
  return p;
}

nlohmann::ordered_json to_json(const ModelInfo& m, const MemoryPlan* plan) {
  nlohmann::ordered_json j;
  j["dir"] = m.dir;
  j["architecture"] = m.architecture;
  j["tensors"] = m.tensors;
  j["shards"] = m.shards;
  j["file_bytes"] = m.file_bytes;
  j["layers"] = m.layers;
  j["moe_layers"] = m.moe_layers;
  j["experts_per_layer"] = m.experts_per_layer;
  j["experts_per_token"] = m.experts_per_token;
  j["total_experts"] = m.total_experts;
  j["params"] = {{"total", m.total_params},
                 {"active_per_token", m.active_params},
                 {"core", m.core_params},
                 {"per_expert", m.params_per_expert}};
  j["bytes"] = {{"core", m.core_bytes},
                {"experts", m.expert_bytes},
                {"per_expert_max", m.max_expert_bytes},
                {"per_expert_min", m.min_expert_bytes},
                {"kv_cache_per_token_bf16", m.kv_bytes_per_token}};
  for (const auto& [enc, s] : m.expert_encodings)
    j["expert_encodings"][enc] = {{"experts", s.experts}, {"bytes", s.bytes}};
  if (plan) {
    const MemoryPlan& p = *plan;
    j["plan"] = {{"budget", p.budget},
                 {"core", p.core},
                 {"headroom", p.headroom},
                 {"headroom_given", p.headroom_given},
                 {"context_tokens", p.context_tokens},
                 {"kv_cache", p.kv_bytes},
                 {"scratch", p.scratch_bytes},
                 {"arena", p.arena},
                 {"slot_bytes", p.slot_bytes},
                 {"experts_fit", p.experts_fit},
                 {"share", p.share},
                 {"core_fits", p.core_fits},
                 {"all_fit", p.all_fit}};
  }
  return j;
}

std::string to_text(const ModelInfo& m, const MemoryPlan* plan) {
  std::string s = fmt::format(
      "{}: {}, {} layers ({} MoE), {} experts per layer, top-{}\n"
      "files: {} tensors in {} shards, {}\n"
      "parameters: {} total, {} active per token ({} per expert)\n"
      "core (not experts): {} params, {}\n"
      "experts: {} of {} to {} each, {} in all\n",
      m.dir, m.architecture, m.layers, m.moe_layers, m.experts_per_layer, m.experts_per_token,
      m.tensors, m.shards, format_bytes(m.file_bytes), count_str(m.total_params),
      count_str(m.active_params), count_str(m.params_per_expert), count_str(m.core_params),
      format_bytes(m.core_bytes), m.total_experts, format_bytes(m.min_expert_bytes),
      format_bytes(m.max_expert_bytes), format_bytes(m.expert_bytes));
  for (const auto& [enc, st] : m.expert_encodings)
    s += fmt::format("  {:<6} {} experts, {}\n", enc, st.experts, format_bytes(st.bytes));
  if (!plan) return s;
  const MemoryPlan& p = *plan;
  s += fmt::format("memory plan for a budget of {}:\n  core resident   {}\n",
                   format_bytes(p.budget), format_bytes(p.core));
  if (p.headroom_given)
    s += fmt::format("  headroom        {} (as given)\n", format_bytes(p.headroom));
  else
    s += fmt::format("  headroom        {} (KV cache for {} tokens at bf16: {}; scratch {})\n",
                     format_bytes(p.headroom), p.context_tokens, format_bytes(p.kv_bytes),
                     format_bytes(p.scratch_bytes));
  if (!p.core_fits)
    return s + "  expert arena    none: the core and headroom alone exceed the budget\n";
  s += fmt::format("  expert arena    {}: {} slots of {} = {:.1f}% of {} experts{}\n",
                   format_bytes(p.arena), p.experts_fit, format_bytes(p.slot_bytes),
                   100.0 * p.share, m.total_experts, p.all_fit ? " (all fit)" : "");
  return s;
}

}  // namespace moetier
