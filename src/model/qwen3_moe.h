// qwen3_moe: configuration and tensor map (no compute).
//
// config.json is accepted as publishers ship it (num_experts, rope_theta,
// torch_dtype) and as transformers 5.17 writes it (num_local_experts,
// rope_parameters, dtype). Every field that changes the computation is honored
// or refused with an error naming the field.
//
// Expert weights come in three layouts, all read in place:
//   stacked bf16/f32:  mlp.experts.gate_up_proj [E, 2I, H] (gate rows first),
//                      mlp.experts.down_proj    [E, H, I]
//   per-expert bf16/f32: mlp.experts.{e}.{gate,up,down}_proj.weight [out, in]
//   per-expert MXFP4:  mlp.experts.{e}.{gate,up,down}_proj.weight U8/I8 [out, in/2]
//                      (e2m1 pairs, low nibble = even element) and
//                      mlp.experts.{e}.{gate,up,down}_proj.scale F8_E8M0/U8
//                      [out, in/32] (one power-of-two scale per 32 elements)
//   per-expert CB3:    mlp.experts.{e}.{gate,up,down}_proj.weight U8
//                      [out, ceil(in*3/8)] (packed 3-bit codes, kernels/cb3.h)
//                      and mlp.experts.{e}.{gate,up,down}_proj.codebook F16
//                      [out, 8] (written by moetier repack --experts cb3)
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

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
  int64_t max_position_embeddings = 0;  // the trained context (32768 when config.json omits it)
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string dtype;  // "bfloat16", "float32", ...

  bool is_moe_layer(int64_t layer) const;
};

// Throws Error naming `file` and the field on a missing, mistyped or
// unsupported field (sliding window on, rope scaling, hidden_act != silu, ...).
// The architecture is checked first (model/architecture.h: model_type and
// architectures must name qwen3_moe); when it is not supported, that is the
// only problem reported and no other field is read.
Qwen3MoeConfig parse_qwen3_moe_config(const nlohmann::json& j, const std::filesystem::path& file);
// Same, but appends every problem (one line each, "FILE: field 'NAME': ...") to
// `problems` instead of throwing at the first; fields that did not parse keep
// their defaults (sizes 0).
Qwen3MoeConfig parse_qwen3_moe_config(const nlohmann::json& j, const std::filesystem::path& file,
                                      std::vector<std::string>& problems);

// A tensor the architecture needs and the shape the config implies.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// Every non-expert tensor: embeddings, per-layer norms and attention (with
// biases when attention_bias), routers of MoE layers, dense MLPs of the other
// layers, the final norm, and lm_head unless tie_word_embeddings.
std::vector<TensorSpec> qwen3_moe_core_tensors(const Qwen3MoeConfig& c);

enum class ExpertLayout { Stacked, PerExpert, PerExpertMxfp4, PerExpertCb3 };

// Where one expert's three projections live and how they are encoded.
struct ExpertTensors {
  ExpertLayout layout = ExpertLayout::PerExpert;
  // For Stacked: names of the stacked tensors; `index` selects the expert.
  // For PerExpert*: names of the per-expert tensors.
  std::string gate, up, down;                    // weights (Stacked: gate==up: gate_up_proj)
  std::string gate_scale, up_scale, down_scale;  // MXFP4 scales; CB3 codebooks
  int64_t index = 0;
};

std::string layer_prefix(int64_t layer);  // "model.layers.L."
ExpertLayout detect_expert_layout(const Checkpoint& ck, int64_t layer);
ExpertTensors expert_tensors(const Checkpoint& ck, int64_t layer, int64_t expert);

}  // namespace moetier
