#include "runtime/resident_experts.h"

#include "core/error.h"
#include "runtime/mapped_experts.h"

namespace moetier {

ResidentExperts::ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be)
    : num_experts_(spec.num_experts),
      views_(size_t(spec.num_layers)),
      tables_(size_t(spec.num_layers), -1) {
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (!spec.is_moe_layer(l)) continue;
    auto& layer = views_[size_t(l)];
    for (int64_t e = 0; e < num_experts_; ++e) {
      const ExpertView h = map_expert(ck, spec, l, e);
      layer.push_back(
          {be.weights(h.gate, store_), be.weights(h.up, store_), be.weights(h.down, store_)});
    }
    tables_[size_t(l)] = be.register_experts(layer);
  }
}

void ResidentExperts::acquire(int64_t layer, std::span<const int32_t> ids, Phase,
                              std::vector<ExpertView>& views) {
  check(layer >= 0 && layer < int64_t(views_.size()) && !views_[size_t(layer)].empty(),
        "resident experts: layer {} is not a MoE layer", layer);
  views.clear();
  for (int32_t id : ids) {
    check(id >= 0 && id < num_experts_, "resident experts: layer {}: expert {} outside [0, {})",
          layer, id, num_experts_);
    views.push_back(views_[size_t(layer)][size_t(id)]);
  }
}

int ResidentExperts::device_table(int64_t layer) const {
  return layer >= 0 && layer < int64_t(tables_.size()) ? tables_[size_t(layer)] : -1;
}

}  // namespace moetier
