// int8 activations for MXFP4 weights (the q8 mode, kernels/cpu/dispatch.h),
// the way llama.cpp computes its MXFP4 dot products: each row of X is cut into
// blocks of 32 columns, each block quantized to int8 with one f32 scale, and a
// weight block is dotted with it in integers.
//
// Activation block b of a row (quantize_q8_*):
//   amax = max |x[32b + j]|,  d[b] = amax / 127,  id = 127 / amax (0 when amax is 0),
//   q[32b + k] = nearbyint(x[32b + c(k)] * id)   (round half to even), where the
//   block is stored permuted, even columns first: c(k) = 2k for k < 16 and
//   2(k - 16) + 1 after (the order of an MXFP4 block's low nibbles, then its
//   high ones). A non-finite x in the block makes d[b] NaN (never hidden).
//   Both paths quantize to the same bytes and scales.
//
// Weight block b of a row: w'[k] = 12 + 2 e2m1(code of column c(k)), an
// unsigned byte in [0, 24], and the scale s[b] = 2^(e - 128) (half the e8m0
// scale, since w' holds twice the e2m1 value).
//
// The q8 order (the same for any tile shape and any n: batch-invariant):
//   lane l of block b (l = 0..7) = sum_{k=4l..4l+3} w'[k] q[k] - 12 sum_{k=4l..4l+3} q[k]
//     (an exact integer, |lane| <= 6096);
//   A = 0; for b ascending: A[l] = A[l] + float(lane_b[l]) * (s[b] * d[b]);
//   y = ((A0+A4) + (A2+A6)) + ((A1+A5) + (A3+A7)).
// The AVX2 path fuses the multiply-add (FMA), the portable one does not
// (compiled with -ffp-contract=off); both are batch-invariant. The AVX-512
// path computes the AVX2 path's bits (the same lanes, added the same way).
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/dispatch.h"

namespace moetier::cpu::detail {

// 2^(e - 128): half the e8m0 scale, exact (subnormal below e = 2); 0xff is NaN.
constexpr float e8m0_half(uint8_t e) {
  const uint32_t bits = e == 0xff ? 0x7fc00000u
                        : e >= 2  ? uint32_t(e - 1) << 23
                                  : (e == 1 ? 0x00400000u : 0x00200000u);
  return std::bit_cast<float>(bits);
}

// e8m0_half of every byte, a constant-initialized table (data only, so the
// AVX2 and AVX-512 files can share it without code of their target leaking out).
struct HalfScales {
  float v[256];
  constexpr HalfScales() : v() {
    for (int e = 0; e < 256; ++e) v[e] = e8m0_half(uint8_t(e));
  }
};
inline constexpr HalfScales kHalfScales{};

// 12 + 2 e2m1(code) for each 4-bit code (w' above).
inline constexpr uint8_t kMxfp4Q8Lut[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                            12, 11, 10, 9,  8,  6,  4,  0};

// x [32 * blocks] -> q [32 * blocks], d [blocks].
void quantize_q8_portable(const float* x, int64_t blocks, int8_t* q, float* d);
void quantize_q8_avx2(const float* x, int64_t blocks, int8_t* q, float* d);

// One MXFP4 row decoded to the q8 weight form: u [32 * blocks] (w' above),
// s [blocks]. codes [16 * blocks] e2m1 pairs, scales [blocks] e8m0.
void decode_mxfp4_q8_portable(const uint8_t* codes, const uint8_t* scales, int64_t blocks,
                              uint8_t* u, float* s);
void decode_mxfp4_q8_avx2(const uint8_t* codes, const uint8_t* scales, int64_t blocks, uint8_t* u,
                          float* s);

// 4 decoded rows (u [4, ldu], s [4, lds]) against n activation rows
// (q [n, ldq] , d [n, ldd]); out[t * 4 + i] = row i . activation row t.
struct Q8Tile {
  const uint8_t* u;
  int64_t ldu;
  const float* s;
  int64_t lds;
  int64_t blocks;
};
void q8_tile4_portable(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                       int64_t n, float* out);
void q8_tile4_avx2(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                   int64_t n, float* out);
// The same bits with AVX-512 VNNI (q8_avx512.cpp; the avx512 path).
void q8_tile4_avx512(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                     int64_t n, float* out);

// The same result straight from the stored MXFP4 rows, for one activation
// row (decode steps): codes[i] [16 * blocks], scales[i] [blocks].
void q8_direct4_mxfp4_avx2(const uint8_t* const codes[4], const uint8_t* const scales[4],
                           const int8_t* q, const float* d, int64_t blocks, float* out);
// n activation rows (q [n, ldq], d [n, ldd]) straight from the stored rows,
// up to kQ8DirectTokens at a time: out[t * 4 + i]. The avx512 path takes it
// for n <= kQ8DirectMax (decode steps, and experts that few tokens chose):
// past 4 tokens each group of 4 decodes the rows again, from L1. kernels_bench
// from DRAM put that ahead of the scratch at 6 tokens and level or ahead at 8,
// at 1 and 2 threads, and level at 12 (docs/engine.md).
constexpr int64_t kQ8DirectTokens = 4;
constexpr int64_t kQ8DirectMax = 8;
void q8_direct4_mxfp4_avx512(const uint8_t* const codes[4], const uint8_t* const scales[4],
                             const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                             int64_t blocks, int64_t n, float* out);

// Y [n, rows] = X [n, cols] W^T for MXFP4 w in the q8 order, in two steps
// (cpu::matmul_many runs several such jobs in one parallel run):
// prepare_mxfp4_q8 quantizes X into q [n, cols] and d [n, blocks] (the
// caller's storage, which must outlive the job); run_q8_tiles computes the
// outputs of tiles [tile0, tile1) of 4 rows, on any thread.
struct Q8Job {
  MatView w;
  const int8_t* q;  // [n, cols]
  const float* d;   // [n, blocks]
  int64_t n, blocks;
  float* y;         // [n, rows]
  KernelPath path;  // avx512: its VNNI kernels (the AVX2 kernels' bits), else avx2's
};
Q8Job prepare_mxfp4_q8(const MatView& w, const float* x, int64_t n, float* y, KernelPath path,
                       std::vector<int8_t>& q, std::vector<float>& d);
// A job on X already quantized by another job's prepare (the same x, n and cols).
Q8Job share_mxfp4_q8(const Q8Job& prepared, const MatView& w, float* y);
void run_q8_tiles(const Q8Job& j, int64_t tile0, int64_t tile1);

}  // namespace moetier::cpu::detail
