// Y [n, rows] = X [n, cols] W^T for f32, bf16 and mxfp4 weights (cb3:
// kernels/cpu/cb3.cpp).
//
// Work split: rows are cut into blocks of kBlock; OpenMP threads take blocks.
// n <= kDirectMax: each row is decoded in registers inside the dot product.
// Otherwise rows are decoded (f32: copied) four at a time into a per-thread f32 scratch
// [4, cols] and every token's row of X is dotted against all four at once,
// so each weight byte is decoded once per call and each X load feeds 4 FMAs.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cb3.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/mxfp4_dot.h"
#include "kernels/cpu/simd.h"
#include "kernels/matview.h"

namespace moetier::cpu {
namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kDirectMax = 2;
// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 18;

inline float dot_f32(const float* w, const float* x, int64_t cols) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < cols; ++c) acc += w[c] * x[c];
  return acc;
}

inline float dot_bf16(const uint16_t* w, const float* x, int64_t cols) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < cols; ++c) acc += bf16_to_f32(w[c]) * x[c];
  return acc;
}

inline float dot_row(const MatView& w, int64_t r, const float* x, detail::Mxfp4Dot mx) {
  switch (w.enc) {
    case WeightEncoding::F32:
      return dot_f32(static_cast<const float*>(w.data) + r * w.cols, x, w.cols);
    case WeightEncoding::BF16:
      return dot_bf16(static_cast<const uint16_t*>(w.data) + r * w.cols, x, w.cols);
    default:
      return mx(static_cast<const uint8_t*>(w.data) + r * (w.cols / 2),
                w.scales + r * (w.cols / 32), x, w.cols);
  }
}

// Row r of w decoded to f32 into dst [cols]; returns dst. f32 rows are copied
// too: the tile then reads one contiguous [4, cols] block, measured 8x faster
// than reading four rows of the matrix in place (768x2048, n=16, one core).
inline const float* decode_row(const MatView& w, int64_t r, float* dst) {
  int64_t cols = w.cols;
  if (w.enc == WeightEncoding::F32) {
    std::memcpy(dst, static_cast<const float*>(w.data) + r * cols, size_t(cols) * sizeof(float));
    return dst;
  }
  if (w.enc == WeightEncoding::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dst[c] = bf16_to_f32(src[c]);
    return dst;
  }
  const uint8_t* d = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
  const uint8_t* s = w.scales + r * (cols / 32);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float sc = e8m0_to_f32(s[b]);
    float* out = dst + b * 32;
    for (int j = 0; j < 16; ++j) std::memcpy(out + 2 * j, detail::kMxfp4Pairs.v[d[b * 16 + j]], 8);
#pragma omp simd
    for (int j = 0; j < 32; ++j) out[j] *= sc;
  }
  return dst;
}

MOETIER_CLONES void rows_direct(const MatView& w, const float* x, int64_t n, float* y, int64_t r0,
                                int64_t r1) {
  const detail::Mxfp4Dot mx = detail::best_mxfp4_dot();
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot_row(w, r, x + t * w.cols, mx);
}

// Four decoded rows w [4, cols] dotted with every row of X. (Two tokens at a
// time, 8 accumulators, measured 2x slower: register pressure.)
inline void tile4(const float* w, const float* x, int64_t n, int64_t cols, int64_t rows, int64_t r,
                  float* y) {
  const float *w0 = w, *w1 = w + cols, *w2 = w + 2 * cols, *w3 = w + 3 * cols;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t c = 0; c < cols; ++c) {
      a0 += w0[c] * xt[c];
      a1 += w1[c] * xt[c];
      a2 += w2[c] * xt[c];
      a3 += w3[c] * xt[c];
    }
    float* yt = y + t * rows + r;
    yt[0] = a0, yt[1] = a1, yt[2] = a2, yt[3] = a3;
  }
}

MOETIER_CLONES void rows_tiled(const MatView& w, const float* x, int64_t n, float* y, int64_t r0,
                               int64_t r1, float* scratch /* [4, cols] */) {
  int64_t cols = w.cols;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int64_t i = 0; i < 4; ++i) decode_row(w, r + i, scratch + i * cols);
    tile4(scratch, x, n, cols, w.rows, r, y);
  }
  for (; r < r1; ++r) {
    const float* wr = decode_row(w, r, scratch);
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot_f32(wr, x + t * cols, cols);
  }
}

}  // namespace

void set_threads(int n) { omp_set_num_threads(n > 0 ? n : omp_get_num_procs()); }
int threads() { return omp_get_max_threads(); }

void get_row(const MatView& w, int64_t r, float* out) {
  if (w.enc == WeightEncoding::CB3) return get_row_cb3(w, r, out);  // kernels/cpu/cb3.cpp
  kernels::check_matview(w, "cpu::get_row");
  check(r >= 0 && r < w.rows, "cpu::get_row: row {} outside [0, {})", r, w.rows);
  decode_row(w, r, out);
}

void matmul(const MatView& w, const float* x, int64_t n, float* y) {
  if (w.enc == WeightEncoding::CB3) return matmul_cb3(w, x, n, y);  // kernels/cpu/cb3.cpp
  kernels::check_matview(w, "cpu::matmul");
  if (n <= 0) return;
  const int64_t blocks = (w.rows + kBlock - 1) / kBlock;
  const bool parallel = blocks > 1 && w.rows * w.cols * n >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch(n > kDirectMax ? size_t(4 * w.cols) : 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t r0 = b * kBlock, r1 = std::min(w.rows, r0 + kBlock);
      if (n <= kDirectMax)
        rows_direct(w, x, n, y, r0, r1);
      else
        rows_tiled(w, x, n, y, r0, r1, scratch.data());
    }
  }
}

}  // namespace moetier::cpu
