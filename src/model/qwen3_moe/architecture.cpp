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

  std::vector<std::string_view> presets() const override {
    return {"qwen3-30b-a3b", "deepseek-v4-flash-experts"};
  }

  // Qwen3-30B-A3B as published (48 layers, 128 experts of 768, top-8, vocab
  // 151936), and DeepSeek-V4-Flash's expert shapes (hidden 4096, 256 experts
  // of 2048, top-6) around a deliberately small attention (8 query heads, 1
  // kv head) and vocabulary (8192), so the experts dominate the bytes.
  nlohmann::json preset(std::string_view name) const override {
    nlohmann::json c = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"head_dim", 128},
                        {"decoder_sparse_step", 1},
                        {"mlp_only_layers", nlohmann::json::array()},
                        {"norm_topk_prob", true},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 1000000.0},
                        {"max_position_embeddings", 40960},
                        {"tie_word_embeddings", false},
                        {"attention_bias", false},
                        {"hidden_act", "silu"},
                        {"use_sliding_window", false},
                        {"torch_dtype", "bfloat16"}};
    if (name == "qwen3-30b-a3b") {
      c.update({{"vocab_size", 151936},
                {"hidden_size", 2048},
                {"intermediate_size", 6144},
                {"moe_intermediate_size", 768},
                {"num_hidden_layers", 48},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 4},
                {"num_experts", 128},
                {"num_experts_per_tok", 8}});
      return c;
    }
    if (name == "deepseek-v4-flash-experts") {
      c.update({{"vocab_size", 8192},
                {"hidden_size", 4096},
                {"intermediate_size", 2048},
                {"moe_intermediate_size", 2048},
                {"num_hidden_layers", 43},
                {"num_attention_heads", 8},
                {"num_key_value_heads", 1},
                {"num_experts", 256},
                {"num_experts_per_tok", 6}});
      return c;
    }
    return nullptr;
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
