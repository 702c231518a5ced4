// Test fixtures: tiny qwen3_moe checkpoints written with the safetensors
// writer (random values, odd sizes), plus helpers to corrupt copies of them.
// Header-only: each test_*.cpp is its own executable.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"

namespace moetier::testing {

namespace fs = std::filesystem;

// The problems parse_safetensors_header reports for file f (shard 0).
inline std::vector<std::string> parse_problems(const fs::path& f) {
  Shard s;
  std::vector<std::string> problems;
  parse_safetensors_header(f, 0, s, problems);
  return problems;
}

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "moetier-test-XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

enum class Layout { Stacked, PerExpert, Mxfp4 };

struct Tiny {
  // Sizes: odd where the architecture allows (MXFP4 needs multiples of 32).
  int64_t vocab = 37, hidden = 64, inter = 48, moe_inter = 32, layers = 3, heads = 4, kv = 2,
          head_dim = 24, experts = 5, top_k = 2;
  std::vector<int64_t> mlp_only = {1};  // layers 0 and 2 are MoE
  bool tie = false, bias = false, transformers_form = true;
  Layout layout = Layout::Stacked;
  int shards = 2;
  uint64_t align = 0;
  std::set<std::string> omit;                           // tensors left out
  std::map<std::string, std::vector<int64_t>> reshape;  // shapes overridden
  std::map<std::string, DType> retype;                  // dtypes overridden
  uint32_t seed = 1234;
};

inline nlohmann::json tiny_config(const Tiny& t) {
  nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                      {"model_type", "qwen3_moe"},
                      {"vocab_size", t.vocab},
                      {"hidden_size", t.hidden},
                      {"intermediate_size", t.inter},
                      {"moe_intermediate_size", t.moe_inter},
                      {"num_hidden_layers", t.layers},
                      {"num_attention_heads", t.heads},
                      {"num_key_value_heads", t.kv},
                      {"head_dim", t.head_dim},
                      {"num_experts_per_tok", t.top_k},
                      {"norm_topk_prob", true},
                      {"decoder_sparse_step", 1},
                      {"mlp_only_layers", t.mlp_only},
                      {"rms_norm_eps", 1e-6},
                      {"max_position_embeddings", 512},
                      {"tie_word_embeddings", t.tie},
                      {"attention_bias", t.bias},
                      {"hidden_act", "silu"},
                      {"use_sliding_window", false},
                      {"sliding_window", nullptr}};
  if (t.transformers_form) {
    j["num_local_experts"] = t.experts;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
    j["dtype"] = "bfloat16";
  } else {
    j["num_experts"] = t.experts;
    j["rope_theta"] = 1000000.0;
    j["rope_scaling"] = nullptr;
    j["torch_dtype"] = "bfloat16";
  }
  return j;
}

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

inline bool tiny_is_moe(const Tiny& t, int64_t l) {
  for (int64_t d : t.mlp_only)
    if (d == l) return false;
  return true;
}

inline void tiny_experts(const Tiny& t, const std::string& p, std::vector<Spec>& out) {
  const int64_t H = t.hidden, I = t.moe_inter;
  if (t.layout == Layout::Stacked) {
    out.push_back({p + "mlp.experts.gate_up_proj", DType::BF16, {t.experts, 2 * I, H}});
    out.push_back({p + "mlp.experts.down_proj", DType::BF16, {t.experts, H, I}});
    return;
  }
  for (int64_t e = 0; e < t.experts; ++e) {
    std::string q = p + "mlp.experts." + std::to_string(e) + ".";
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      bool down = std::string(proj) == "down_proj";
      int64_t o = down ? H : I, in = down ? I : H;
      if (t.layout == Layout::PerExpert) {
        out.push_back({q + proj + ".weight", DType::BF16, {o, in}});
      } else {
        out.push_back({q + proj + ".weight", DType::U8, {o, in / 2}});
        out.push_back({q + proj + ".scale", DType::F8_E8M0, {o, in / 32}});
      }
    }
  }
}

// Every tensor of the tiny model, written out by hand (independent of the
// library's own tensor map, which the tests check).
inline std::vector<Spec> tiny_specs(const Tiny& t) {
  const int64_t H = t.hidden, D = t.head_dim, Q = t.heads * D, KV = t.kv * D;
  std::vector<Spec> out{{"model.embed_tokens.weight", DType::BF16, {t.vocab, H}}};
  for (int64_t l = 0; l < t.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", DType::BF16, {H}});
    out.push_back({p + "post_attention_layernorm.weight", DType::BF16, {H}});
    out.push_back({p + "self_attn.q_proj.weight", DType::BF16, {Q, H}});
    out.push_back({p + "self_attn.k_proj.weight", DType::BF16, {KV, H}});
    out.push_back({p + "self_attn.v_proj.weight", DType::BF16, {KV, H}});
    out.push_back({p + "self_attn.o_proj.weight", DType::BF16, {H, Q}});
    if (t.bias) {
      out.push_back({p + "self_attn.q_proj.bias", DType::BF16, {Q}});
      out.push_back({p + "self_attn.k_proj.bias", DType::BF16, {KV}});
      out.push_back({p + "self_attn.v_proj.bias", DType::BF16, {KV}});
      out.push_back({p + "self_attn.o_proj.bias", DType::BF16, {H}});
    }
    out.push_back({p + "self_attn.q_norm.weight", DType::BF16, {D}});
    out.push_back({p + "self_attn.k_norm.weight", DType::BF16, {D}});
    if (tiny_is_moe(t, l)) {
      out.push_back({p + "mlp.gate.weight", DType::BF16, {t.experts, H}});
      tiny_experts(t, p, out);
    } else {
      out.push_back({p + "mlp.gate_proj.weight", DType::BF16, {t.inter, H}});
      out.push_back({p + "mlp.up_proj.weight", DType::BF16, {t.inter, H}});
      out.push_back({p + "mlp.down_proj.weight", DType::BF16, {H, t.inter}});
    }
  }
  out.push_back({"model.norm.weight", DType::BF16, {H}});
  if (!t.tie) out.push_back({"lm_head.weight", DType::BF16, {t.vocab, H}});
  return out;
}

// What was written: tensor -> bytes and tensor -> shard file name.
struct Written {
  std::map<std::string, std::vector<std::byte>> data;
  std::map<std::string, std::string> file;
  std::map<std::string, Spec> spec;
};

inline std::vector<std::byte> random_bytes(const Spec& s, std::mt19937& rng) {
  size_t n = dtype_size(s.dtype);
  for (int64_t d : s.shape) n *= size_t(d);
  std::vector<std::byte> b(n);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::uniform_int_distribution<int> bytes(0, 255), exps(118, 130);
  for (size_t i = 0; i < n;) {
    if (s.dtype == DType::BF16) {
      uint16_t h = f32_to_bf16(nd(rng) + 0.01f);
      std::memcpy(&b[i], &h, 2);
      i += 2;
    } else {
      b[i++] = std::byte(s.dtype == DType::F8_E8M0 ? exps(rng) : bytes(rng));
    }
  }
  return b;
}

// Writes the tiny checkpoint to `dir` (which must not exist).
inline Written write_tiny(const fs::path& dir, const Tiny& t) {
  std::mt19937 rng(t.seed);
  Written w;
  std::vector<Spec> specs;
  for (auto s : tiny_specs(t)) {
    if (t.omit.count(s.name)) continue;
    if (t.reshape.count(s.name)) s.shape = t.reshape.at(s.name);
    if (t.retype.count(s.name)) s.dtype = t.retype.at(s.name);
    w.data[s.name] = random_bytes(s, rng);
    w.spec[s.name] = s;
    specs.push_back(s);
  }
  std::vector<std::vector<TensorToWrite>> shards(size_t(t.shards));
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t k = i * size_t(t.shards) / specs.size();
    const Spec& s = specs[i];
    shards[k].push_back({s.name, s.dtype, s.shape, w.data[s.name]});
    w.file[s.name] = t.shards == 1
                         ? "model.safetensors"
                         : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, t.shards);
  }
  SafetensorsWriteOptions opt;
  opt.align = t.align;
  write_checkpoint(dir, tiny_config(t), shards, opt);
  return w;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), std::streamsize(s.size()));
}

// A safetensors file split into header JSON and data section.
struct RawShard {
  nlohmann::json header;
  std::string data;
};

inline RawShard read_raw(const fs::path& p) {
  std::string s = read_file(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[size_t(i)]);
  return {nlohmann::json::parse(s.substr(8, n)), s.substr(8 + n)};
}

inline std::string length_prefix(uint64_t n) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return len;
}

// Writes header text (verbatim) + data.
inline void write_raw_text(const fs::path& p, const std::string& header, const std::string& data) {
  write_file(p, length_prefix(header.size()) + header + data);
}

inline void write_raw(const fs::path& p, const RawShard& r) {
  write_raw_text(p, r.header.dump(), r.data);
}

// Tensors of a header sorted by data offset: (name, begin, end).
struct Range {
  std::string name;
  uint64_t begin, end;
};
inline std::vector<Range> sorted_ranges(const nlohmann::json& h) {
  std::vector<Range> r;
  for (const auto& [k, v] : h.items())
    if (k != "__metadata__")
      r.push_back({k, v["data_offsets"][0].get<uint64_t>(), v["data_offsets"][1].get<uint64_t>()});
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return r;
}

inline void copy_dir(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

}  // namespace moetier::testing
