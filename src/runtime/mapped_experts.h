// MappedExperts: the ExpertProvider for a checkpoint that fits in memory.
// Every expert of every MoE layer is a view into the Checkpoint's mmap, for
// all four layouts (model/spec.h): stacked f32/bf16 (gate/up are the
// first/second I rows of gate_up_proj[e]), per-expert f32/bf16,
// per-expert MXFP4 and per-expert CB3. All views are built and validated (dtype, shape, bytes)
// at construction, so submit() only looks views up and wait() copies them.
//
// Protocol: as ExpertProvider (one caller thread). Nothing is ever loaded, so
// any batch may overlap any other (can_overlap is true) and prefetch does
// nothing. Views stay valid for the Checkpoint's lifetime, which is longer
// than the protocol promises; tickets are still checked (unknown or released
// ones are errors).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "experts/provider.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;

class MappedExperts : public ExpertProvider {
 public:
  // max_batch <= 0: all experts of a layer in one acquire().
  MappedExperts(const Checkpoint& ck, const ModelSpec& spec, int64_t max_batch = 0);

  int64_t max_batch() const override { return max_batch_; }
  // Throws Error for a dense layer, an id out of range or too many ids.
  Ticket submit(int64_t layer, std::span<const int32_t> ids, Phase phase) override;
  void wait(Ticket t, std::vector<ExpertView>& views) override;
  void release(Ticket t) override;
  bool can_overlap(int64_t, std::span<const int32_t>, Phase) override { return true; }

  // The view of one expert (throws like acquire).
  const ExpertView& view(int64_t layer, int32_t expert) const;
  int64_t acquire_calls() const { return acquire_calls_; }  // submits

 protected:
  // Views given by a subclass ([layer][expert], empty for dense layers).
  MappedExperts(std::vector<std::vector<ExpertView>> views, int64_t num_experts);

 private:
  struct Open {
    uint32_t gen = 0;
    bool open = false;
    std::vector<ExpertView> views;  // [ids]
  };
  Open& open(Ticket t);

  int64_t num_experts_ = 0, max_batch_ = 0, acquire_calls_ = 0;
  std::vector<std::vector<ExpertView>> views_;  // [layer][expert]; empty for dense layers
  std::vector<Open> open_;                      // [ticket index]
  std::vector<uint32_t> free_;
};

// One expert's views as stored in ck (no caching, full validation).
ExpertView map_expert(const Checkpoint& ck, const ModelSpec& spec, int64_t layer, int64_t expert);

}  // namespace moetier
