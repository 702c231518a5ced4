// Device helpers shared by the CUDA matrix kernels: exact weight decoding and
// one warp's dot product of a weight row with up to NT activation rows.
//
// A warp owns one weight row. The vectorized path (VEC) reads 16 bytes per
// lane per step (bf16: 8 columns, f32: 4, MXFP4: one 32-column block); it
// needs the row to start 16-byte aligned and cols to be a multiple of 8 / 4 /
// 32. Otherwise each lane takes every 32nd column (any shape, any alignment).
// Every lane ends with partial sums; warp_sum() adds them (butterfly), so the
// result is the same whichever lane reads it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace moetier::cuda {

enum Enc : int { kF32 = 0, kBF16 = 1, kMXFP4 = 2, kCB3 = 3 };

__device__ __forceinline__ float bf16f(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float e8m0f(uint32_t e) {
  if (e == 0xffu) return __uint_as_float(0x7fc00000u);
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}

__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// e2m1 code -> value, as a shared table (16 floats; conflict-free lookups).
struct E2m1Table {
  float v[16];
};
__device__ __forceinline__ void fill_e2m1(float* lut) {
  const float k[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  if (threadIdx.x < 16) lut[threadIdx.x] = threadIdx.x < 8 ? k[threadIdx.x] : -k[threadIdx.x - 8];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Lane i of the warp returns the sum over the warp's 32 lanes of their v[i %
// N] (N a power of two <= 16; v is clobbered): a reduce-scatter, N - 1
// shuffles to take the N values to one a lane, then 5 - log2 N to sum the
// lanes that hold the same one (warp_sum on each would take 5 N). Step B:
// each lane keeps the half of v[0 .. 2B) its bit B names, its partner's added.
template <int B, int N>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[N], int lane) {
  const bool up = (lane & B) != 0;  // keeps v[i + B], sends v[i]
#pragma unroll
  for (int i = 0; i < B; ++i) {
    const float lo = v[i], hi = v[i + B];  // (values selected, not addresses: v stays in registers)
    v[i] = (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, B);
  }
}
template <int N>
__device__ __forceinline__ float warp_rows_scatter(float (&v)[N]) {
  static_assert(N >= 1 && N <= 16 && (N & (N - 1)) == 0, "N: a power of two <= 16");
  const int lane = int(threadIdx.x & 31);
  if constexpr (N >= 16) reduce_scatter_step<8>(v, lane);
  if constexpr (N >= 8) reduce_scatter_step<4>(v, lane);
  if constexpr (N >= 4) reduce_scatter_step<2>(v, lane);
  if constexpr (N >= 2) reduce_scatter_step<1>(v, lane);
  float t = v[0];
#pragma unroll
  for (int o = N; o < 32; o <<= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// The block total of each thread's ss (double, in a fixed order: warp
// butterflies, then the warps in order); part: 33 doubles of shared memory.
__device__ __forceinline__ double block_sumsq(double ss, double* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < int(blockDim.x + 31) / 32; ++i) t += part[i];
    part[32] = t;
  }
  __syncthreads();
  return part[32];
}

// Element c of row `row` (generic path; cb3 codebook rows are 16 bytes).
template <int ENC>
__device__ __forceinline__ float weight_at(const uint8_t* w, const uint8_t* sc, int64_t row,
                                           int64_t c, int64_t cols, const float* lut) {
  if constexpr (ENC == kF32) {
    return reinterpret_cast<const float*>(w)[row * cols + c];
  } else if constexpr (ENC == kBF16) {
    return bf16f(reinterpret_cast<const uint16_t*>(w)[row * cols + c]);
  } else if constexpr (ENC == kMXFP4) {
    const uint8_t b = w[row * (cols / 2) + c / 2];
    return lut[(c & 1) ? (b >> 4) : (b & 15)] * e8m0f(sc[row * (cols / 32) + c / 32]);
  } else {
    const int64_t rb = (3 * cols + 7) / 8;
    const uint8_t* r = w + row * rb;
    const int64_t bit = 3 * c;
    uint32_t v = r[bit >> 3];
    if ((bit & 7) > 5) v |= uint32_t(r[(bit >> 3) + 1]) << 8;
    const uint32_t code = (v >> (bit & 7)) & 7u;
    uint16_t h;
    memcpy(&h, sc + row * 16 + code * 2, 2);
    return f16f(h);
  }
}

// acc[t] += sum_c W[row, c] * x[t][c] over this lane's columns, t < nt.
template <int ENC, bool VEC, int NT>
__device__ __forceinline__ void row_dot(const uint8_t* w, const uint8_t* sc, int64_t row,
                                        int64_t cols, const float* const* x, int nt, float* acc,
                                        const float* lut) {
  const int lane = threadIdx.x & 31;
  if constexpr (VEC && ENC == kBF16) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + row * cols * 2);
    for (int64_t i = lane; i < cols / 8; i += 32) {
      const uint4 q = __ldg(wr + i);
      const float wv[8] = {bf16f(q.x & 0xffff), bf16f(q.x >> 16),    bf16f(q.y & 0xffff),
                           bf16f(q.y >> 16),    bf16f(q.z & 0xffff), bf16f(q.z >> 16),
                           bf16f(q.w & 0xffff), bf16f(q.w >> 16)};
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        const float4 a = __ldg(reinterpret_cast<const float4*>(x[t]) + 2 * i);
        const float4 b = __ldg(reinterpret_cast<const float4*>(x[t]) + 2 * i + 1);
        acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x +
                  wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
      }
    }
  } else if constexpr (VEC && ENC == kF32) {
    const float4* wr = reinterpret_cast<const float4*>(w + row * cols * 4);
    for (int64_t i = lane; i < cols / 4; i += 32) {
      const float4 q = __ldg(wr + i);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        const float4 a = __ldg(reinterpret_cast<const float4*>(x[t]) + i);
        acc[t] += q.x * a.x + q.y * a.y + q.z * a.z + q.w * a.w;
      }
    }
  } else if constexpr (VEC && ENC == kMXFP4) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + row * (cols / 2));
    const uint8_t* sr = sc + row * (cols / 32);
    for (int64_t b = lane; b < cols / 32; b += 32) {
      const uint4 q = __ldg(wr + b);
      const float s = e8m0f(__ldg(sr + b));
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      float wv[32];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
        wv[2 * j] = lut[byte & 15] * s;
        wv[2 * j + 1] = lut[byte >> 4] * s;
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        const float4* xb = reinterpret_cast<const float4*>(x[t] + b * 32);
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 a = __ldg(xb + j);
          part += wv[4 * j] * a.x + wv[4 * j + 1] * a.y + wv[4 * j + 2] * a.z + wv[4 * j + 3] * a.w;
        }
        acc[t] += part;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wv = weight_at<ENC>(w, sc, row, c, cols, lut);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        acc[t] += wv * x[t][c];
      }
    }
  }
}

// MXFP4 rows that share their activations: acc[r][t] += W_r . x[t] for R
// rows (row r's 16-byte blocks at wr[r], its e8m0 scales at sr[r]; a null
// wr[r] is skipped), each x block loaded once for all R rows. nb: blocks of 32
// columns per row (cols / 32). Vector path: rows 16-byte aligned.
template <int R, int NT>
__device__ __forceinline__ void mxfp4_rows_dot(const uint4* const* wr, const uint8_t* const* sr,
                                               int64_t nb, const float* const* x, int nt,
                                               float (*acc)[NT], const float* lut) {
  const int lane = threadIdx.x & 31;
  for (int64_t b = lane; b < nb; b += 32) {
    uint4 q[R];
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!wr[r]) continue;
      q[r] = __ldg(wr[r] + b);
      s[r] = e8m0f(__ldg(sr[r] + b));
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const float4* xb = reinterpret_cast<const float4*>(x[t] + b * 32);
      float xv[32];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 a = __ldg(xb + j);
        xv[4 * j] = a.x, xv[4 * j + 1] = a.y, xv[4 * j + 2] = a.z, xv[4 * j + 3] = a.w;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (!wr[r]) continue;
        const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
        float part = 0.0f;  // the block's sum of code values x activations; scaled once
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
          part += lut[byte & 15] * xv[2 * j] + lut[byte >> 4] * xv[2 * j + 1];
        }
        part *= s[r];
        acc[r][t] += part;
      }
    }
  }
}

}  // namespace moetier::cuda
