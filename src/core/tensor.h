// Views of weight matrices in memory, whatever their encoding. Non-owning.
#pragma once

#include <cstdint>
#include <string_view>

namespace moetier {

enum class WeightEncoding : uint8_t { F32, BF16, MXFP4, CB3 };

// "f32", "bf16", "mxfp4", "cb3": the one spelling of an encoding in messages,
// `moetier info`, trace headers and reports.
std::string_view encoding_name(WeightEncoding e);

// A row-major matrix [rows, cols].
//   F32/BF16: data -> rows*cols elements.
//   MXFP4:    data -> [rows, cols/2] bytes, e2m1 pairs, low nibble = even
//             column; scales -> [rows, cols/32] e8m0 bytes.
//   CB3:      data -> [rows, ceil(cols*3/8)] bytes of packed 3-bit codes
//             (code of column c = bits 3c..3c+2 of its row, little-endian
//             bit order; kernels/cb3.h, docs/formats.md); scales -> the
//             codebook [rows, 8] f16 (16 bytes per row, any alignment):
//             element (r, c) = codebook[r][code(r, c)].
struct MatView {
  WeightEncoding enc = WeightEncoding::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;
};

// One SwiGLU expert: down(silu(gate x) * up x).
struct ExpertView {
  MatView gate;  // [I, H]
  MatView up;    // [I, H]
  MatView down;  // [H, I]
};

}  // namespace moetier
