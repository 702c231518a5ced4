// qwen3_moe's static side: names, config -> ModelSpec, tensor map.
#include "model/qwen3_moe/architecture.h"

#include "model/qwen3_moe/config.h"

namespace moetier::qwen3_moe {
namespace {

// The sizes the tensor map derives from are all known.
bool shapes_known(const Qwen3MoeConfig& c) {
  bool dense = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) dense |= !c.is_moe_layer(l);
  return c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 &&
         c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 &&
         c.num_experts > 0 && c.moe_intermediate_size > 0 && (!dense || c.intermediate_size > 0);
}

class Qwen3Moe final : public Architecture {
 public:
  std::string_view name() const override { return "qwen3_moe"; }
  std::vector<std::string_view> class_names() const override { return {"Qwen3MoeForCausalLM"}; }

  ModelSpec parse(const nlohmann::json& config, const std::filesystem::path& file,
                  std::vector<std::string>& problems) const override {
    const Qwen3MoeConfig c = parse_qwen3_moe_config(config, file, problems);
    ModelSpec s;
    s.arch = this;
    s.vocab_size = c.vocab_size;
    s.hidden_size = c.hidden_size;
    s.num_layers = c.num_hidden_layers;
    s.max_positions = c.max_position_embeddings;
    s.num_experts = c.num_experts;
    s.experts_per_token = c.num_experts_per_tok;
    s.expert_intermediate = c.moe_intermediate_size;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) s.moe.push_back(c.is_moe_layer(l) ? 1 : 0);
    s.kv_bytes_per_token =
        uint64_t(2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim) * 2;
    return s;
  }

  std::vector<TensorSpec> core_tensors(const nlohmann::json& config,
                                       const std::filesystem::path& file) const override {
    std::vector<std::string> problems;  // reported by parse(); the map needs only the sizes
    const Qwen3MoeConfig c = parse_qwen3_moe_config(config, file, problems);
    if (!shapes_known(c)) return {};
    const Qwen3MoeTensorMap m = qwen3_moe_tensor_map(c);
    std::vector<TensorSpec> out{m.embed};
    for (const Qwen3MoeLayerTensors& t : m.layers)
      for (const TensorSpec* x :
           {&t.input_norm, &t.post_attention_norm, &t.q, &t.k, &t.v, &t.o, &t.q_bias, &t.k_bias,
            &t.v_bias, &t.o_bias, &t.q_norm, &t.k_norm, &t.router, &t.gate, &t.up, &t.down})
        if (!x->name.empty()) out.push_back(*x);
    out.push_back(m.final_norm);
    out.push_back(m.lm_head);
    return out;
  }

  nlohmann::json with_num_experts(const nlohmann::json& config, int64_t n) const override {
    nlohmann::json c = config;
    if (c.contains("num_experts")) c["num_experts"] = n;
    if (c.contains("num_local_experts")) c["num_local_experts"] = n;
    return c;
  }
};

}  // namespace

const Architecture& architecture() {
  static const Qwen3Moe kArch;
  return kArch;
}

}  // namespace moetier::qwen3_moe
