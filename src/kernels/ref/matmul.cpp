#include "core/dtype.h"
#include "kernels/cb3.h"
#include "kernels/matview.h"
#include "kernels/ref/ref.h"

namespace moetier::ref {

float weight_at(const MatView& w, int64_t r, int64_t c) {
  switch (w.enc) {
    case WeightEncoding::F32:
      return static_cast<const float*>(w.data)[r * w.cols + c];
    case WeightEncoding::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
    case WeightEncoding::MXFP4: {
      const auto* d = static_cast<const uint8_t*>(w.data);
      uint8_t byte = d[r * (w.cols / 2) + c / 2];
      uint8_t code = (c % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
      return e2m1_to_f32(code) * e8m0_to_f32(w.scales[r * (w.cols / 32) + c / 32]);
    }
    case WeightEncoding::CB3: {
      // docs/formats.md "cb3 experts": code of column c = bits 3c..3c+2 of the row.
      if (!w.scales) break;
      const auto* d = static_cast<const uint8_t*>(w.data) + r * kernels::cb3_row_bytes(w.cols);
      return f16_to_f32(kernels::cb3_centroid_bits(w.scales, r, kernels::cb3_code(d, c)));
    }
  }
  kernels::check_matview(w, "ref::weight_at");
  return 0.0f;
}

void matvec(const MatView& w, const float* x, float* y) {
  kernels::check_matview(w, "ref::matvec");
  for (int64_t r = 0; r < w.rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) acc += double(weight_at(w, r, c)) * double(x[c]);
    y[r] = float(acc);
  }
}

void matmul(const MatView& w, const float* x, int64_t n, float* y) {
  for (int64_t t = 0; t < n; ++t) matvec(w, x + t * w.cols, y + t * w.rows);
}

}  // namespace moetier::ref
