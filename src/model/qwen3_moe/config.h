// qwen3_moe: configuration and tensor map (no compute).
//
// config.json is accepted as publishers ship it (num_experts, rope_theta,
// torch_dtype) and as transformers 5.17 writes it (num_local_experts,
// rope_parameters, dtype). Every field that changes the computation is honored
// or refused with an error naming the field. Experts use the layouts of
// model/spec.h with the default MoeTensorNames.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;

struct Qwen3MoeConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers (mlp_only_layers)
  int64_t moe_intermediate_size = 0;  // per expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string dtype;  // "bfloat16", "float32", ...

  bool is_moe_layer(int64_t layer) const;
};

// Throws Error naming `file` and the field on a missing, mistyped or
// unsupported field (sliding window on, rope scaling, hidden_act != silu, ...).
Qwen3MoeConfig parse_qwen3_moe_config(const nlohmann::json& j, const std::filesystem::path& file);
// Same, but appends every problem (one line each, "FILE: field 'NAME': ...") to
// `problems` instead of throwing at the first; fields that did not parse keep
// their defaults (sizes 0).
Qwen3MoeConfig parse_qwen3_moe_config(const nlohmann::json& j, const std::filesystem::path& file,
                                      std::vector<std::string>& problems);

// The ONE tensor map of qwen3_moe: every non-expert tensor's name and the shape
// the config implies (experts: model/spec.h's layouts with the default
// MoeTensorNames). `moetier check` requires it; the forward pass loads it.
struct Qwen3MoeLayerTensors {
  TensorSpec input_norm, post_attention_norm;  // [H]
  TensorSpec q, k, v, o;                       // [heads*D, H], [kv*D, H] x2, [H, heads*D]
  TensorSpec q_bias, k_bias, v_bias, o_bias;   // attention_bias only (else empty names)
  TensorSpec q_norm, k_norm;                   // [D]
  TensorSpec router;                           // MoE layers: [E, H]
  TensorSpec gate, up, down;                   // dense layers: [I, H], [I, H], [H, I]
};
struct Qwen3MoeTensorMap {
  TensorSpec embed;       // [vocab, H]
  TensorSpec final_norm;  // [H]
  TensorSpec lm_head;     // [vocab, H]; optional when tie_word_embeddings
  std::vector<Qwen3MoeLayerTensors> layers;
};
Qwen3MoeTensorMap qwen3_moe_tensor_map(const Qwen3MoeConfig& c);

}  // namespace moetier
