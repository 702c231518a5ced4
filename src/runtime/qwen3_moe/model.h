// Qwen3MoeModel: the qwen3_moe forward pass (HF transformers 5.17
// modeling_qwen3_moe.py, computed in f32) written against the Backend seam.
//
// Weights: the tensor map of model/qwen3_moe/config.h, made usable on the
// backend (in place on the CPU: views into the Checkpoint's read-only mmap;
// norms and biases are decoded to small f32 vectors). The Checkpoint must
// outlive the model. Expert weights are never read here: the MoE block gets
// them through an ExpertProvider (runtime/moe_block.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/qwen3_moe/config.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "runtime/workspace.h"

namespace moetier::qwen3_moe {

struct AttentionWeights {
  MatView q, k, v, o;  // q [heads*hd, H], k/v [kv*hd, H], o [H, heads*hd]
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr,
              *o_bias = nullptr;                     // device; null unless attention_bias
  const float *q_norm = nullptr, *k_norm = nullptr;  // [head_dim] device
};

struct LayerWeights {
  const float *input_norm = nullptr, *post_attention_norm = nullptr;  // [hidden] device
  AttentionWeights attn;
  bool moe = false;
  MatView router;          // moe: [num_experts, hidden]
  MatView gate, up, down;  // dense mlp: [I, H], [I, H], [H, I]
};

// Workspace slots of a forward pass (runtime/workspace.h; the router uses
// kRouterSlot.. of runtime/routing.h).
enum WsSlot : size_t { kX, kXn, kY, kLogits, kAttnXn, kQ, kK, kV, kCtx, kO, kMlpG, kMlpU, kHintXn };

// The state of one sequence: the KV cache and the forward's scratch.
struct State final : SequenceState {
  State(Backend& be, const Qwen3MoeConfig& c, int64_t capacity)
      : kv(be, c.num_hidden_layers, capacity, c.num_key_value_heads, c.head_dim), ws(be) {}
  int64_t size() const override { return kv.size(); }
  void set_size(int64_t n) override { kv.set_size(n); }
  int64_t capacity() const override { return kv.capacity(); }
  uint64_t bytes() const override { return kv.bytes() + ws.bytes(); }
  KvCache kv;
  Workspace ws;
};

class Qwen3MoeModel final : public Model {
 public:
  // Validates the config and every non-expert tensor (dtype, shape, bytes).
  static std::unique_ptr<Qwen3MoeModel> load(const Checkpoint& ck, Backend& be);

  const ModelSpec& spec() const override { return spec_; }
  const Checkpoint& checkpoint() const override { return *ck_; }
  Backend& backend() const override { return *be_; }
  uint64_t core_device_bytes() const override { return store_.bytes(); }
  std::unique_ptr<SequenceState> new_state(int64_t capacity) const override;
  std::vector<float> forward(std::span<const int32_t> tokens, int64_t start_pos,
                             SequenceState& state, ExpertProvider& experts,
                             const ForwardOptions& opt = {}) const override;

  const Qwen3MoeConfig& config() const { return cfg_; }
  const LayerWeights& layer(int64_t i) const { return layers_[size_t(i)]; }

 private:
  Qwen3MoeModel() = default;
  void check_chunk(std::span<const int32_t> tokens, int64_t start_pos, const KvCache& kv) const;
  // x [n, hidden] += self-attention of layer on rmsnorm(x); xn and o [n,
  // hidden] are scratch.
  void attention(int64_t layer, float* x, float* xn, int64_t n, int64_t start_pos, State& st,
                 float* o) const;
  void dense_mlp(int64_t layer, const float* xn, int64_t n, float* out, Workspace& ws) const;
  void moe(int64_t layer, float* x, float* xn, std::span<const int32_t> tokens, int64_t start_pos,
           ExpertProvider& experts, const ForwardOptions& opt, float* out, Workspace& ws) const;

  // --prefetch next-layer: the experts layer `next`'s router picks for x [1,
  // hidden] (normalized with that layer's post-attention norm), as a prefetch hint.
  void hint_layer(int64_t next, const float* x, ExpertProvider& experts, Workspace& ws) const;
  // The first MoE layer after `layer` (num_hidden_layers: none).
  int64_t next_moe_layer(int64_t layer) const;

  const Checkpoint* ck_ = nullptr;
  Backend* be_ = nullptr;
  ModelSpec spec_;
  Qwen3MoeConfig cfg_;
  WeightStore store_;                             // device copies of the weights (none on the CPU)
  std::vector<std::vector<float>> host_vectors_;  // decoded norms and biases
  MatView embed_, lm_head_;                       // [vocab, hidden]
  const float* final_norm_ = nullptr;             // [hidden] device
  const float* inv_freq_ = nullptr;               // [head_dim / 2] device
  std::vector<LayerWeights> layers_;
};

// The runtime registry's entry (runtime/registry.cpp).
std::unique_ptr<Model> load(const Checkpoint& ck, Backend& be);

}  // namespace moetier::qwen3_moe
