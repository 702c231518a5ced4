#include "runtime/resident_experts.h"

#include <span>

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

ResidentExperts::ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be,
                                 bool next_layer_hints, ExpertStats* stats)
    : ResidentExperts(ck, spec, be, WeightStore{}) {
  if (!next_layer_hints) return;
  check(stats != nullptr, "resident experts: next-layer hints need statistics");
  be_ = &be, stats_ = stats, k_ = spec.experts_per_token;
  const size_t n = size_t(spec.num_layers * k_);
  staged_none_.assign(n, -1);
  routing_host_.assign(n, 0);
  staged_host_ = staged_none_;
  routing_dev_ = be.alloc(n * sizeof(int32_t));
  staged_dev_ = be.alloc(n * sizeof(int32_t));
  be.to_device(staged_dev_.data(), staged_none_.data(), n * sizeof(int32_t));
}

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

int32_t* ResidentExperts::slice(const DeviceBuffer& b, int64_t layer) const {
  if (!b.data() || layer < 0 || layer >= int64_t(tables_.size()) || tables_[size_t(layer)] < 0)
    return nullptr;
  return b.as<int32_t>() + layer * k_;
}

int32_t* ResidentExperts::device_ids(int64_t layer) const { return slice(routing_dev_, layer); }
int32_t* ResidentExperts::device_staged(int64_t layer) const { return slice(staged_dev_, layer); }

// Each prediction (-2 - id: the expert is in device memory, nothing was
// copied) against the ids the layer's router then picked.
void ResidentExperts::after_device_step() {
  if (!staged_dev_.data()) return;
  const size_t bytes = staged_host_.size() * sizeof(int32_t);
  be_->to_host(routing_host_.data(), routing_dev_.data(), bytes);  // waits for the step
  be_->to_host(staged_host_.data(), staged_dev_.data(), bytes);
  be_->to_device(staged_dev_.data(), staged_none_.data(), bytes);  // before the next step
  PrefetchCounters& c = stats_->prefetch;
  for (size_t l = 0; l < tables_.size(); ++l) {
    const auto ids = std::span<const int32_t>(routing_host_).subspan(l * size_t(k_), size_t(k_));
    for (size_t j = 0; j < size_t(k_); ++j)  // (-1: no prediction, not counted)
      c.count_in_device(staged_host_[l * size_t(k_) + j], ids);
  }
}

}  // namespace moetier
