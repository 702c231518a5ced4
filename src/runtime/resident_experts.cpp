#include "runtime/resident_experts.h"

#include "core/error.h"

namespace moetier {
namespace {

// Every expert's device views ([layer][expert]), their memory in `store`.
std::vector<std::vector<ExpertView>> upload(const Checkpoint& ck, const ModelSpec& spec,
                                            Backend& be, WeightStore& store) {
  std::vector<std::vector<ExpertView>> views(size_t(spec.num_layers));
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (!spec.is_moe_layer(l)) continue;
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      const ExpertView h = map_expert(ck, spec, l, e);
      views[size_t(l)].push_back(
          {be.weights(h.gate, store), be.weights(h.up, store), be.weights(h.down, store)});
    }
  }
  return views;
}

}  // namespace

ResidentExperts::ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be)
    : ResidentExperts(ck, spec, be, WeightStore{}) {}

ResidentExperts::ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be,
                                 WeightStore store)
    : MappedExperts(upload(ck, spec, be, store), spec.num_experts), store_(std::move(store)) {
  tables_.assign(size_t(spec.num_layers), -1);
  for (int64_t l = 0; l < spec.num_layers; ++l)
    if (spec.is_moe_layer(l)) {
      std::vector<ExpertView> layer;
      for (int64_t e = 0; e < spec.num_experts; ++e) layer.push_back(view(l, int32_t(e)));
      tables_[size_t(l)] = be.register_experts(layer);
    }
}

int ResidentExperts::device_table(int64_t layer) const {
  return layer >= 0 && layer < int64_t(tables_.size()) ? tables_[size_t(layer)] : -1;
}

}  // namespace moetier
