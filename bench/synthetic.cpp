#include "synthetic.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "format/safetensors_writer.h"
#include "model/architecture.h"

namespace moetier::bench {

namespace {

nlohmann::json config(const SyntheticSpec& s) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", s.vocab},
          {"hidden_size", s.hidden},
          {"intermediate_size", 2 * s.moe_inter},
          {"moe_intermediate_size", s.moe_inter},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"num_local_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", nlohmann::json::array()},
          {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 4096},
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"hidden_act", "silu"},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
          {"dtype", "bfloat16"}};
}

// Owns the bytes of every tensor until the checkpoint is written.
struct Tensors {
  std::vector<std::vector<std::byte>> store;
  std::vector<TensorToWrite> list;
  std::mt19937 rng;
  explicit Tensors(uint32_t seed) : rng(seed) {}

  void bf16(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<std::byte> b(size_t(n) * 2);
    std::normal_distribution<float> dist(mean, scale);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = f32_to_bf16(dist(rng));
      std::memcpy(b.data() + i * 2, &h, 2);
    }
    add(name, DType::BF16, std::move(shape), std::move(b));
  }
  void bytes(const std::string& name, DType t, std::vector<int64_t> shape, uint8_t lo, uint8_t hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<std::byte> b(static_cast<size_t>(n));
    std::uniform_int_distribution<int> dist(lo, hi);
    for (auto& x : b) x = std::byte(dist(rng));
    add(name, t, std::move(shape), std::move(b));
  }
  void add(const std::string& name, DType t, std::vector<int64_t> shape, std::vector<std::byte> b) {
    store.push_back(std::move(b));
    list.push_back({name, t, std::move(shape), {}});
  }
  void finish() {
    for (size_t i = 0; i < list.size(); ++i) list[i].data = store[i];
  }
};

}  // namespace

void write_synthetic(const std::filesystem::path& dir, const SyntheticSpec& s) {
  const nlohmann::json cj = config(s);
  const Architecture& arch = architecture_of(cj, dir / "config.json");
  const MoeTensorNames& names = arch.names();
  Tensors t(s.seed);
  const float w = 1.0f / std::sqrt(float(s.hidden));
  for (const TensorSpec& spec : arch.core_tensors(cj, dir / "config.json")) {
    if (spec.optional) continue;
    bool norm = spec.shape.size() == 1;
    t.bf16(spec.name, spec.shape, norm ? 0.05f : w, norm ? 1.0f : 0.0f);
  }
  const int64_t H = s.hidden, I = s.moe_inter;
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int64_t e = 0; e < s.experts; ++e) {
      std::string q = names.experts_prefix(l) + std::to_string(e) + ".";
      for (const std::string& proj : names.projs) {
        bool down = proj == names.projs[2];
        int64_t o = down ? H : I, in = down ? I : H;
        if (s.mxfp4) {
          t.bytes(q + proj + ".weight", DType::U8, {o, in / 2}, 0, 255);
          // scales around 2^-5 keep activations in range
          t.bytes(q + proj + ".scale", DType::F8_E8M0, {o, in / 32}, 120, 123);
        } else {
          t.bf16(q + proj + ".weight", {o, in}, w);
        }
      }
    }
  }
  t.finish();
  std::vector<std::vector<TensorToWrite>> shards(size_t(std::max(1, s.shards)));
  for (size_t i = 0; i < t.list.size(); ++i)
    shards[i * shards.size() / t.list.size()].push_back(t.list[i]);
  SafetensorsWriteOptions opt;
  opt.align = 4096;
  write_checkpoint(dir, cj, shards, opt);
}

}  // namespace moetier::bench
