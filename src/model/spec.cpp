#include "model/spec.h"

#include <fmt/format.h>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"

namespace moetier {

std::string MoeTensorNames::layer_prefix(int64_t layer) const {
  return fmt::format("{}{}.", layers, layer);
}
std::string MoeTensorNames::experts_prefix(int64_t layer) const {
  return layer_prefix(layer) + experts;
}
std::string MoeTensorNames::router_tensor(int64_t layer) const {
  return layer_prefix(layer) + router;
}

std::vector<int64_t> ModelSpec::moe_layers() const {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < num_layers; ++l)
    if (is_moe_layer(l)) out.push_back(l);
  return out;
}

const MoeTensorNames& ModelSpec::names() const {
  check(arch != nullptr, "model spec without an architecture");
  return arch->names();
}

ExpertLayout detect_expert_layout(const Checkpoint& ck, const MoeTensorNames& n, int64_t layer) {
  const std::string p = n.experts_prefix(layer);
  if (ck.find(p + n.stacked_gate_up)) return ExpertLayout::Stacked;
  const std::string first = fmt::format("{}0.{}.", p, n.projs[0]);
  const TensorInfo* w = ck.find(first + "weight");
  if (!w)
    fail(
        "{}: tensor '{}weight': missing (layer {} has no expert tensors in a supported layout; "
        "also looked for '{}{}')",
        ck.dir().string(), first, layer, p, n.stacked_gate_up);
  if (ck.find(first + "codebook")) return ExpertLayout::PerExpertCb3;
  if (w->dtype == DType::U8 || w->dtype == DType::I8) return ExpertLayout::PerExpertMxfp4;
  return ExpertLayout::PerExpert;
}

ExpertTensors expert_tensors(const Checkpoint& ck, const ModelSpec& spec, int64_t layer,
                             int64_t expert) {
  const MoeTensorNames& n = spec.names();
  ExpertTensors e;
  e.layout = detect_expert_layout(ck, n, layer);
  e.index = expert;
  const std::string p = n.experts_prefix(layer);
  if (e.layout == ExpertLayout::Stacked) {
    e.gate = e.up = p + n.stacked_gate_up;
    e.down = p + n.stacked_down;
    const TensorInfo& gu = ck.get(e.gate);
    ck.get(e.down);
    check(expert >= 0 && !gu.shape.empty() && expert < gu.shape[0],
          "{}: tensor '{}': expert {} out of range", ck.dir().string(), e.gate, expert);
    return e;
  }
  const std::string q = fmt::format("{}{}.", p, expert);
  e.gate = q + n.projs[0] + ".weight";
  e.up = q + n.projs[1] + ".weight";
  e.down = q + n.projs[2] + ".weight";
  const char* aux = e.layout == ExpertLayout::PerExpertMxfp4 ? ".scale"
                    : e.layout == ExpertLayout::PerExpertCb3 ? ".codebook"
                                                             : nullptr;
  if (aux) {
    e.gate_scale = q + n.projs[0] + aux;
    e.up_scale = q + n.projs[1] + aux;
    e.down_scale = q + n.projs[2] + aux;
  }
  for (const std::string* s : {&e.gate, &e.up, &e.down, &e.gate_scale, &e.up_scale, &e.down_scale})
    if (!s->empty()) ck.get(*s);
  return e;
}

}  // namespace moetier
