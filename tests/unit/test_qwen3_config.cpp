// qwen3_moe config.json parsing: both forms, defaults, refusals, layer kinds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/qwen3_moe/architecture.h"
#include "model/qwen3_moe/config.h"
#include "qwen3_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using ::testing::ElementsAre;

namespace {

const fs::path kFile = "ck/config.json";

// As every command reads config.json: the architecture first (model/registry.cpp),
// then its parser.
std::vector<std::string> problems_of(const nlohmann::json& j) {
  std::vector<std::string> p;
  const Architecture* a = find_architecture(j, kFile.string(), p);
  if (p.empty()) (a ? *a : qwen3_moe::architecture()).parse(j, kFile, p);
  return p;
}

void parse_or_throw(const nlohmann::json& j) {
  std::vector<std::string> p;
  architecture_of(j, kFile).parse(j, kFile, p);
  if (!p.empty()) throw Error(p.front());
}

std::string only_problem(const nlohmann::json& j) {
  auto p = problems_of(j);
  EXPECT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  try {
    parse_or_throw(j);
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(p.empty() ? "" : p[0], e.what());
  }
  return p.empty() ? "" : p[0];
}

bool same(const Qwen3MoeConfig& a, const Qwen3MoeConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size &&
         a.moe_intermediate_size == b.moe_intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.num_experts == b.num_experts && a.num_experts_per_tok == b.num_experts_per_tok &&
         a.norm_topk_prob == b.norm_topk_prob && a.decoder_sparse_step == b.decoder_sparse_step &&
         a.mlp_only_layers == b.mlp_only_layers && a.rms_norm_eps == b.rms_norm_eps &&
         a.rope_theta == b.rope_theta && a.max_position_embeddings == b.max_position_embeddings &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.attention_bias == b.attention_bias &&
         a.dtype == b.dtype;
}

nlohmann::json base() { return tiny_config(Tiny{}); }

}  // namespace

TEST(Qwen3Config, BothFormsParseToTheSameConfig) {
  Tiny pub;
  pub.transformers_form = false;
  nlohmann::json a = tiny_config(Tiny{}), b = tiny_config(pub);
  ASSERT_NE(a, b);
  ASSERT_TRUE(a.contains("rope_parameters") && b.contains("rope_theta"));
  Qwen3MoeConfig ca = parse_qwen3_moe_config(a, kFile), cb = parse_qwen3_moe_config(b, kFile);
  EXPECT_TRUE(same(ca, cb));
  EXPECT_EQ(ca.vocab_size, 37);
  EXPECT_EQ(ca.hidden_size, 64);
  EXPECT_EQ(ca.intermediate_size, 48);
  EXPECT_EQ(ca.moe_intermediate_size, 32);
  EXPECT_EQ(ca.num_hidden_layers, 3);
  EXPECT_EQ(ca.num_attention_heads, 4);
  EXPECT_EQ(ca.num_key_value_heads, 2);
  EXPECT_EQ(ca.head_dim, 24);  // given, not hidden/heads = 16
  EXPECT_EQ(ca.num_experts, 5);
  EXPECT_EQ(ca.num_experts_per_tok, 2);
  EXPECT_TRUE(ca.norm_topk_prob);
  EXPECT_EQ(ca.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_EQ(ca.rope_theta, 1000000.0);
  EXPECT_EQ(ca.rms_norm_eps, 1e-6);
  EXPECT_EQ(ca.max_position_embeddings, 512);
  EXPECT_EQ(ca.dtype, "bfloat16");
  // Both expert-count spellings at once are fine when they agree.
  a["num_experts"] = 5;
  EXPECT_TRUE(same(parse_qwen3_moe_config(a, kFile), cb));
}

TEST(Qwen3Config, PublisherConfigOfQwen3_30B_A3B) {
  // config.json of Qwen/Qwen3-30B-A3B as published (fields that matter).
  auto j = nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  Qwen3MoeConfig c = parse_qwen3_moe_config(j, kFile);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_experts, 128);
  for (int64_t l = 0; l < 48; ++l) EXPECT_TRUE(c.is_moe_layer(l));
  // lm_head + embed + 48 x (attention, norms, router) = the core tensor map.
  auto core = qwen3_moe::architecture().core_tensors(j, kFile);
  EXPECT_EQ(core.size(), 2u + 1u + 48u * 9u);
  EXPECT_EQ(core.back().name, "lm_head.weight");
  EXPECT_EQ(core.back().shape, (std::vector<int64_t>{151936, 2048}));
}

TEST(Qwen3Config, MoeLayersFollowSparseStepAndMlpOnlyLayers) {
  auto j = base();
  j["num_hidden_layers"] = 7;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  Qwen3MoeConfig c = parse_qwen3_moe_config(j, kFile);
  // (layer + 1) % 2 == 0 and not in mlp_only_layers, as Qwen3MoeDecoderLayer.
  std::vector<bool> moe;
  for (int64_t l = 0; l < 7; ++l) moe.push_back(c.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true, false}));
  auto core = qwen3_moe::architecture().core_tensors(j, kFile);
  auto has = [&](const std::string& n) {
    return std::any_of(core.begin(), core.end(), [&](const TensorSpec& s) { return s.name == n; });
  };
  EXPECT_TRUE(has("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(has("model.layers.3.mlp.gate.weight"));
  EXPECT_TRUE(has("model.layers.3.mlp.gate_proj.weight"));
}

TEST(Qwen3Config, HeadDimDefaultsToHiddenOverHeads) {
  auto j = base();
  j.erase("head_dim");
  EXPECT_EQ(parse_qwen3_moe_config(j, kFile).head_dim, 16);
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse_qwen3_moe_config(j, kFile).head_dim, 16);
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 3;
  EXPECT_EQ(only_problem(j),
            "ck/config.json: field 'head_dim': missing, and hidden_size 64 is "
            "not divisible by num_attention_heads 6");
}

TEST(Qwen3Config, AttentionBiasAddsBiasTensors) {
  auto j = base();
  j["attention_bias"] = true;
  Qwen3MoeConfig c = parse_qwen3_moe_config(j, kFile);
  EXPECT_TRUE(c.attention_bias);
  auto core = qwen3_moe::architecture().core_tensors(j, kFile);
  auto it = std::find_if(core.begin(), core.end(), [](const TensorSpec& s) {
    return s.name == "model.layers.0.self_attn.k_proj.bias";
  });
  ASSERT_NE(it, core.end());
  EXPECT_EQ(it->shape, std::vector<int64_t>{48});
}

// One edit of the base config and the one problem line it must give.
struct Edit {
  std::string field;
  nlohmann::json value;  // unused when erase
  std::string want;      // the line after "ck/config.json: "
  bool erase = false;
};

void expect_only_problem(const std::vector<Edit>& edits) {
  for (const Edit& e : edits) {
    auto j = base();
    if (e.erase)
      j.erase(e.field);
    else
      j[e.field] = e.value;
    EXPECT_EQ(only_problem(j), "ck/config.json: " + e.want) << e.field;
  }
}

TEST(Qwen3Config, Refusals) {
  expect_only_problem({
      {"use_sliding_window", true,
       "field 'use_sliding_window': sliding-window attention is not supported"},
      {"rope_parameters",
       {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}},
       "field 'rope_parameters.rope_type': rope type 'yarn' is not supported (only 'default')"},
      {"hidden_act", "gelu", "field 'hidden_act': 'gelu' is not supported (only 'silu')"},
      {"num_experts_per_tok", 6, "field 'num_experts_per_tok': 6 exceeds num_experts 5"},
      {"num_key_value_heads", 3,
       "field 'num_key_value_heads': num_attention_heads 4 is not divisible by 3"},
      {"hidden_size", 0, "field 'hidden_size': 0 must be positive"},
      {"moe_intermediate_size", -32, "field 'moe_intermediate_size': -32 must be positive"},
      {"decoder_sparse_step", 0, "field 'decoder_sparse_step': 0 must be positive"},
      {"head_dim", 7, "field 'head_dim': 7 must be even"},
      {"vocab_size", int64_t(1) << 40,
       "field 'vocab_size': 1099511627776 is too large (at most 2147483648)"},
  });
  Tiny pub;
  pub.transformers_form = false;
  auto j = tiny_config(pub);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(only_problem(j),
            "ck/config.json: field 'rope_scaling.type': rope type 'linear' is "
            "not supported (only 'default')");
}

TEST(Qwen3Config, TypeErrorsAndMissingFields) {
  expect_only_problem({
      {"vocab_size", "37", "field 'vocab_size': is a string, expected an integer"},
      {"num_hidden_layers", {}, "field 'num_hidden_layers': missing (an integer)", true},
      {"num_local_experts", {}, "field 'num_experts': missing (or num_local_experts)", true},
      {"num_experts", 6, "field 'num_local_experts': 5 disagrees with num_experts 6"},
      {"tie_word_embeddings", 1,
       "field 'tie_word_embeddings': is an integer, expected true or false"},
      {"mlp_only_layers",
       {1, 9},
       "field 'mlp_only_layers': entry 9 is not a layer index in [0, 3)"},
      {"rope_theta", 5.0,
       "field 'rope_parameters.rope_theta': 1000000 disagrees with rope_theta 5"},
  });
  auto j = base();
  j.erase("intermediate_size");  // layer 1 is dense and needs it
  EXPECT_EQ(only_problem(j),
            "ck/config.json: field 'intermediate_size': missing (an integer; "
            "needed by the dense MLP layers)");
  j["mlp_only_layers"] = nlohmann::json::array();
  EXPECT_TRUE(problems_of(j).empty());
  EXPECT_EQ(only_problem(nlohmann::json::array()),
            "ck/config.json: is an array, expected a JSON object");
}

TEST(Qwen3Config, CollectsEveryProblem) {
  auto j = base();
  j["use_sliding_window"] = true;
  j["hidden_act"] = "relu";
  j["vocab_size"] = -1;
  EXPECT_EQ(problems_of(j).size(), 3u);
}

// The architecture comes first, with the line moetier check gives; nothing else
// is read when it is not supported.
TEST(Qwen3Config, AnUnsupportedArchitectureIsTheOnlyProblem) {
  auto j = base();
  j["model_type"] = "no_such_arch";
  j["vocab_size"] = "many";
  EXPECT_EQ(only_problem(j),
            "ck/config.json: architecture 'no_such_arch' is not supported (supported: qwen3_moe)");
  j = base();
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_EQ(only_problem(j),
            "ck/config.json: field 'architectures': 'LlamaForCausalLM' is not supported "
            "(supported: Qwen3MoeForCausalLM)");
  j.erase("model_type");
  EXPECT_EQ(only_problem(j),
            "ck/config.json: architecture 'LlamaForCausalLM' is not supported (supported: "
            "qwen3_moe)");
  j.erase("architectures");
  EXPECT_EQ(only_problem(j), "ck/config.json: field 'model_type': missing (supported: qwen3_moe)");
  EXPECT_EQ(only_problem(nlohmann::json::array()),
            "ck/config.json: is an array, expected a JSON object");
}

TEST(Qwen3Config, MaxPositionEmbeddingsIsPositiveAndDefaultsTo32768) {
  auto j = base();
  j.erase("max_position_embeddings");
  EXPECT_EQ(parse_qwen3_moe_config(j, kFile).max_position_embeddings, 32768);
  j["max_position_embeddings"] = 0;
  EXPECT_EQ(only_problem(j), "ck/config.json: field 'max_position_embeddings': 0 must be positive");
}
