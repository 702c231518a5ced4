// Qwen3MoeModel::load: config, tensor map and validation of the non-expert
// weights (tensor names as transformers writes them).
#include <filesystem>

#include "core/error.h"
#include "format/safetensors.h"
#include "kernels/ref/ref.h"
#include "runtime/model.h"
#include "runtime/weights.h"

namespace moetier {
namespace {

using runtime::matrix_view;
using runtime::vector_f32;

AttentionWeights load_attention(const Checkpoint& ck, const Qwen3MoeConfig& c,
                                const std::string& p) {
  const int64_t h = c.hidden_size, qd = c.num_attention_heads * c.head_dim,
                kvd = c.num_key_value_heads * c.head_dim;
  AttentionWeights a;
  a.q = matrix_view(ck, p + "q_proj.weight", qd, h);
  a.k = matrix_view(ck, p + "k_proj.weight", kvd, h);
  a.v = matrix_view(ck, p + "v_proj.weight", kvd, h);
  a.o = matrix_view(ck, p + "o_proj.weight", h, qd);
  if (c.attention_bias) {
    a.q_bias = vector_f32(ck, p + "q_proj.bias", qd);
    a.k_bias = vector_f32(ck, p + "k_proj.bias", kvd);
    a.v_bias = vector_f32(ck, p + "v_proj.bias", kvd);
    a.o_bias = vector_f32(ck, p + "o_proj.bias", h);
  }
  a.q_norm = vector_f32(ck, p + "q_norm.weight", c.head_dim);
  a.k_norm = vector_f32(ck, p + "k_norm.weight", c.head_dim);
  return a;
}

LayerWeights load_layer(const Checkpoint& ck, const Qwen3MoeConfig& c, int64_t i) {
  const std::string p = layer_prefix(i);
  const int64_t h = c.hidden_size;
  LayerWeights l;
  l.input_norm = vector_f32(ck, p + "input_layernorm.weight", h);
  l.post_attention_norm = vector_f32(ck, p + "post_attention_layernorm.weight", h);
  l.attn = load_attention(ck, c, p + "self_attn.");
  l.moe = c.is_moe_layer(i);
  if (l.moe) {
    l.router = matrix_view(ck, p + "mlp.gate.weight", c.num_experts, h);
  } else {
    const int64_t in = c.intermediate_size;
    l.gate = matrix_view(ck, p + "mlp.gate_proj.weight", in, h);
    l.up = matrix_view(ck, p + "mlp.up_proj.weight", in, h);
    l.down = matrix_view(ck, p + "mlp.down_proj.weight", h, in);
  }
  return l;
}

void check_config(const Qwen3MoeConfig& c, const std::filesystem::path& file) {
  check(c.hidden_size > 0 && c.vocab_size > 0 && c.num_hidden_layers > 0,
        "{}: hidden_size, vocab_size and num_hidden_layers must be positive", file.string());
  check(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: head_dim {} must be positive and even",
        file.string(), c.head_dim);
  check(c.num_key_value_heads > 0 && c.num_attention_heads > 0 &&
            c.num_attention_heads % c.num_key_value_heads == 0,
        "{}: num_attention_heads {} must be a multiple of num_key_value_heads {}", file.string(),
        c.num_attention_heads, c.num_key_value_heads);
}

}  // namespace

Qwen3MoeModel Qwen3MoeModel::load(const Checkpoint& ck) {
  const auto file = ck.dir() / "config.json";
  Qwen3MoeModel m;
  m.ck_ = &ck;
  m.cfg_ = parse_qwen3_moe_config(ck.config(), file);
  const Qwen3MoeConfig& c = m.cfg_;
  check_config(c, file);
  m.embed_ = matrix_view(ck, "model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  m.lm_head_ = c.tie_word_embeddings
                   ? m.embed_
                   : matrix_view(ck, "lm_head.weight", c.vocab_size, c.hidden_size);
  m.final_norm_ = vector_f32(ck, "model.norm.weight", c.hidden_size);
  m.inv_freq_ = ref::rope_inv_freq(c.head_dim, c.rope_theta);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) m.layers_.push_back(load_layer(ck, c, i));
  return m;
}

}  // namespace moetier
