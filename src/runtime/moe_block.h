// The routed experts of one MoE layer over a chunk, whatever the
// architecture: tokens are grouped by expert (runtime/routing.h), the distinct
// experts are requested from the ExpertProvider at most max_batch() at a time
// in ascending id order, and each batch runs on the backend
// (Backend::expert_batch). Reads overlap compute: batch i + 1 is submitted
// before batch i is computed when the provider's can_overlap() says that
// changes none of its decisions; otherwise batch i is released first (the
// order a synchronous acquire gives). At most two tickets are open.
//
//   out[t] = sum over t's experts e, ascending: w(t, e) * down(silu(gate x_t) * up x_t)
// Ascending expert order is transformers' index_add_ order, so every token's
// sum has the reference's order whatever the batching. After the acquires,
// note_routing reports the chunk's routing to the provider (accounting).
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "experts/provider.h"
#include "runtime/routing.h"

namespace moetier {

struct MoeBlock {
  int64_t layer = 0;
  Phase phase = Phase::Decode;
  int64_t hidden = 0, intermediate = 0;
  const Routing* routing = nullptr;  // host
  const float* x = nullptr;          // [n, hidden] device: the experts' input
  float* out = nullptr;              // [n, hidden] device: overwritten
  // Called once after the first batch is submitted (its experts are then
  // pinned): the forward's hints for the next layer (ExpertProvider::prefetch).
  std::function<void()> after_first_submit;
};

void run_moe_block(Backend& be, ExpertProvider& experts, const MoeBlock& b);

}  // namespace moetier
