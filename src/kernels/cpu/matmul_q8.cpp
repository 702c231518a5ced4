// Y [n, rows] = X [n, cols] W^T for MXFP4 weights with q8 activations
// (kernels/cpu/q8.h): each row of X is quantized once per call, then the rows
// of W are cut into tiles of 4 that cpu::matmul_many hands to the thread pool.
// Per tile:
//   - n == 1 on the AVX2 path, n <= kQ8DirectMax on the AVX-512 path: the
//     4 rows are decoded in registers inside the integer dot products (decode
//     steps; experts few tokens chose);
//   - otherwise the 4 rows are decoded once into a per-thread scratch
//     (u [4, cols] bytes, s [4, blocks]) and every row of X is dotted with it.
// Both give the same bits (the q8 order does not depend on the tile).
#include <algorithm>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/q8.h"

namespace moetier::cpu::detail {
namespace {

constexpr int64_t kTokensPerStep = 16;  // rows of X per q8_tile4 call

void row_ptrs(const Q8Job& j, int64_t r0, const uint8_t** codes, const uint8_t** scales) {
  for (int i = 0; i < 4; ++i) {
    const int64_t r = std::min(r0 + i, j.w.rows - 1);  // past the end: repeat, dropped
    codes[i] = static_cast<const uint8_t*>(j.w.data) + r * 16 * j.blocks;
    scales[i] = j.w.scales + r * j.blocks;
  }
}

void store(const Q8Job& j, int64_t t0, int64_t nt, int64_t r0, const float* out) {
  for (int64_t t = 0; t < nt; ++t)
    for (int i = 0; i < 4 && r0 + i < j.w.rows; ++i)
      j.y[(t0 + t) * j.w.rows + r0 + i] = out[t * 4 + i];
}

void tile_scratch(const Q8Job& j, int64_t r0, std::vector<uint8_t>& u, std::vector<float>& s) {
  const uint8_t *codes[4], *scales[4];
  row_ptrs(j, r0, codes, scales);
  const int64_t cols = 32 * j.blocks;
  u.resize(size_t(4 * cols));
  s.resize(size_t(4 * j.blocks));
  for (int i = 0; i < 4; ++i) {
    if (vector_path(j.path))
      decode_mxfp4_q8_avx2(codes[i], scales[i], j.blocks, u.data() + i * cols,
                           s.data() + i * j.blocks);
    else
      decode_mxfp4_q8_portable(codes[i], scales[i], j.blocks, u.data() + i * cols,
                               s.data() + i * j.blocks);
  }
  const Q8Tile tile{u.data(), cols, s.data(), j.blocks, j.blocks};
  float out[4 * kTokensPerStep];
  for (int64_t t0 = 0; t0 < j.n; t0 += kTokensPerStep) {
    const int64_t nt = std::min(kTokensPerStep, j.n - t0);
    const int8_t* q = j.q + t0 * cols;
    const float* d = j.d + t0 * j.blocks;
    if (j.path == KernelPath::Avx512)
      q8_tile4_avx512(tile, q, d, cols, j.blocks, nt, out);
    else if (j.path == KernelPath::Avx2)
      q8_tile4_avx2(tile, q, d, cols, j.blocks, nt, out);
    else
      q8_tile4_portable(tile, q, d, cols, j.blocks, nt, out);
    store(j, t0, nt, r0, out);
  }
}

}  // namespace

void run_q8_tiles(const Q8Job& j, int64_t tile0, int64_t tile1) {
  const bool avx512 = j.path == KernelPath::Avx512;
  if ((j.path == KernelPath::Avx2 && j.n == 1) || (avx512 && j.n <= kQ8DirectMax)) {
    const int64_t cols = 32 * j.blocks;
    for (int64_t t = tile0; t < tile1; ++t) {
      const uint8_t *codes[4], *scales[4];
      row_ptrs(j, 4 * t, codes, scales);
      float out[4 * kQ8DirectMax];
      if (avx512)
        q8_direct4_mxfp4_avx512(codes, scales, j.q, j.d, cols, j.blocks, j.blocks, j.n, out);
      else
        q8_direct4_mxfp4_avx2(codes, scales, j.q, j.d, j.blocks, out);
      store(j, 0, j.n, 4 * t, out);
    }
    return;
  }
  thread_local std::vector<uint8_t> u;
  thread_local std::vector<float> s;
  for (int64_t t = tile0; t < tile1; ++t) tile_scratch(j, 4 * t, u, s);
}

Q8Job prepare_mxfp4_q8(const MatView& w, const float* x, int64_t n, float* y, KernelPath path,
                       std::vector<int8_t>& q, std::vector<float>& d) {
  const int64_t blocks = w.cols / 32;
  q.resize(size_t(n * w.cols));
  d.resize(size_t(n * blocks));
  for (int64_t t = 0; t < n; ++t) {
    if (vector_path(path))
      quantize_q8_avx2(x + t * w.cols, blocks, q.data() + t * w.cols, d.data() + t * blocks);
    else
      quantize_q8_portable(x + t * w.cols, blocks, q.data() + t * w.cols, d.data() + t * blocks);
  }
  return Q8Job{w, q.data(), d.data(), n, blocks, y, path};
}

Q8Job share_mxfp4_q8(const Q8Job& prepared, const MatView& w, float* y) {
  Q8Job j = prepared;
  j.w = w;
  j.y = y;
  return j;
}

}  // namespace moetier::cpu::detail
