// ResidentExperts: every expert of the model copied once into the backend's
// memory (device memory on CUDA), the provider for a model whose experts fit
// there. Tickets only hand out views (MappedExperts' protocol); each MoE
// layer's experts are also registered as a backend expert table
// (Backend::register_experts), so decode steps can run them straight from the
// router's output on the device.
//
// With next-layer hints (--prefetch next-layer), device_staged() asks each
// decode step on the device to predict the next MoE layer's experts
// (Backend::NextLayer; the CUDA backend prefetches their lines into L2 with
// MOETIER_CUDA_STAGE=l2), and after_device_step() counts the predictions
// against the layer's routing in stats->prefetch (hints, redundant,
// redundant_used). Steps launched ahead (Session::decode_greedy_run) are not
// counted: the tables never change, so no step needs the host.
//
// Protocol: as ExpertProvider (one caller thread); views stay valid for the
// provider's lifetime.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "experts/stats.h"
#include "model/spec.h"
#include "runtime/mapped_experts.h"

namespace moetier {

class Checkpoint;

class ResidentExperts final : public MappedExperts {
 public:
  // Uploads every expert (validated like MappedExperts) through be.weights().
  // next_layer_hints: the counts go to *stats (required then).
  ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be,
                  bool next_layer_hints = false, ExpertStats* stats = nullptr);

  int device_table(int64_t layer) const override;
  int32_t* device_ids(int64_t layer) const override;
  int32_t* device_staged(int64_t layer) const override;
  void after_device_step() override;
  uint64_t device_bytes() const { return store_.bytes(); }

 private:
  ResidentExperts(const Checkpoint& ck, const ModelSpec& spec, Backend& be, WeightStore store);
  int32_t* slice(const DeviceBuffer& b, int64_t layer) const;  // [k] of layer, or null
  WeightStore store_;
  std::vector<int> tables_;  // [layer] backend table or -1
  // Hints: [layers, k] int32 device, the step's routing and predictions
  // (-1: none, -2 - id: id predicted), and their host copies.
  Backend* be_ = nullptr;
  ExpertStats* stats_ = nullptr;
  int64_t k_ = 0;
  DeviceBuffer routing_dev_, staged_dev_;
  std::vector<int32_t> routing_host_, staged_host_, staged_none_;
};

}  // namespace moetier
