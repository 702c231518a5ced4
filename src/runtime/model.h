// Qwen3MoeModel: the qwen3_moe forward pass on the CPU (HF transformers 5.17
// modeling_qwen3_moe.py, computed in f32).
//
// Weights are views into the Checkpoint's read-only mmap (f32 / bf16 matrices
// are not copied; norms and biases are decoded to small f32 vectors), so the
// Checkpoint must outlive the model. Expert weights are never read here: the
// forward pass obtains them through an ExpertProvider.
//
// Thread-safety: the model is immutable after load(); forward() may run for
// different sequences (KvCache, ExpertProvider) from different threads, each
// call using the thread pool inside its kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "experts/provider.h"
#include "model/qwen3_moe.h"
#include "runtime/kv_cache.h"
#include "runtime/routing.h"

namespace moetier {

class Checkpoint;

struct AttentionWeights {
  MatView q, k, v, o;  // q [heads*hd, H], k/v [kv*hd, H], o [H, heads*hd]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty unless attention_bias
  std::vector<float> q_norm, k_norm;                  // [head_dim]
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;  // [hidden]
  AttentionWeights attn;
  bool moe = false;
  MatView router;          // moe: [num_experts, hidden]
  MatView gate, up, down;  // dense mlp: [I, H], [I, H], [H, I]
};

struct ForwardOptions {
  bool all_logits = false;  // logits for every token of the chunk, not just the last
  const RoutingObserver* observer = nullptr;
};

class Qwen3MoeModel {
 public:
  // Validates the config and every non-expert tensor (dtype, shape, bytes).
  static Qwen3MoeModel load(const Checkpoint& ck);

  const Qwen3MoeConfig& config() const { return cfg_; }
  const Checkpoint& checkpoint() const { return *ck_; }
  const LayerWeights& layer(int64_t i) const { return layers_[size_t(i)]; }

  // Runs tokens [n] at positions start_pos.. start_pos+n-1 (see KvCache for
  // the rules on start_pos). Returns logits [vocab] for the last token, or
  // [n, vocab] with all_logits. Phase is Prefill when n > 1, else Decode.
  std::vector<float> forward(std::span<const int32_t> tokens, int64_t start_pos, KvCache& kv,
                             ExpertProvider& experts, const ForwardOptions& opt = {}) const;

 private:
  Qwen3MoeModel() = default;
  void attention(int64_t layer, float* x, int64_t n, int64_t start_pos, KvCache& kv) const;
  void dense_mlp(int64_t layer, const float* xn, int64_t n, float* out) const;
  void moe(int64_t layer, const float* xn, std::span<const int32_t> tokens, int64_t start_pos,
           ExpertProvider& experts, const ForwardOptions& opt, float* out) const;

  const Checkpoint* ck_ = nullptr;
  Qwen3MoeConfig cfg_;
  MatView embed_, lm_head_;        // [vocab, hidden]
  std::vector<float> final_norm_;  // [hidden]
  std::vector<float> inv_freq_;    // [head_dim / 2]
  std::vector<LayerWeights> layers_;
};

}  // namespace moetier
