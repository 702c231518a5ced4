// qwen3_moe config parsing (both config.json forms) and tensor map.
#include "model/qwen3_moe/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "format/json_util.h"
#include "format/safetensors.h"

namespace moetier {

namespace {

// The largest size field accepted (vocabularies, widths, counts): 2^31.
constexpr int64_t kMaxSize = int64_t(1) << 31;

using json = nlohmann::json;

// Reads typed fields of config.json, recording one line per problem.
struct Fields {
  const json& j;
  std::string file;
  std::vector<std::string>& problems;

  template <typename... Args>
  void bad(std::string_view field, fmt::format_string<Args...> f, Args&&... args) {
    problems.push_back(fmt::format("{}: field '{}': {}", file, field,
                                   fmt::format(f, std::forward<Args>(args)...)));
  }
  // The field, or null when absent or JSON null (publishers write null for "unset").
  const json* get(const json& obj, std::string_view name) const {
    auto it = obj.find(name);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<int64_t> integer(std::string_view name, bool required, const json* obj = nullptr,
                                 std::string_view shown = {}) {
    std::string_view field = shown.empty() ? name : shown;
    const json* v = get(obj ? *obj : j, name);
    if (!v) {
      if (required) bad(field, "missing (an integer)");
      return std::nullopt;
    }
    if (!v->is_number_integer()) {
      bad(field, "is {}, expected an integer", json_kind(*v));
      return std::nullopt;
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      bad(field, "{} is too large", v->get<uint64_t>());
      return std::nullopt;
    }
    return v->get<int64_t>();
  }
  std::optional<double> number(std::string_view name, const json* obj = nullptr,
                               std::string_view shown = {}) {
    const json* v = get(obj ? *obj : j, name);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
      bad(shown.empty() ? name : shown, "is {}, expected a number", json_kind(*v));
      return std::nullopt;
    }
    return v->get<double>();
  }
  std::optional<bool> boolean(std::string_view name) {
    const json* v = get(j, name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) {
      bad(name, "is {}, expected true or false", json_kind(*v));
      return std::nullopt;
    }
    return v->get<bool>();
  }
  std::optional<std::string> string(std::string_view name, const json* obj = nullptr,
                                    std::string_view shown = {}) {
    const json* v = get(obj ? *obj : j, name);
    if (!v) return std::nullopt;
    if (!v->is_string()) {
      bad(shown.empty() ? name : shown, "is {}, expected a string", json_kind(*v));
      return std::nullopt;
    }
    return v->get<std::string>();
  }
  // A required positive size.
  int64_t size(std::string_view name, bool required = true) {
    auto v = integer(name, required);
    if (!v) return 0;
    if (*v <= 0) {
      bad(name, "{} must be positive", *v);
      return 0;
    }
    if (*v > kMaxSize) {  // (products of two sizes stay far inside int64)
      bad(name, "{} is too large (at most {})", *v, kMaxSize);
      return 0;
    }
    return *v;
  }
};

void parse_sizes(Fields& f, Qwen3MoeConfig& c) {
  c.vocab_size = f.size("vocab_size");
  c.hidden_size = f.size("hidden_size");
  c.moe_intermediate_size = f.size("moe_intermediate_size");
  c.num_hidden_layers = f.size("num_hidden_layers");
  c.num_attention_heads = f.size("num_attention_heads");
  c.num_key_value_heads = f.size("num_key_value_heads");
  c.num_experts_per_tok = f.size("num_experts_per_tok");
  if (f.get(f.j, "intermediate_size")) c.intermediate_size = f.size("intermediate_size");
  if (f.get(f.j, "head_dim")) {
    c.head_dim = f.size("head_dim");
  } else if (c.hidden_size > 0 && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      f.bad("head_dim", "missing, and hidden_size {} is not divisible by num_attention_heads {}",
            c.hidden_size, c.num_attention_heads);
    else
      c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0)  // RoPE rotates pairs of dimensions
    f.bad("head_dim", "{} must be even", c.head_dim);
  if (c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
      c.num_attention_heads % c.num_key_value_heads != 0)
    f.bad("num_key_value_heads", "num_attention_heads {} is not divisible by {}",
          c.num_attention_heads, c.num_key_value_heads);
  if (auto v = f.integer("max_position_embeddings", false)) {
    if (*v <= 0)
      f.bad("max_position_embeddings", "{} must be positive", *v);
    else
      c.max_position_embeddings = *v;
  }
}

// transformers writes num_local_experts (attribute_map: num_experts -> num_local_experts);
// publishers write num_experts.
void parse_experts(Fields& f, Qwen3MoeConfig& c) {
  bool has_e = f.get(f.j, "num_experts"), has_l = f.get(f.j, "num_local_experts");
  if (!has_e && !has_l) {
    f.bad("num_experts", "missing (or num_local_experts)");
    return;
  }
  int64_t e = has_e ? f.size("num_experts") : 0;
  int64_t l = has_l ? f.size("num_local_experts") : 0;
  if (has_e && has_l && e != l && e > 0 && l > 0)
    f.bad("num_local_experts", "{} disagrees with num_experts {}", l, e);
  c.num_experts = has_e ? e : l;
  if (c.num_experts > 0 && c.num_experts_per_tok > c.num_experts)
    f.bad("num_experts_per_tok", "{} exceeds num_experts {}", c.num_experts_per_tok, c.num_experts);
}

void check_rope_type(Fields& f, const json& obj, std::string_view shown) {
  std::string key = obj.contains("rope_type") ? "rope_type" : "type";
  auto t = f.string(key, &obj, fmt::format("{}.{}", shown, key));
  if (t && *t != "default")
    f.bad(fmt::format("{}.{}", shown, key), "rope type '{}' is not supported (only 'default')",
          printable(*t));
  if (auto p = f.number("partial_rotary_factor", &obj); p && *p != 1.0)
    f.bad(fmt::format("{}.partial_rotary_factor", shown), "{} is not supported (only 1.0)", *p);
}

// Publisher form: rope_theta (+ rope_scaling, null or default); transformers 5.17:
// rope_parameters {rope_type: "default", rope_theta}.
void parse_rope(Fields& f, Qwen3MoeConfig& c) {
  std::optional<double> theta = f.number("rope_theta");
  if (const json* rp = f.get(f.j, "rope_parameters")) {
    if (!rp->is_object()) {
      f.bad("rope_parameters", "is {}, expected an object", json_kind(*rp));
    } else {
      check_rope_type(f, *rp, "rope_parameters");
      auto t2 = f.number("rope_theta", rp, "rope_parameters.rope_theta");
      if (theta && t2 && *theta != *t2)
        f.bad("rope_parameters.rope_theta", "{} disagrees with rope_theta {}", *t2, *theta);
      if (t2) theta = t2;
    }
  }
  if (const json* rs = f.get(f.j, "rope_scaling")) {
    if (!rs->is_object())
      f.bad("rope_scaling", "is {}, expected an object or null", json_kind(*rs));
    else
      check_rope_type(f, *rs, "rope_scaling");
  }
  c.rope_theta = theta.value_or(10000.0);
  if (c.rope_theta <= 0) f.bad("rope_theta", "{} must be positive", c.rope_theta);
}

void parse_layers(Fields& f, Qwen3MoeConfig& c) {
  if (auto s = f.integer("decoder_sparse_step", false)) {
    if (*s <= 0)
      f.bad("decoder_sparse_step", "{} must be positive", *s);
    else
      c.decoder_sparse_step = *s;
  }
  const json* m = f.get(f.j, "mlp_only_layers");
  if (!m) return;
  if (!m->is_array()) {
    f.bad("mlp_only_layers", "is {}, expected an array of layer indices", json_kind(*m));
    return;
  }
  for (const auto& x : *m) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        (c.num_hidden_layers > 0 && x.get<int64_t>() >= c.num_hidden_layers)) {
      f.bad("mlp_only_layers", "entry {} is not a layer index in [0, {})", printable(x.dump()),
            c.num_hidden_layers);
      continue;
    }
    c.mlp_only_layers.push_back(x.get<int64_t>());
  }
}

void parse_flags(Fields& f, Qwen3MoeConfig& c) {
  c.norm_topk_prob = f.boolean("norm_topk_prob").value_or(false);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings").value_or(false);
  c.attention_bias = f.boolean("attention_bias").value_or(false);
  if (f.boolean("use_sliding_window").value_or(false))
    f.bad("use_sliding_window", "sliding-window attention is not supported");
  if (auto act = f.string("hidden_act"); act && *act != "silu")
    f.bad("hidden_act", "'{}' is not supported (only 'silu')", printable(*act));
  if (auto eps = f.number("rms_norm_eps")) {
    if (*eps <= 0)
      f.bad("rms_norm_eps", "{} must be positive", *eps);
    else
      c.rms_norm_eps = *eps;
  }
  // transformers 5.17 writes "dtype"; publishers "torch_dtype".
  auto d = f.string("dtype");
  if (!d) d = f.string("torch_dtype");
  c.dtype = d.value_or("");
}

}  // namespace

bool Qwen3MoeConfig::is_moe_layer(int64_t layer) const {
  // As modeling_qwen3_moe.Qwen3MoeDecoderLayer.__init__.
  bool mlp_only =
      std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end();
  return !mlp_only && num_experts > 0 && decoder_sparse_step > 0 &&
         (layer + 1) % decoder_sparse_step == 0;
}

Qwen3MoeConfig parse_qwen3_moe_config(const json& j, const std::filesystem::path& file,
                                      std::vector<std::string>& problems) {
  Qwen3MoeConfig c;
  c.max_position_embeddings = 32768;
  if (!j.is_object()) {
    problems.push_back(
        fmt::format("{}: is {}, expected a JSON object", file.string(), json_kind(j)));
    return c;
  }
  Fields f{j, file.string(), problems};
  parse_sizes(f, c);
  parse_experts(f, c);
  parse_rope(f, c);
  parse_layers(f, c);
  parse_flags(f, c);
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) any_dense |= !c.is_moe_layer(l);
  if (any_dense && !f.get(j, "intermediate_size"))
    f.bad("intermediate_size", "missing (an integer; needed by the dense MLP layers)");
  return c;
}

Qwen3MoeConfig parse_qwen3_moe_config(const json& j, const std::filesystem::path& file) {
  std::vector<std::string> problems;
  Qwen3MoeConfig c = parse_qwen3_moe_config(j, file, problems);
  if (!problems.empty()) throw Error(problems.front());
  return c;
}

Qwen3MoeTensorMap qwen3_moe_tensor_map(const Qwen3MoeConfig& c) {
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  const MoeTensorNames names;
  Qwen3MoeTensorMap m;
  using R = TensorRole;
  m.embed = {"model.embed_tokens.weight", {c.vocab_size, H}, false, R::Embedding};
  m.final_norm = {"model.norm.weight", {H}, false, R::Norm};
  m.lm_head = {"lm_head.weight", {c.vocab_size, H}, c.tie_word_embeddings, R::LmHead};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = names.layer_prefix(l), a = p + "self_attn.";
    Qwen3MoeLayerTensors t;
    t.input_norm = {p + "input_layernorm.weight", {H}, false, R::Norm};
    t.post_attention_norm = {p + "post_attention_layernorm.weight", {H}, false, R::Norm};
    t.q = {a + "q_proj.weight", {q, H}};
    t.k = {a + "k_proj.weight", {kv, H}};
    t.v = {a + "v_proj.weight", {kv, H}};
    t.o = {a + "o_proj.weight", {H, q}, false, R::ResidualWrite};
    if (c.attention_bias) {
      t.q_bias = {a + "q_proj.bias", {q}};
      t.k_bias = {a + "k_proj.bias", {kv}};
      t.v_bias = {a + "v_proj.bias", {kv}};
      t.o_bias = {a + "o_proj.bias", {H}};
    }
    t.q_norm = {a + "q_norm.weight", {D}, false, R::Norm};
    t.k_norm = {a + "k_norm.weight", {D}, false, R::Norm};
    if (c.is_moe_layer(l)) {
      t.router = {names.router_tensor(l), {c.num_experts, H}, false, R::Router};
    } else {
      t.gate = {p + "mlp.gate_proj.weight", {I, H}};
      t.up = {p + "mlp.up_proj.weight", {I, H}};
      t.down = {p + "mlp.down_proj.weight", {H, I}, false, R::ResidualWrite};
    }
    m.layers.push_back(std::move(t));
  }
  return m;
}

}  // namespace moetier
