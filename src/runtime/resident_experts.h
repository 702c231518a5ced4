// ResidentExperts: every expert of the model copied once into the backend's
// memory (device memory on CUDA), the provider for a model whose experts fit
// there. Tickets only hand out views (MappedExperts' protocol); each MoE
// layer's experts are also registered as a backend expert table
// (Backend::register_experts), so decode steps can run them straight from the
// router's output on the device.
//
// Protocol: as ExpertProvider (one caller thread); views stay valid for the
// provider's lifetime.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/spec.h"
#include "runtime/mapped_experts.h"

namespace moetier {

class Checkpoint;

class ResidentExperts final : public MappedExperts {
 public:
  // Uploads every expert (validated like MappedExperts) through be.weights().
  ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be);

  int device_table(int64_t layer) const override;
  uint64_t device_bytes() const { return store_.bytes(); }

 private:
  ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be, WeightStore store);
  WeightStore store_;
  std::vector<int> tables_;  // [layer] backend table or -1
};

}  // namespace moetier
