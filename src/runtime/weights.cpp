#include "runtime/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace moetier::runtime {
namespace {

void check_shape(const Checkpoint& ck, const TensorInfo& t, const std::vector<int64_t>& want) {
  check(t.shape == want, "{}: shape [{}], expected [{}]", tensor_where(ck, t),
        fmt::join(t.shape, ", "), fmt::join(want, ", "));
}

// The tensor's bytes; checks that they hold exactly shape x dtype.
const std::byte* checked_bytes(const Checkpoint& ck, const TensorInfo& t) {
  auto b = ck.bytes(t);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  check(b.size() == uint64_t(n) * dtype_size(t.dtype), "{}: holds {} bytes, shape needs {}",
        tensor_where(ck, t), b.size(), uint64_t(n) * dtype_size(t.dtype));
  return b.data();
}

WeightEncoding matrix_encoding(const Checkpoint& ck, const TensorInfo& t) {
  if (t.dtype == DType::F32) return WeightEncoding::F32;
  if (t.dtype == DType::BF16) return WeightEncoding::BF16;
  fail("{}: dtype {} is not supported for a weight matrix (f32, bf16)", tensor_where(ck, t),
       dtype_name(t.dtype));
}

}  // namespace

std::string tensor_where(const Checkpoint& ck, const TensorInfo& t) {
  std::string file =
      t.shard < ck.shards().size() ? ck.shards()[t.shard].path.string() : ck.dir().string();
  return fmt::format("{}: tensor '{}'", file, t.name);
}

MatView matrix_view(const Checkpoint& ck, std::string_view name, int64_t rows, int64_t cols) {
  const TensorInfo& t = ck.get(name);
  MatView m;
  m.enc = matrix_encoding(ck, t);
  check_shape(ck, t, {rows, cols});
  m.rows = rows;
  m.cols = cols;
  m.data = checked_bytes(ck, t);
  return m;
}

std::vector<float> vector_f32(const Checkpoint& ck, std::string_view name, int64_t n) {
  const TensorInfo& t = ck.get(name);
  check_shape(ck, t, {n});
  const std::byte* p = checked_bytes(ck, t);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (t.dtype == DType::F32) {
      std::memcpy(&v[size_t(i)], p + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    if (t.dtype == DType::BF16)
      v[size_t(i)] = bf16_to_f32(h);
    else if (t.dtype == DType::F16)
      v[size_t(i)] = f16_to_f32(h);
    else
      fail("{}: dtype {} is not supported for a vector (f32, bf16, f16)", tensor_where(ck, t),
           dtype_name(t.dtype));
  }
  return v;
}

MatView mxfp4_view(const Checkpoint& ck, std::string_view weight, std::string_view scale,
                   int64_t rows, int64_t cols) {
  const TensorInfo& w = ck.get(weight);
  const TensorInfo& s = ck.get(scale);
  check(cols % 32 == 0, "{}: mxfp4 needs a multiple of 32 columns, has {}", tensor_where(ck, w),
        cols);
  check(w.dtype == DType::U8 || w.dtype == DType::I8, "{}: dtype {}, expected U8 (packed e2m1)",
        tensor_where(ck, w), dtype_name(w.dtype));
  check(s.dtype == DType::F8_E8M0 || s.dtype == DType::U8, "{}: dtype {}, expected F8_E8M0",
        tensor_where(ck, s), dtype_name(s.dtype));
  check_shape(ck, w, {rows, cols / 2});
  check_shape(ck, s, {rows, cols / 32});
  MatView m{WeightEncoding::MXFP4, rows, cols, checked_bytes(ck, w), nullptr};
  m.scales = reinterpret_cast<const uint8_t*>(checked_bytes(ck, s));
  return m;
}

MatView cb3_view(const Checkpoint& ck, std::string_view weight, std::string_view codebook,
                 int64_t rows, int64_t cols) {
  const TensorInfo& w = ck.get(weight);
  const TensorInfo& cb = ck.get(codebook);
  check(w.dtype == DType::U8, "{}: dtype {}, expected U8 (cb3 packed 3-bit codes)",
        tensor_where(ck, w), dtype_name(w.dtype));
  check(cb.dtype == DType::F16, "{}: dtype {}, expected F16 (cb3 codebook)", tensor_where(ck, cb),
        dtype_name(cb.dtype));
  check_shape(ck, w, {rows, (3 * cols + 7) / 8});
  check_shape(ck, cb, {rows, 8});
  MatView m{WeightEncoding::CB3, rows, cols, checked_bytes(ck, w), nullptr};
  m.scales = reinterpret_cast<const uint8_t*>(checked_bytes(ck, cb));
  return m;
}

MatView stacked_view(const Checkpoint& ck, std::string_view name, int64_t num_experts,
                     int64_t index, int64_t total_rows, int64_t row0, int64_t rows, int64_t cols) {
  const TensorInfo& t = ck.get(name);
  MatView m;
  m.enc = matrix_encoding(ck, t);
  check_shape(ck, t, {num_experts, total_rows, cols});
  check(index >= 0 && index < num_experts && row0 >= 0 && row0 + rows <= total_rows,
        "{}: expert {} rows [{}, {}) out of range", tensor_where(ck, t), index, row0, row0 + rows);
  const std::byte* base = checked_bytes(ck, t);
  int64_t offset = (index * total_rows + row0) * cols * int64_t(dtype_size(t.dtype));
  m.rows = rows;
  m.cols = cols;
  m.data = base + offset;
  return m;
}

}  // namespace moetier::runtime
