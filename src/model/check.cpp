#include "model/check.h"

#include <fmt/format.h>

#include <charconv>
#include <map>
#include <optional>

#include "format/json_util.h"
#include "format/safetensors.h"
#include "model/architecture.h"

namespace moetier {

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
bool is_byte(DType t) { return t == DType::U8 || t == DType::I8; }
bool is_scale(DType t) { return t == DType::F8_E8M0 || t == DType::U8; }
bool is_u8(DType t) { return t == DType::U8; }
bool is_f16(DType t) { return t == DType::F16; }

// Parses a decimal index at the start of s; advances s past it and a '.'.
std::optional<int64_t> take_index(std::string_view& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data() || p == s.data() + s.size() || *p != '.')
    return std::nullopt;
  s.remove_prefix(size_t(p - s.data()) + 1);
  return v;
}

// The expert tensors found for one layer.
struct LayerExperts {
  const TensorInfo* gate_up = nullptr;  // stacked
  const TensorInfo* down = nullptr;     // stacked
  // expert -> "PROJ.weight" / "PROJ.scale" / "PROJ.codebook" -> tensor
  std::map<int64_t, std::map<std::string, const TensorInfo*>> per;
};

struct Checker {
  const Checkpoint& ck;
  const ModelSpec& c;
  const MoeTensorNames& n;
  std::vector<std::string>& problems;
  std::map<int64_t, LayerExperts> experts;  // layer -> experts found

  std::string file_of(const TensorInfo& t) const { return ck.shards()[t.shard].path.string(); }
  // Where a missing tensor should have been listed.
  std::string listing_file() const {
    auto idx = ck.dir() / "model.safetensors.index.json";
    std::error_code ec;
    return (std::filesystem::exists(idx, ec) ? idx : ck.dir() / "model.safetensors").string();
  }
  template <typename... Args>
  void add(const std::string& file, const std::string& name, fmt::format_string<Args...> f,
           Args&&... args) {
    problems.push_back(fmt::format("{}: tensor '{}': {}", file, printable(name),
                                   fmt::format(f, std::forward<Args>(args)...)));
  }

  // Present with this shape and a dtype accepted by `ok` (described by `allowed`).
  void require(const std::string& name, const std::vector<int64_t>& shape,
               bool (*ok)(DType) = is_float, std::string_view allowed = "F32, F16 or BF16") {
    const TensorInfo* t = ck.find(name);
    if (!t) return add(listing_file(), name, "missing (expected shape {})", shape_str(shape));
    if (t->shape != shape)
      add(file_of(*t), name, "shape {}, expected {}", shape_str(t->shape), shape_str(shape));
    if (!ok(t->dtype))
      add(file_of(*t), name, "dtype {}, expected {}", dtype_name(t->dtype), allowed);
  }

  void check_core() {
    for (const auto& spec : c.arch->core_tensors(ck.config(), ck.dir() / "config.json"))
      if (!spec.optional || ck.find(spec.name)) require(spec.name, spec.shape);
  }

  void scan_tensor(const TensorInfo& t) {
    std::string_view s = t.name;
    if (!s.starts_with(n.layers)) return;
    s.remove_prefix(n.layers.size());
    auto layer = take_index(s);
    if (!layer) return;
    if (*layer >= c.num_layers)
      return add(file_of(t), t.name, "layer {} does not exist (the config gives {} layers)", *layer,
                 c.num_layers);
    if (!s.starts_with(n.experts)) return;
    s.remove_prefix(n.experts.size());
    if (!c.is_moe_layer(*layer))
      return add(file_of(t), t.name,
                 "layer {} is a dense layer in the config but has expert tensors", *layer);
    LayerExperts& le = experts[*layer];
    if (s == n.stacked_gate_up) return void(le.gate_up = &t);
    if (s == n.stacked_down) return void(le.down = &t);
    auto e = take_index(s);
    bool known = false;
    for (const std::string& p : n.projs)
      known |= s == fmt::format("{}.weight", p) || s == fmt::format("{}.scale", p) ||
               s == fmt::format("{}.codebook", p);
    if (!e || !known) return add(file_of(t), t.name, "not an expert tensor of a supported layout");
    if (*e < 0 || *e >= c.num_experts)
      return add(file_of(t), t.name, "expert {} out of range (num_experts {})", *e, c.num_experts);
    le.per[*e][std::string(s)] = &t;
  }

  void check_stacked(int64_t layer, const LayerExperts& le) {
    std::string p = n.experts_prefix(layer);
    const int64_t E = c.num_experts, I = c.expert_intermediate, H = c.hidden_size;
    if (!le.per.empty())
      add(file_of(*(le.gate_up ? le.gate_up : le.down)),
          p + (le.gate_up ? n.stacked_gate_up : n.stacked_down),
          "layer {} also has per-expert tensors (one expert layout per layer)", layer);
    require(p + n.stacked_gate_up, {E, 2 * I, H});
    require(p + n.stacked_down, {E, H, I});
  }

  enum class Enc { Plain, Mxfp4, Cb3 };

  static std::string_view enc_name(Enc e) {
    return e == Enc::Cb3 ? "cb3" : e == Enc::Mxfp4 ? "MXFP4" : "plain f32/f16/bf16";
  }

  // A tensor the layer's encoding has no use for (an MXFP4 scale or a cb3 codebook).
  void stray(const std::string& name, std::string_view what, Enc enc, int64_t layer) {
    if (const TensorInfo* s = ck.find(name))
      add(file_of(*s), s->name, "{} ({}) in layer {}, whose experts are {}", what,
          dtype_name(s->dtype), layer, enc_name(enc));
  }

  // One projection [out, in] of one expert, named p + "weight" etc.
  void check_proj(const std::string& p, int64_t out, int64_t in, Enc enc, int64_t layer) {
    switch (enc) {
      case Enc::Cb3:
        require(p + "weight", {out, (3 * in + 7) / 8}, is_u8, "U8 (cb3 packed 3-bit codes)");
        require(p + "codebook", {out, 8}, is_f16, "F16 (cb3 codebook, 8 per row)");
        return stray(p + "scale", "an MXFP4 scale", enc, layer);
      case Enc::Mxfp4:
        require(p + "weight", {out, in / 2}, is_byte, "U8 or I8 (MXFP4 e2m1 pairs)");
        require(p + "scale", {out, in / 32}, is_scale, "F8_E8M0 or U8 (MXFP4 scales)");
        return stray(p + "codebook", "a cb3 codebook", enc, layer);
      case Enc::Plain:
        require(p + "weight", {out, in});
        stray(p + "scale", "an MXFP4 scale", enc, layer);
        return stray(p + "codebook", "a cb3 codebook", enc, layer);
    }
  }

  void check_per_expert(int64_t layer, const LayerExperts& le) {
    std::string p = n.experts_prefix(layer);
    // The layer's encoding follows its first expert: a gate codebook means
    // CB3; else a U8/I8 gate weight (or a scale) means MXFP4.
    const auto& first = le.per.begin()->second;
    const std::string& gate = n.projs[0];
    auto w = first.find(gate + ".weight");
    Enc enc = Enc::Plain;
    if (first.count(gate + ".codebook"))
      enc = Enc::Cb3;
    else if (w != first.end() ? is_byte(w->second->dtype) : first.count(gate + ".scale") > 0)
      enc = Enc::Mxfp4;
    const int64_t I = c.expert_intermediate, H = c.hidden_size;
    if (enc == Enc::Mxfp4 && (H % 32 || I % 32)) {
      problems.push_back(
          fmt::format("{}: hidden size {} and expert intermediate size {} "
                      "must be multiples of 32 for MXFP4 experts (layer {})",
                      (ck.dir() / "config.json").string(), H, I, layer));
      return;
    }
    for (int64_t e = 0; e < c.num_experts; ++e) {
      for (const std::string& proj : n.projs) {
        bool down = proj == n.projs[2];
        check_proj(fmt::format("{}{}.{}.", p, e, proj), down ? H : I, down ? I : H, enc, layer);
      }
    }
  }

  void check_experts() {
    for (const auto& t : ck.tensors()) scan_tensor(t);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (!c.is_moe_layer(l)) continue;
      const LayerExperts& le = experts[l];
      if (le.gate_up || le.down) {
        check_stacked(l, le);
      } else if (!le.per.empty()) {
        check_per_expert(l, le);
      } else {
        add(listing_file(), n.experts_prefix(l) + n.stacked_gate_up,
            "missing (MoE layer {} has no expert tensors in any supported layout)", l);
      }
    }
  }
};

// The sizes tensor shapes derive from are all known.
bool shapes_known(const ModelSpec& c) {
  return c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_experts > 0 &&
         c.expert_intermediate > 0;
}

// The "moetier" object that moetier prune / repack add to config.json
// (docs/formats.md, "Derived checkpoints"): kept_experts lists, per layer, the
// original ids of the experts kept (empty for dense layers), ascending.
void check_derived(const nlohmann::json& j, const std::string& file, const ModelSpec& c,
                   std::vector<std::string>& problems) {
  auto m = j.find("moetier");
  if (m == j.end() || m->is_null()) return;
  auto bad = [&](std::string_view field, const std::string& what) {
    problems.push_back(fmt::format("{}: field 'moetier.{}': {}", file, field, what));
  };
  if (!m->is_object()) return bad("", fmt::format("is {}, expected an object", json_kind(*m)));
  auto kept = m->find("kept_experts");
  if (kept == m->end()) return;
  auto from = m->find("pruned_from");
  if (from == m->end() || !from->is_number_integer() || from->get<int64_t>() < c.num_experts)
    return bad("pruned_from", fmt::format("must be an integer >= num_experts {}", c.num_experts));
  const int64_t n = from->get<int64_t>();
  if (!kept->is_array() || int64_t(kept->size()) != c.num_layers)
    return bad("kept_experts", fmt::format("expected a list of {} lists", c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const auto& ids = (*kept)[size_t(l)];
    const int64_t want = c.is_moe_layer(l) ? c.num_experts : 0;
    bool ok = ids.is_array() && int64_t(ids.size()) == want;
    for (size_t i = 0; ok && i < ids.size(); ++i)
      ok = ids[i].is_number_integer() && ids[i].get<int64_t>() >= 0 && ids[i].get<int64_t>() < n &&
           (i == 0 || ids[i].get<int64_t>() > ids[i - 1].get<int64_t>());
    if (!ok)
      return bad(fmt::format("kept_experts[{}]", l),
                 fmt::format("expected {} ascending expert ids in [0, {})", want, n));
  }
}

void check_all(const std::filesystem::path& dir, std::vector<std::string>& problems) {
  auto ck = Checkpoint::open(dir, problems);
  if (!ck->config().is_object()) return;  // config.json missing or broken: reported
  std::string cfg_file = (dir / "config.json").string();
  const Architecture* arch = find_architecture(ck->config(), cfg_file, problems);
  if (!arch) return;
  const ModelSpec c = arch->parse(ck->config(), dir / "config.json", problems);
  if (!shapes_known(c)) return;
  check_derived(ck->config(), cfg_file, c, problems);
  Checker k{*ck, c, c.names(), problems, {}};
  k.check_core();
  k.check_experts();
}

}  // namespace

std::vector<std::string> check_checkpoint(const std::filesystem::path& dir) {
  std::vector<std::string> problems;
  try {
    check_all(dir, problems);
  } catch (const std::exception& e) {
    problems.push_back(fmt::format("{}: {}", dir.string(), printable(e.what())));
  }
  return problems;
}

}  // namespace moetier
