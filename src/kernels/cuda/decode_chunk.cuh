// Device helpers of the decode kernels (decode.cu, fused.cu): one lane's
// 16-byte weight chunk (load, then multiply by activations, so a lane can
// issue all its loads before it uses any), activation chunk loads, and
// fixed-order warp / block reductions.
#pragma once

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rowdot.cuh"
#include "kernels/cuda/stream_ld.cuh"

namespace moetier::cuda {

constexpr int kMaxThreads = 256;

template <int ENC>
struct Chunk;

template <>
struct Chunk<kF32> {
  static constexpr int kCols = 4;
  struct W {
    float4 q;
  };
  __device__ static W load(const uint8_t* w, const uint8_t*, int64_t row, int64_t cols, int64_t i) {
    return {ldg_w(reinterpret_cast<const float4*>(w + row * cols * 4) + i)};
  }
  __device__ static float dot(const W& c, const float* xv, const float*) {
    return c.q.x * xv[0] + c.q.y * xv[1] + c.q.z * xv[2] + c.q.w * xv[3];
  }
};

template <>
struct Chunk<kBF16> {
  static constexpr int kCols = 8;
  struct W {
    uint4 q;
  };
  __device__ static W load(const uint8_t* w, const uint8_t*, int64_t row, int64_t cols, int64_t i) {
    return {ldg_w(reinterpret_cast<const uint4*>(w + row * cols * 2) + i)};
  }
  __device__ static float dot(const W& c, const float* xv, const float*) {
    const uint4 q = c.q;
    return bf16f(q.x & 0xffff) * xv[0] + bf16f(q.x >> 16) * xv[1] + bf16f(q.y & 0xffff) * xv[2] +
           bf16f(q.y >> 16) * xv[3] + bf16f(q.z & 0xffff) * xv[4] + bf16f(q.z >> 16) * xv[5] +
           bf16f(q.w & 0xffff) * xv[6] + bf16f(q.w >> 16) * xv[7];
  }
};

template <>
struct Chunk<kMXFP4> {
  static constexpr int kCols = 32;
  struct W {
    uint4 q;
    uint32_t s;  // e8m0 scale of the block
  };
  __device__ static W load(const uint8_t* w, const uint8_t* sc, int64_t row, int64_t cols,
                           int64_t i) {
    return {ldg_w(reinterpret_cast<const uint4*>(w + row * (cols / 2)) + i),
            ldg_w(sc + row * (cols / 32) + i)};
  }
  __device__ static float dot(const W& c, const float* xv, const float* lut) {
    const uint32_t words[4] = {c.q.x, c.q.y, c.q.z, c.q.w};
    float part = 0.0f;  // code values x activations; scaled once per block
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
      part += lut[byte & 15] * xv[2 * j] + lut[byte >> 4] * xv[2 * j + 1];
    }
    return part * e8m0f(c.s);
  }
};

template <int N>
__device__ __forceinline__ void load_x(const float* x, int64_t i, float* xv) {
  const float4* p = reinterpret_cast<const float4*>(x) + i * (N / 4);
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    const float4 a = __ldg(p + j);
    xv[4 * j] = a.x, xv[4 * j + 1] = a.y, xv[4 * j + 2] = a.z, xv[4 * j + 3] = a.w;
  }
}

// Sums v[r] over the block (fixed order); thread r < R gets row r's total.
template <int R>
__device__ __forceinline__ float block_sum(float (&v)[R], float (*red)[kMaxThreads / 32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = warp_sum(v[r]);
    if (lane == 0) red[r][warp] = s;
  }
  __syncthreads();
  float t = 0.0f;
  if (threadIdx.x < R)
    for (int w = 0; w < nw; ++w) t += red[threadIdx.x][w];
  return t;
}

// Warp sums of v[r] (butterflies: every lane holds every total); lane r < R
// returns row r's total. (For R a power of two <= 16, rowdot.cuh's
// warp_rows_scatter gives lane r the same row in R - 1 + 5 - log2 R shuffles
// instead of 5 R; gate/up's end uses it.)
template <int R>
__device__ __forceinline__ float warp_rows_sum(float (&v)[R]) {
  const int lane = threadIdx.x & 31;
  float mine = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = warp_sum(v[r]);
    if (lane == r) mine = s;
  }
  return mine;
}

// The k (<= 32) routed experts of a decode step in ascending id order (ties
// by slot), for the down kernels' one dot product over all of them: rank e's
// down matrix and scales, its routing weight and its slot (its row of h).
struct RankedExperts {
  const uint8_t* w[32];
  const uint8_t* s[32];
  float weight[32];
  int slot[32];
};
// Threads j < k each rank slot j; the block syncs before anyone reads r.
// ids and weights are read through L2 (ld.global.cg): the q8 down kernel
// ranks before its grid_wait (decode_q8.cu, early reads).
// rank_slot: slot j < k ranked by the calling thread (no sync; rank_experts
// is threads j < k of the block, then __syncthreads).
__device__ __forceinline__ void rank_slot(const ExpertPtrs* table, const int32_t* ids,
                                          const float* weights, int k, int j, RankedExperts& r) {
  if (j < k) {
    const int my = __ldcg(ids + j);
    int rank = 0;
    for (int i = 0; i < k; ++i) {
      const int o = __ldcg(ids + i);
      rank += o < my || (o == my && i < j);
    }
    const ExpertPtrs& ex = table[my];
    r.w[rank] = static_cast<const uint8_t*>(ex.w[2]);
    r.s[rank] = ex.s[2];
    r.weight[rank] = __ldcg(weights + j);
    r.slot[rank] = j;
  }
}
__device__ __forceinline__ void rank_experts(const ExpertPtrs* table, const int32_t* ids,
                                             const float* weights, int k, RankedExperts& r) {
  rank_slot(table, ids, weights, k, int(threadIdx.x), r);
  __syncthreads();
}

}  // namespace moetier::cuda
