// Routing of a chunk of tokens at one MoE layer (as every architecture
// reports it), the observer that sees it, grouping by expert, and the
// softmax top-k router that several architectures share: router logits =
// gate.weight x, softmax in f32 over all experts, top-k (descending
// probability, ties to the lower expert id as torch.topk), optional
// renormalization of the k probabilities.
//
// The per-layer routing of every forward pass can be observed through a
// RoutingObserver (the trace tool records it); the observer runs on the
// forward pass's thread, synchronously, and must not keep the spans.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "experts/provider.h"

namespace moetier {

struct Routing {
  int64_t n_tokens = 0, k = 0, num_experts = 0;
  std::vector<float> probs;      // [n_tokens, num_experts] softmax of the router logits
  std::vector<int32_t> experts;  // [n_tokens, k] chosen expert ids, by descending prob
  std::vector<float> weights;    // [n_tokens, k] their weights (renormalized if asked)
};

// Softmax top-k routing on `be`: x [n, hidden] device, router [E, hidden].
// probs/experts/weights are copied to the host (the CPU backend writes them
// there directly). Scratch for the device side comes from ws slots
// kRouterSlot.. kRouterSlot + 2.
class Workspace;
constexpr size_t kRouterSlot = 16;
Routing route_softmax_topk(Backend& be, const MatView& router, const float* x, int64_t n, int64_t k,
                           bool norm_topk_prob, Workspace& ws);
// One token's routing and its resident experts on the device (no host copy):
// Backend::route_moe_resident with probs / ids / weights in ws slots
// kRouterSlot.. kRouterSlot + 2 (ids in ids_out [k] instead when given: the
// provider's device_ids); out [hidden] = the MoE block's output.
void route_moe_resident_device(Backend& be, const MatView& router, int table, const float* x,
                               int64_t k, bool norm_topk_prob, int64_t hidden, int64_t intermediate,
                               float* out, Workspace& ws, int32_t* ids_out = nullptr);
// The same with the block's norm and residual add taken in
// (Backend::route_moe_resident_add): x [hidden] += the MoE block of
// rmsnorm(x, f.norm, f.eps).
void route_moe_resident_add_device(Backend& be, const MatView& router, int table, float* x,
                                   int64_t k, bool norm_topk_prob, int64_t hidden,
                                   int64_t intermediate, const Backend::NormAdd& f, Workspace& ws,
                                   int32_t* ids_out = nullptr);
// The same on the CPU backend with host x (tests, tools).
Routing route(const MatView& router, const float* x, int64_t n, int64_t k, bool norm_topk_prob);

struct RoutingEvent {
  int64_t layer = 0;
  int64_t start_pos = 0;  // position of the chunk's first token
  Phase phase = Phase::Decode;
  const Routing* routing = nullptr;
  std::span<const int32_t> tokens;  // [n_tokens] the chunk's input token ids
  // [n_tokens, hidden] the post-attention-norm hidden states: the router's and
  // the experts' input (moetier repack --calib collects its statistics here).
  const float* hidden = nullptr;
};
using RoutingObserver = std::function<void(const RoutingEvent&)>;

// Tokens grouped by expert: for expert ids[i], rows tokens[offsets[i] ..
// offsets[i+1]) with slot (position in that token's top-k) in slots[...].
// ids ascending; within an expert, tokens ascending.
struct ExpertGroups {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets;
  std::vector<int64_t> tokens;
  std::vector<int64_t> slots;
};
ExpertGroups group_by_expert(const Routing& r);

}  // namespace moetier
