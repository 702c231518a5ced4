#include "experts/index.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "format/safetensors.h"
#include "io/direct_file.h"

namespace moetier {

const char* expert_part_name(ExpertPart p) {
  switch (p) {
    case ExpertPart::GateW:
      return "gate weight";
    case ExpertPart::UpW:
      return "up weight";
    case ExpertPart::DownW:
      return "down weight";
    case ExpertPart::GateScale:
      return "gate scale";
    case ExpertPart::UpScale:
      return "up scale";
    case ExpertPart::DownScale:
      return "down scale";
  }
  return "?";
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void expect_shape(const Checkpoint& ck, const TensorInfo& t, std::vector<int64_t> want) {
  check(t.shape == want, "{}: tensor '{}': shape {} (expected {})",
        ck.shards()[t.shard].path.string(), t.name, shape_str(t.shape), shape_str(want));
  check(t.nbytes() == uint64_t(t.numel()) * dtype_size(t.dtype),
        "{}: tensor '{}': {} bytes for shape {}", ck.shards()[t.shard].path.string(), t.name,
        t.nbytes(), shape_str(t.shape));
}

// A plain (f32/bf16) weight's encoding; throws for anything else.
MatShape plain_shape(const Checkpoint& ck, const TensorInfo& t, int64_t rows, int64_t cols) {
  check(t.dtype == DType::BF16 || t.dtype == DType::F32,
        "{}: tensor '{}': dtype {} is not supported for experts (BF16, F32, or MXFP4 U8+scale)",
        ck.shards()[t.shard].path.string(), t.name, dtype_name(t.dtype));
  return {t.dtype == DType::BF16 ? WeightEncoding::BF16 : WeightEncoding::F32, t.dtype, rows, cols};
}

// A cb3 weight U8 [rows, ceil(3 cols / 8)] and its codebook F16 [rows, 8].
MatShape cb3_shape(const Checkpoint& ck, const TensorInfo& w, const TensorInfo& cb, int64_t rows,
                   int64_t cols) {
  check(w.dtype == DType::U8, "{}: tensor '{}': cb3 codes must be U8, got {}",
        ck.shards()[w.shard].path.string(), w.name, dtype_name(w.dtype));
  check(cb.dtype == DType::F16, "{}: tensor '{}': cb3 codebooks must be F16, got {}",
        ck.shards()[cb.shard].path.string(), cb.name, dtype_name(cb.dtype));
  expect_shape(ck, w, {rows, (3 * cols + 7) / 8});
  expect_shape(ck, cb, {rows, 8});
  return {WeightEncoding::CB3, w.dtype, rows, cols};
}

ByteRange range_of(const Checkpoint& ck, const TensorInfo& t, ExpertPart part, uint64_t skip,
                   uint64_t length) {
  ByteRange r;
  r.part = part;
  r.shard = t.shard;
  r.offset = ck.file_offset(t) + skip;
  r.length = length;
  r.tensor = t.name;
  return r;
}

// The model dimensions one expert's layout is checked against.
struct LayoutDims {
  int64_t hidden = 0, inter = 0, experts = 0;  // H, I, E
};

// Stacked f32/bf16: gate_up_proj [E, 2I, H] (gate rows, then up rows) and
// down_proj [E, H, I]; the expert is the cut at t.index.
void add_stacked(const Checkpoint& ck, const ExpertTensors& t, const LayoutDims& d,
                 ExpertRecord& rec, MatShape* out[3]) {
  const int64_t H = d.hidden, I = d.inter, E = d.experts;
  const TensorInfo& gu = ck.get(t.gate);
  const TensorInfo& dn = ck.get(t.down);
  expect_shape(ck, gu, {E, 2 * I, H});
  expect_shape(ck, dn, {E, H, I});
  *out[0] = plain_shape(ck, gu, I, H);
  *out[1] = plain_shape(ck, gu, I, H);
  *out[2] = plain_shape(ck, dn, H, I);
  const uint64_t es = dtype_size(gu.dtype), ds = dtype_size(dn.dtype);
  const uint64_t m = uint64_t(I * H);
  const uint64_t at = uint64_t(t.index) * 2 * m * es;
  rec.ranges.push_back(range_of(ck, gu, ExpertPart::GateW, at, m * es));
  rec.ranges.push_back(range_of(ck, gu, ExpertPart::UpW, at + m * es, m * es));
  rec.ranges.push_back(range_of(ck, dn, ExpertPart::DownW, uint64_t(t.index) * m * ds, m * ds));
}

// One matrix (part p: 0 gate, 1 up, 2 down) of a per-expert layout: its weight
// tensor w [rows, cols] as stored, and its scale / codebook tensor name.
using PartFn = void (*)(const Checkpoint& ck, const TensorInfo& w, const std::string& scale, int p,
                        int64_t rows, int64_t cols, ExpertRecord& rec, MatShape& out);

// Per-expert f32/bf16 weights [rows, cols].
void add_plain_part(const Checkpoint& ck, const TensorInfo& w, const std::string&, int,
                    int64_t rows, int64_t cols, ExpertRecord&, MatShape& out) {
  expect_shape(ck, w, {rows, cols});
  out = plain_shape(ck, w, rows, cols);
}

// Per-expert MXFP4: U8/I8 [rows, cols / 2] and e8m0 scales [rows, cols / 32].
void add_mxfp4_part(const Checkpoint& ck, const TensorInfo& w, const std::string& scale, int p,
                    int64_t rows, int64_t cols, ExpertRecord& rec, MatShape& out) {
  const std::string& file = ck.shards()[w.shard].path.string();
  check(cols % 32 == 0, "{}: tensor '{}': MXFP4 needs in-features divisible by 32, got {}", file,
        w.name, cols);
  check(w.dtype == DType::U8 || w.dtype == DType::I8,
        "{}: tensor '{}': MXFP4 weights must be U8 or I8, got {}", file, w.name,
        dtype_name(w.dtype));
  expect_shape(ck, w, {rows, cols / 2});
  const TensorInfo& s = ck.get(scale);
  check(s.dtype == DType::F8_E8M0 || s.dtype == DType::U8,
        "{}: tensor '{}': MXFP4 scales must be F8_E8M0 or U8, got {}",
        ck.shards()[s.shard].path.string(), s.name, dtype_name(s.dtype));
  expect_shape(ck, s, {rows, cols / 32});
  out = {WeightEncoding::MXFP4, w.dtype, rows, cols};
  rec.ranges.push_back(range_of(ck, s, ExpertPart(int(ExpertPart::GateScale) + p), 0, s.nbytes()));
}

// Per-expert CB3: codes U8 and an f16 codebook [rows, 8] (named like a scale).
void add_cb3_part(const Checkpoint& ck, const TensorInfo& w, const std::string& codebook, int p,
                  int64_t rows, int64_t cols, ExpertRecord& rec, MatShape& out) {
  const TensorInfo& cb = ck.get(codebook);
  out = cb3_shape(ck, w, cb, rows, cols);
  rec.ranges.push_back(
      range_of(ck, cb, ExpertPart(int(ExpertPart::GateScale) + p), 0, cb.nbytes()));
}

// The three matrices of a per-expert layout: part-specific checks and ranges
// (scales first), then the weight's own range.
void add_per_expert(const Checkpoint& ck, const ExpertTensors& t, const LayoutDims& d,
                    ExpertRecord& rec, MatShape* out[3], PartFn part) {
  const std::string* names[3] = {&t.gate, &t.up, &t.down};
  const std::string* scales[3] = {&t.gate_scale, &t.up_scale, &t.down_scale};
  for (int p = 0; p < 3; ++p) {
    const int64_t rows = p < 2 ? d.inter : d.hidden, cols = p < 2 ? d.hidden : d.inter;
    const TensorInfo& w = ck.get(*names[p]);
    part(ck, w, *scales[p], p, rows, cols, rec, *out[p]);
    rec.ranges.push_back(range_of(ck, w, ExpertPart(p), 0, w.nbytes()));
  }
}

// Coalesces the ranges into extents and assigns slot offsets.
void lay_out(ExpertRecord& rec) {
  std::vector<size_t> order(rec.ranges.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = rec.ranges[a], &y = rec.ranges[b];
    return std::tie(x.shard, x.offset) < std::tie(y.shard, y.offset);
  });
  std::vector<size_t> ext_of(rec.ranges.size());
  for (size_t i : order) {
    const ByteRange& r = rec.ranges[i];
    if (!rec.extents.empty()) {
      Extent& e = rec.extents.back();
      uint64_t end = e.offset + e.length;
      if (e.shard == r.shard && io::align_down(r.offset) <= io::align_up(end)) {
        e.length = std::max(end, r.offset + r.length) - e.offset;
        ext_of[i] = rec.extents.size() - 1;
        continue;
      }
    }
    rec.extents.push_back({r.shard, r.offset, r.length, 0});
    ext_of[i] = rec.extents.size() - 1;
  }
  uint64_t at = 0;
  for (Extent& e : rec.extents) {
    e.slot_offset = at;
    at += io::aligned_span(e.offset, e.length).length;
  }
  rec.slot_bytes = at;
  rec.bytes = 0;
  for (size_t i = 0; i < rec.ranges.size(); ++i) {
    const Extent& e = rec.extents[ext_of[i]];
    rec.ranges[i].slot_offset = e.slot_offset + rec.ranges[i].offset - io::align_down(e.offset);
    rec.bytes += rec.ranges[i].length;
  }
}

}  // namespace

ExpertIndex ExpertIndex::build(const Checkpoint& ck, const ModelSpec& m) {
  ExpertIndexSpec spec;
  spec.num_layers = m.num_layers;
  spec.num_experts = m.num_experts;
  spec.hidden = m.hidden_size;
  spec.intermediate = m.expert_intermediate;
  spec.is_moe_layer = [&m](int64_t l) { return m.is_moe_layer(l); };
  spec.tensors = [&ck, &m](int64_t l, int64_t e) { return expert_tensors(ck, m, l, e); };
  return build(ck, spec);
}

ExpertIndex ExpertIndex::build(const Checkpoint& ck, const ExpertIndexSpec& spec) {
  check(spec.num_layers > 0 && spec.num_experts > 0 && spec.hidden > 0 && spec.intermediate > 0,
        "{}: expert index: bad model dimensions", ck.dir().string());
  ExpertIndex ix;
  ix.num_layers_ = spec.num_layers;
  ix.num_experts_ = spec.num_experts;
  ix.hidden_ = spec.hidden;
  ix.inter_ = spec.intermediate;
  ix.moe_.assign(size_t(spec.num_layers), 0);
  ix.shapes_.resize(size_t(spec.num_layers));
  ix.records_.resize(ix.num_keys());
  for (const Shard& s : ck.shards()) ix.shard_paths_.push_back(s.path.string());
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (!spec.is_moe_layer(l)) continue;
    ix.moe_[size_t(l)] = 1;
    for (int64_t e = 0; e < spec.num_experts; ++e) ix.add_expert(ck, l, e, spec.tensors(l, e));
  }
  check(ix.total_experts_ > 0, "{}: the model has no MoE layer", ck.dir().string());
  return ix;
}

void ExpertIndex::add_expert(const Checkpoint& ck, int64_t l, int64_t e, const ExpertTensors& t) {
  const LayoutDims d{hidden_, inter_, num_experts_};
  ExpertRecord rec;
  LayerShapes sh;
  MatShape* out[3] = {&sh.gate, &sh.up, &sh.down};
  switch (t.layout) {
    case ExpertLayout::Stacked:
      add_stacked(ck, t, d, rec, out);
      break;
    case ExpertLayout::PerExpert:
      add_per_expert(ck, t, d, rec, out, add_plain_part);
      break;
    case ExpertLayout::PerExpertMxfp4:
      add_per_expert(ck, t, d, rec, out, add_mxfp4_part);
      break;
    case ExpertLayout::PerExpertCb3:
      add_per_expert(ck, t, d, rec, out, add_cb3_part);
      break;
  }
  LayerShapes& ls = shapes_[size_t(l)];
  if (e == 0) {
    ls = sh;
  } else {
    for (auto [a, b] : {std::pair{&ls.gate, &sh.gate}, {&ls.up, &sh.up}, {&ls.down, &sh.down}}) {
      check(a->enc == b->enc && a->dtype == b->dtype,
            "{}: layer {} expert {}: encoding differs from expert 0 of the layer",
            ck.dir().string(), l, e);
    }
  }
  lay_out(rec);
  slot_bytes_ = std::max(slot_bytes_, rec.slot_bytes);
  expert_bytes_ = std::max(expert_bytes_, rec.bytes);
  total_bytes_ += rec.bytes;
  ++total_experts_;
  records_[size_t(key(l, e))] = std::move(rec);
}

bool ExpertIndex::is_moe_layer(int64_t layer) const {
  return layer >= 0 && layer < num_layers_ && moe_[size_t(layer)];
}

const ExpertRecord& ExpertIndex::record(int64_t layer, int64_t expert) const {
  check(is_moe_layer(layer), "expert index: layer {} is not a MoE layer", layer);
  check(expert >= 0 && expert < num_experts_, "expert index: layer {}: expert {} outside [0, {})",
        layer, expert, num_experts_);
  return records_[size_t(key(layer, expert))];
}

const MatShape& ExpertIndex::shape(int64_t layer, ExpertPart weight) const {
  const LayerShapes& s = shapes_.at(size_t(layer));
  switch (weight) {
    case ExpertPart::GateW:
    case ExpertPart::GateScale:
      return s.gate;
    case ExpertPart::UpW:
    case ExpertPart::UpScale:
      return s.up;
    default:
      return s.down;
  }
}

namespace {

const ByteRange* find_part(const ExpertRecord& r, ExpertPart p) {
  for (const ByteRange& b : r.ranges) {
    if (b.part == p) return &b;
  }
  return nullptr;
}

// Index of the first non-finite element of a little-endian bf16 (elem 2) or
// f32 (elem 4) array, or -1. The first pass is branch-free so it vectorizes.
template <typename U>
int64_t first_nonfinite_t(const uint8_t* p, uint64_t n, U mask) {
  unsigned bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, p + i * sizeof(U), sizeof(U));
    bad |= (x & mask) == mask;
  }
  if (!bad) return -1;
  for (uint64_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, p + i * sizeof(U), sizeof(U));
    if ((x & mask) == mask) return int64_t(i);
  }
  return -1;
}

int64_t first_nonfinite(const uint8_t* p, uint64_t bytes, size_t elem) {
  if (elem == 2) return first_nonfinite_t<uint16_t>(p, bytes / 2, 0x7f80u);
  return first_nonfinite_t<uint32_t>(p, bytes / 4, 0x7f800000u);
}

// Index of the first non-finite element of a little-endian f16 array (cb3
// codebooks), or -1.
int64_t first_nonfinite_f16(const uint8_t* p, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes / 2; ++i)
    if ((p[2 * i + 1] & 0x7c) == 0x7c) return int64_t(i);
  return -1;
}

}  // namespace

ExpertView ExpertIndex::view(ExpertKey k, const std::byte* slot) const {
  const ExpertRecord& r = records_.at(k);
  const int64_t layer = layer_of(k);
  auto mat = [&](ExpertPart w, ExpertPart s) {
    const MatShape& sh = shape(layer, w);
    MatView v;
    v.enc = sh.enc;
    v.rows = sh.rows;
    v.cols = sh.cols;
    v.data = slot + find_part(r, w)->slot_offset;
    if (const ByteRange* sc = find_part(r, s)) {
      v.scales = reinterpret_cast<const uint8_t*>(slot + sc->slot_offset);
    }
    return v;
  };
  return {mat(ExpertPart::GateW, ExpertPart::GateScale), mat(ExpertPart::UpW, ExpertPart::UpScale),
          mat(ExpertPart::DownW, ExpertPart::DownScale)};
}

std::string ExpertIndex::validate(ExpertKey k, const std::byte* slot) const {
  const ExpertRecord& r = records_.at(k);
  for (const ByteRange& b : r.ranges) {
    const auto* p = reinterpret_cast<const uint8_t*>(slot + b.slot_offset);
    const bool scale = b.part >= ExpertPart::GateScale;
    const MatShape& sh = shape(layer_of(k), b.part);
    int64_t at = -1;
    if (scale && sh.enc == WeightEncoding::CB3) {
      at = first_nonfinite_f16(p, b.length);
    } else if (scale) {
      const void* ff = std::memchr(p, 0xff, b.length);
      if (ff) at = static_cast<const uint8_t*>(ff) - p;
    } else if (sh.enc == WeightEncoding::BF16 || sh.enc == WeightEncoding::F32) {
      at = first_nonfinite(p, b.length, dtype_size(sh.dtype));
    }
    if (at >= 0) {
      return fmt::format(
          "{}: tensor '{}': layer {} expert {}: {} element {} is {} "
          "(expert bytes fail validation)",
          shard_paths_[b.shard], b.tensor, layer_of(k), expert_of(k), expert_part_name(b.part), at,
          !scale                          ? "NaN/Inf"
          : sh.enc == WeightEncoding::CB3 ? "NaN/Inf (cb3 codebook)"
                                          : "0xff (NaN scale)");
    }
  }
  return {};
}

}  // namespace moetier
