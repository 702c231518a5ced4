// Qwen3MoeModel::load: config, the tensor map (model/qwen3_moe/config.h) and
// validation of the non-expert weights, placed on the backend.
#include <filesystem>

#include "core/error.h"
#include "format/safetensors.h"
#include "kernels/ref/ref.h"
#include "model/architecture.h"
#include "runtime/qwen3_moe/model.h"
#include "runtime/weights.h"

namespace moetier::qwen3_moe {
namespace {

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

// Places checkpoint tensors on the backend.
struct Loader {
  const Checkpoint& ck;
  Backend& be;
  WeightStore& store;
  std::vector<std::vector<float>>& vectors;

  MatView matrix(const TensorSpec& t) {
    return be.weights(runtime::matrix_view(ck, t.name, t.shape[0], t.shape[1]), store);
  }
  const float* vec(const TensorSpec& t) {
    if (t.name.empty()) return nullptr;
    vectors.push_back(runtime::vector_f32(ck, t.name, t.shape[0]));
    return be.vector(vectors.back(), store);
  }
  const float* vec(const std::vector<float>& v) {
    vectors.push_back(v);
    return be.vector(vectors.back(), store);
  }

  LayerWeights layer(const Qwen3MoeLayerTensors& t, bool moe) {
    LayerWeights l;
    l.input_norm = vec(t.input_norm);
    l.post_attention_norm = vec(t.post_attention_norm);
    AttentionWeights& a = l.attn;
    a.q = matrix(t.q);
    a.k = matrix(t.k);
    a.v = matrix(t.v);
    a.o = matrix(t.o);
    a.q_bias = vec(t.q_bias);
    a.k_bias = vec(t.k_bias);
    a.v_bias = vec(t.v_bias);
    a.o_bias = vec(t.o_bias);
    a.q_norm = vec(t.q_norm);
    a.k_norm = vec(t.k_norm);
    l.moe = moe;
    if (moe) {
      l.router = matrix(t.router);
    } else {
      l.gate = matrix(t.gate);
      l.up = matrix(t.up);
      l.down = matrix(t.down);
    }
    return l;
  }
};

}  // namespace

std::unique_ptr<Qwen3MoeModel> Qwen3MoeModel::load(const Checkpoint& ck, Backend& be) {
  const auto file = ck.dir() / "config.json";
  std::unique_ptr<Qwen3MoeModel> m(new Qwen3MoeModel());
  m->ck_ = &ck;
  m->be_ = &be;
  m->spec_ = model_spec(ck);
  m->cfg_ = parse_qwen3_moe_config(ck.config(), file);
  const Qwen3MoeConfig& c = m->cfg_;
  check_config(c, file);
  const Qwen3MoeTensorMap map = qwen3_moe_tensor_map(c);
  Loader ld{ck, be, m->store_, m->host_vectors_};
  m->embed_ = ld.matrix(map.embed);
  m->lm_head_ = c.tie_word_embeddings ? m->embed_ : ld.matrix(map.lm_head);
  m->final_norm_ = ld.vec(map.final_norm);
  m->inv_freq_ = ld.vec(ref::rope_inv_freq(c.head_dim, c.rope_theta));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m->layers_.push_back(ld.layer(map.layers[size_t(i)], c.is_moe_layer(i)));
  return m;
}

std::unique_ptr<SequenceState> Qwen3MoeModel::new_state(int64_t capacity) const {
  return std::make_unique<State>(*be_, cfg_, capacity);
}

std::unique_ptr<Model> load(const Checkpoint& ck, Backend& be) {
  return Qwen3MoeModel::load(ck, be);
}

}  // namespace moetier::qwen3_moe
