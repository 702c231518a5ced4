#include "runtime/mapped_experts.h"

#include "core/error.h"
#include "format/safetensors.h"
#include "runtime/weights.h"

namespace moetier {

ExpertView map_expert(const Checkpoint& ck, const ModelSpec& spec, int64_t layer, int64_t expert) {
  const int64_t h = spec.hidden_size, in = spec.expert_intermediate, ne = spec.num_experts;
  const ExpertTensors t = expert_tensors(ck, spec, layer, expert);
  ExpertView v;
  switch (t.layout) {
    case ExpertLayout::Stacked:
      v.gate = runtime::stacked_view(ck, t.gate, ne, t.index, 2 * in, 0, in, h);
      v.up = runtime::stacked_view(ck, t.up, ne, t.index, 2 * in, in, in, h);
      v.down = runtime::stacked_view(ck, t.down, ne, t.index, h, 0, h, in);
      break;
    case ExpertLayout::PerExpert:
      v.gate = runtime::matrix_view(ck, t.gate, in, h);
      v.up = runtime::matrix_view(ck, t.up, in, h);
      v.down = runtime::matrix_view(ck, t.down, h, in);
      break;
    case ExpertLayout::PerExpertMxfp4:
      v.gate = runtime::mxfp4_view(ck, t.gate, t.gate_scale, in, h);
      v.up = runtime::mxfp4_view(ck, t.up, t.up_scale, in, h);
      v.down = runtime::mxfp4_view(ck, t.down, t.down_scale, h, in);
      break;
    case ExpertLayout::PerExpertCb3:  // *_scale name the codebooks
      v.gate = runtime::cb3_view(ck, t.gate, t.gate_scale, in, h);
      v.up = runtime::cb3_view(ck, t.up, t.up_scale, in, h);
      v.down = runtime::cb3_view(ck, t.down, t.down_scale, h, in);
      break;
  }
  return v;
}

MappedExperts::MappedExperts(const Checkpoint& ck, const ModelSpec& spec, int64_t max_batch)
    : num_experts_(spec.num_experts),
      max_batch_(max_batch > 0 ? max_batch : spec.num_experts),
      views_(static_cast<size_t>(spec.num_layers)) {
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (!spec.is_moe_layer(l)) continue;
    auto& layer = views_[size_t(l)];
    layer.reserve(static_cast<size_t>(num_experts_));
    for (int64_t e = 0; e < num_experts_; ++e) layer.push_back(map_expert(ck, spec, l, e));
  }
}

MappedExperts::MappedExperts(std::vector<std::vector<ExpertView>> views, int64_t num_experts)
    : num_experts_(num_experts), max_batch_(num_experts), views_(std::move(views)) {}

const ExpertView& MappedExperts::view(int64_t layer, int32_t expert) const {
  check(layer >= 0 && layer < int64_t(views_.size()) && !views_[size_t(layer)].empty(),
        "mapped experts: layer {} is not a MoE layer", layer);
  check(expert >= 0 && expert < num_experts_, "mapped experts: layer {}: expert {} outside [0, {})",
        layer, expert, num_experts_);
  return views_[size_t(layer)][size_t(expert)];
}

Ticket MappedExperts::submit(int64_t layer, std::span<const int32_t> ids, Phase) {
  check(int64_t(ids.size()) <= max_batch_,
        "mapped experts: layer {}: {} experts asked in one acquire, max_batch is {}", layer,
        ids.size(), max_batch_);
  for (int32_t id : ids) view(layer, id);  // validate all before taking a ticket
  uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = uint32_t(open_.size());
    open_.emplace_back();
  }
  Open& o = open_[i];
  ++o.gen;
  o.open = true;
  o.views.clear();
  for (int32_t id : ids) o.views.push_back(view(layer, id));
  ++acquire_calls_;
  return Ticket{i, o.gen};
}

MappedExperts::Open& MappedExperts::open(Ticket t) {
  check(t.index < open_.size() && open_[t.index].open && open_[t.index].gen == t.gen,
        "mapped experts: unknown or released ticket");
  return open_[t.index];
}

void MappedExperts::wait(Ticket t, std::vector<ExpertView>& views) { views = open(t).views; }

void MappedExperts::release(Ticket t) {
  open(t).open = false;
  free_.push_back(t.index);
}

}  // namespace moetier
