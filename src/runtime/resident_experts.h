// ResidentExperts: every expert of the model copied once into the backend's
// memory (device memory on CUDA), the provider for a model whose experts fit
// there. acquire() only returns views; each MoE layer's experts are also
// registered as a backend expert table (Backend::register_experts), so decode
// steps can run them straight from the router's output on the device.
//
// Protocol: as ExpertProvider (one caller thread); views stay valid for the
// provider's lifetime.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "experts/provider.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;

class ResidentExperts final : public ExpertProvider {
 public:
  // Uploads every expert (validated like MappedExperts) through be.weights().
  ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be);

  int64_t max_batch() const override { return num_experts_; }
  void acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
               std::vector<ExpertView>& views) override;
  int device_table(int64_t layer) const override;
  uint64_t device_bytes() const { return store_.bytes(); }

 private:
  int64_t num_experts_ = 0;
  WeightStore store_;
  std::vector<std::vector<ExpertView>> views_;  // [layer][expert]; empty for dense layers
  std::vector<int> tables_;                     // [layer] backend table or -1
};

}  // namespace moetier
