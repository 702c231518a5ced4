#include "convert/prune.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>

#include "convert/usage.h"
#include "core/error.h"
#include "core/units.h"
#include "format/json_util.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "model/check.h"

namespace moetier {
namespace fs = std::filesystem;

namespace {

// The source tensor with only the rows (dim 0) in `ids`: router [E, H],
// stacked gate_up_proj [E, 2I, H] and down_proj [E, H, I].
OutTensor take_rows(const Checkpoint& ck, const TensorInfo& t, const std::vector<int32_t>& ids,
                    int64_t num_experts) {
  check(!t.shape.empty() && t.shape[0] == num_experts && t.nbytes() % uint64_t(num_experts) == 0,
        "{}: tensor '{}': shape {} does not start with num_experts {}",
        ck.shards()[t.shard].path.string(), t.name, shape_str(t.shape), num_experts);
  const auto src = ck.bytes(t);
  const uint64_t row = t.nbytes() / uint64_t(num_experts);
  OutTensor o;
  o.owned.resize(row * ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    std::memcpy(o.owned.data() + i * row, src.data() + uint64_t(ids[i]) * row, row);
  o.t = {t.name, t.dtype, t.shape, o.owned};
  o.t.shape[0] = int64_t(ids.size());
  return o;
}

OutTensor copy_of(const Checkpoint& ck, const TensorInfo& t, std::string name, int64_t record) {
  OutTensor o;
  o.t = {std::move(name), t.dtype, t.shape, ck.bytes(t)};
  o.record = record;
  return o;
}

// The output tensor(s) for source tensor t (none when it is a dropped expert's).
// new_id[layer][source id] = output id, or -1.
void prune_tensor(const Checkpoint& ck, const ModelSpec& cfg, const TensorInfo& t,
                  const std::vector<std::vector<int32_t>>& kept,
                  const std::vector<std::vector<int32_t>>& new_id, std::vector<OutTensor>& out) {
  const MoeTensorNames& names = cfg.names();
  const auto n = parse_layer_tensor(t.name, names);
  if (!n || n->layer >= cfg.num_layers || !cfg.is_moe_layer(n->layer))
    return out.push_back(copy_of(ck, t, t.name, -1));
  const auto& ids = kept[size_t(n->layer)];
  if (n->rest == names.router || is_stacked_rest(n->rest, names))
    return out.push_back(take_rows(ck, t, ids, cfg.num_experts));
  if (n->expert < 0) return out.push_back(copy_of(ck, t, t.name, -1));
  check(n->expert < cfg.num_experts, "{}: tensor '{}': expert {} out of range (num_experts {})",
        ck.shards()[t.shard].path.string(), t.name, n->expert, cfg.num_experts);
  const int32_t id = new_id[size_t(n->layer)][size_t(n->expert)];
  if (id < 0) return;  // pruned away
  const std::string name = fmt::format("{}{}.{}", names.experts_prefix(n->layer), id, n->part);
  out.push_back(copy_of(ck, t, name, record_key(n->layer, id)));
}

bool is_expert_tensor(const std::string& name, const MoeTensorNames& names) {
  const auto n = parse_layer_tensor(name, names);
  return n && is_expert_rest(n->rest, names);
}
bool is_router(const std::string& name, const MoeTensorNames& names) {
  const auto n = parse_layer_tensor(name, names);
  return n && n->rest == names.router;
}

// config.json of the pruned model (num_experts in the source's form, the
// kept ids composed with an earlier prune).
nlohmann::json pruned_config(const nlohmann::json& src, const ModelSpec& cfg,
                             const std::vector<std::vector<int32_t>>& kept, int64_t keep) {
  int64_t from = cfg.num_experts;
  std::vector<std::vector<int64_t>> orig(kept.size());
  const nlohmann::json* prev = nullptr;
  if (src.contains("moetier") && src["moetier"].is_object() &&
      src["moetier"].contains("kept_experts"))
    prev = &src["moetier"]["kept_experts"];
  if (prev) from = src["moetier"]["pruned_from"].get<int64_t>();  // validated by check
  for (size_t l = 0; l < kept.size(); ++l)
    for (int32_t id : kept[l]) orig[l].push_back(prev ? (*prev)[l][size_t(id)].get<int64_t>() : id);
  nlohmann::json c = derived_config(src, {{"pruned_from", from}, {"kept_experts", orig}});
  return cfg.arch->with_num_experts(c, keep);
}

void check_kept(const Checkpoint& ck, const ModelSpec& cfg,
                const std::vector<std::vector<int32_t>>& kept, int64_t& keep) {
  check(int64_t(kept.size()) == cfg.num_layers, "{}: kept experts for {} layers, model has {}",
        ck.dir().string(), kept.size(), cfg.num_layers);
  keep = -1;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const auto& ids = kept[size_t(l)];
    if (!cfg.is_moe_layer(l)) {
      check(ids.empty(), "{}: layer {} is dense but has kept experts", ck.dir().string(), l);
      continue;
    }
    check(keep < 0 || int64_t(ids.size()) == keep,
          "{}: layer {} keeps {} experts, others {} (one K for all layers)", ck.dir().string(), l,
          ids.size(), keep);
    keep = int64_t(ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      check(ids[i] >= 0 && ids[i] < cfg.num_experts && (i == 0 || ids[i] > ids[i - 1]),
            "{}: layer {}: kept expert ids must ascend within [0, {})", ck.dir().string(), l,
            cfg.num_experts);
  }
  check(keep > 0, "{}: the model has no MoE layer to prune", ck.dir().string());
  check_keep(cfg, keep, ck.dir() / "config.json");
}

}  // namespace

void check_keep(const ModelSpec& cfg, int64_t keep, const fs::path& config_file) {
  check(keep >= 1, "--keep: {} must be at least 1 (and at least num_experts_per_tok {})", keep,
        cfg.experts_per_token);
  check(keep <= cfg.num_experts, "--keep: {} exceeds num_experts {} of {}", keep, cfg.num_experts,
        config_file.string());
  check(keep >= cfg.experts_per_token,
        "--keep: {} is less than num_experts_per_tok {} of {} (every token routes to that many "
        "experts)",
        keep, cfg.experts_per_token, config_file.string());
}

PruneReport prune_checkpoint(const Checkpoint& ck, const std::vector<std::vector<int32_t>>& kept,
                             const fs::path& out, ConvertControl control) {
  require_valid(ck.dir());
  const ModelSpec cfg = model_spec(ck);
  PruneReport rep;
  check_kept(ck, cfg, kept, rep.keep);
  rep.from = cfg.num_experts;
  rep.kept = kept;
  std::vector<std::vector<int32_t>> new_id(kept.size());
  for (size_t l = 0; l < kept.size(); ++l) {
    new_id[l].assign(size_t(cfg.num_experts), -1);
    for (size_t i = 0; i < kept[l].size(); ++i) new_id[l][size_t(kept[l][i])] = int32_t(i);
  }
  DerivedCheckpointWriter w(ck, out, control);
  const auto order = tensors_in_file_order(ck);
  const MoeTensorNames& names = cfg.names();
  const auto rec_shard = record_shards(order, cfg.num_experts, names);
  auto dest = [&](const TensorInfo& t) {  // per-expert tensors go with their record
    const auto n = parse_layer_tensor(t.name, names);
    return n && n->expert >= 0 ? rec_shard.at(record_key(n->layer, n->expert)) : t.shard;
  };
  int64_t done = 0;
  for (uint32_t s = 0; s < ck.shards().size(); ++s) {
    std::vector<OutTensor> tensors;
    for (const TensorInfo* t : order) {
      if (dest(*t) != s) continue;
      if (control.progress) control.progress(++done, int64_t(order.size()));
      if (is_expert_tensor(t->name, names)) rep.expert_bytes_before += t->nbytes();
      if (is_router(t->name, names)) rep.router_bytes_before += t->nbytes();
      const size_t before = tensors.size();
      prune_tensor(ck, cfg, *t, kept, new_id, tensors);
      for (size_t i = before; i < tensors.size(); ++i) {
        const auto& o = tensors[i].t;
        if (is_expert_tensor(o.name, names)) rep.expert_bytes_after += o.data.size();
        if (is_router(o.name, names)) rep.router_bytes_after += o.data.size();
        w.tick();
      }
    }
    w.write_shard(s, std::move(tensors));
  }
  w.commit(pruned_config(ck.config(), cfg, kept, rep.keep));
  return rep;
}

int64_t parse_keep(std::string_view text, int64_t num_experts) {
  if (auto pct = parse_percent(text, "--keep"))
    return int64_t(percent_of(*pct, uint64_t(num_experts)));
  int64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  check(ec == std::errc() && p == text.data() + text.size() && !text.empty(),
        "--keep: '{}' is not a count of experts or a percentage (e.g. 26 or 40%)", printable(text));
  return n;
}

PruneReport prune_checkpoint(const fs::path& dir, const fs::path& trace, std::string_view keep_text,
                             const fs::path& out, ConvertControl control) {
  auto ck = Checkpoint::open(dir);
  const ModelSpec cfg = model_spec(*ck);
  const int64_t keep = parse_keep(keep_text, cfg.num_experts);
  check_keep(cfg, keep, dir / "config.json");
  const ExpertUsage u = read_expert_usage(trace, cfg);
  auto kept = most_used_experts(u, cfg, keep);
  PruneReport rep = prune_checkpoint(*ck, kept, out, control);
  rep.usage_source = u.source;
  rep.coverage.assign(size_t(cfg.num_layers), -1.0);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    double all = 0, in = 0;
    for (double c : u.counts[size_t(l)]) all += c;
    for (int32_t e : kept[size_t(l)]) in += u.counts[size_t(l)][size_t(e)];
    rep.coverage[size_t(l)] = all > 0 ? in / all : 0.0;
  }
  return rep;
}

}  // namespace moetier
