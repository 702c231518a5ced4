// TraceRecorder: records the routing of forward passes into a TraceWriter
// (experts/trace.h), the way `moetier trace` runs the engine over a corpus:
// each window is a prompt, prefilled in one chunk, then greedily decoded.
//
// Protocol: one thread. observer() collects the RoutingEvents of one forward
// pass (every MoE layer exactly once, the same tokens); end_chunk() checks
// that and appends the chunk to the writer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "experts/provider.h"
#include "experts/trace.h"
#include "runtime/model.h"
#include "runtime/routing.h"

namespace moetier {

// The model part of a trace header for `model`, encodings included: the
// experts' own (named by encoding_name, measured from the expert index of the
// model's checkpoint), then the estimates of expert_encoding_bytes.
TraceModel trace_model_of(const Model& model);

class TraceRecorder {
 public:
  TraceRecorder(TraceWriter& writer, const ModelSpec& spec);

  const RoutingObserver& observer() const { return observer_; }
  // Appends the forward pass just observed (tokens at start_pos...).
  void end_chunk(uint32_t sequence, uint16_t corpus, int64_t start_pos,
                 std::span<const int32_t> tokens);

  // One window: prefill `prompt` in one chunk, then `decode` greedy decode
  // steps (each feeds the previous argmax, lowest id on ties; eos is not
  // special). Records prompt.size() + decode tokens.
  void run_window(const Model& model, ExpertProvider& experts, std::span<const int32_t> prompt,
                  int64_t decode, uint32_t sequence, uint16_t corpus);

 private:
  void observe(const RoutingEvent& ev);

  TraceWriter& writer_;
  std::vector<int64_t> moe_index_;  // [num_layers] position among MoE layers, or -1
  size_t moe_count_ = 0;
  int64_t k_ = 0;
  RoutingObserver observer_;
  // The current forward pass.
  int64_t n_ = -1;
  Phase phase_ = Phase::Decode;
  std::vector<uint8_t> seen_;     // [moe layers]
  std::vector<int32_t> experts_;  // [moe layers, n, k]
  std::vector<float> weights_;    // [moe layers, n, k]
};

}  // namespace moetier
