// ModelSpec: what the engine and the tools need to know about a model,
// whatever its architecture (sizes, which layers are MoE, the experts), and
// MoeTensorNames: how a checkpoint names its MoE tensors. Both come from an
// Architecture (model/architecture.h); nothing here names one.
//
// Expert weights come in four layouts, all read in place:
//   stacked bf16/f32:  E.experts + stacked_gate_up [E, 2I, H] (gate rows first),
//                      E.experts + stacked_down    [E, H, I]
//   per-expert bf16/f32: E.experts + "{e}.{proj}.weight" [out, in]
//   per-expert MXFP4:  "{e}.{proj}.weight" U8/I8 [out, in/2] (e2m1 pairs, low
//                      nibble = even element) and "{e}.{proj}.scale"
//                      F8_E8M0/U8 [out, in/32] (one power-of-two scale per 32)
//   per-expert CB3:    "{e}.{proj}.weight" U8 [out, ceil(in*3/8)] (packed 3-bit
//                      codes, kernels/cb3.h) and "{e}.{proj}.codebook" F16
//                      [out, 8] (written by moetier repack --experts cb3)
// where E.experts is names.experts_prefix(layer) and proj is one of
// names.projs (gate, up, down).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace moetier {

class Architecture;
class Checkpoint;

// What a tensor does (moetier synth picks values by it).
enum class TensorRole : uint8_t { Other, Embedding, Norm, Router, ResidualWrite, LmHead };

// A tensor an architecture needs and the shape its config implies.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool optional = false;  // checked when present (lm_head of a tied model)
  TensorRole role = TensorRole::Other;
};

// How a checkpoint names its MoE tensors (the transformers convention of
// Qwen-, DeepSeek- and Mixtral-style checkpoints by default).
struct MoeTensorNames {
  std::string layers = "model.layers.";  // layer L's tensors: layers + "L."
  std::string router = "mlp.gate.weight";
  std::string experts = "mlp.experts.";
  std::array<std::string, 3> projs = {"gate_proj", "up_proj", "down_proj"};
  std::string stacked_gate_up = "gate_up_proj", stacked_down = "down_proj";

  std::string layer_prefix(int64_t layer) const;    // "model.layers.L."
  std::string experts_prefix(int64_t layer) const;  // "model.layers.L.mlp.experts."
  std::string router_tensor(int64_t layer) const;   // "model.layers.L.mlp.gate.weight"
};

enum class ExpertLayout { Stacked, PerExpert, PerExpertMxfp4, PerExpertCb3 };

// Where one expert's three projections live and how they are encoded.
struct ExpertTensors {
  ExpertLayout layout = ExpertLayout::PerExpert;
  // Stacked: names of the stacked tensors (gate == up: the gate_up tensor);
  // `index` selects the expert. PerExpert*: names of the per-expert tensors.
  std::string gate, up, down;
  std::string gate_scale, up_scale, down_scale;  // MXFP4 scales; CB3 codebooks
  int64_t index = 0;
};

struct ModelSpec {
  const Architecture* arch = nullptr;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t max_positions = 0;  // the trained context (max_position_embeddings)
  int64_t num_experts = 0;    // per MoE layer
  int64_t experts_per_token = 0;
  int64_t expert_intermediate = 0;  // I of one SwiGLU expert
  std::vector<uint8_t> moe;         // [num_layers] 1 for an MoE layer
  uint64_t kv_bytes_per_token = 0;  // per-sequence state per position, bf16 (memory plans)

  bool is_moe_layer(int64_t layer) const {
    return layer >= 0 && layer < num_layers && moe[size_t(layer)] != 0;
  }
  std::vector<int64_t> moe_layers() const;
  const MoeTensorNames& names() const;
};

// The expert layout of `layer` found in ck (throws Error naming the missing
// tensor when the layer has experts in no supported layout), and the tensors
// of one expert (checked to exist).
ExpertLayout detect_expert_layout(const Checkpoint& ck, const MoeTensorNames& names, int64_t layer);
ExpertTensors expert_tensors(const Checkpoint& ck, const ModelSpec& spec, int64_t layer,
                             int64_t expert);

}  // namespace moetier
