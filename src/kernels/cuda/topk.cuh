// The router's softmax top-k for one token in one warp (ops.cu's kernel and
// the fused router of decode.cu). Logits are read through L2 (__ldcg): the
// fused router's last block reads what the other blocks just wrote.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {

// The warp's maximum (MAX) or minimum of v (redux on sm_80 and later).
template <bool MAX>
__device__ __forceinline__ uint32_t warp_reduce_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? max(v, w) : min(v, w);
  }
  return v;
#endif
}

// One warp per token; lane j holds the probabilities of experts j, j + 32,
// ... (V per lane). k <= 32 rounds of a warp arg-max (ties to the lower id;
// the backend refuses more); the weights are summed in selection order, and
// lane r writes round r's id and weight (and returns the id; lanes >= k: 0).
template <int V>
__device__ __forceinline__ int32_t softmax_topk_warp(const float* logits, int64_t e, int64_t k,
                                                     int renorm, float* probs, int32_t* ids,
                                                     float* weights) {
  const int lane = int(threadIdx.x & 31);
  float p[V];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t j = lane + 32 * i;
    p[i] = j < e ? __ldcg(logits + j) : -FLT_MAX;
    m = fmaxf(m, p[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    p[i] = lane + 32 * i < e ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < e) {
      p[i] = p[i] / sum;
      probs[j] = p[i];
    } else {
      p[i] = -1.0f;
    }
  }
  // Selection on integer keys: a probability's bits + 1 (p >= 0 orders as its
  // bits; 0 marks a taken or missing entry), two warp reductions a round. A
  // NaN probability (a NaN logit makes every one NaN) keys as 0.0 does, so
  // the ids stay those of real experts (as on the CPU, the lowest ids where
  // all are NaN) and no kernel after the router reads past the table. Their
  // weights are then 0, NaN when renormalized (the CPU's are NaN in both).
  uint32_t key[V];
#pragma unroll
  for (int i = 0; i < V; ++i)
    key[i] = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : (p[i] != p[i] ? 1u : 0u);
  float sel_sum = 0.0f, my_w = 0.0f;  // lane r: round r's weight and id
  int32_t my_id = 0;
  for (int64_t r = 0; r < k; ++r) {
    uint32_t best = 0, id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < V; ++i)  // ascending ids: the first maximum wins ties
      if (key[i] > best) best = key[i], id = uint32_t(lane + 32 * i);
    const uint32_t top = warp_reduce_u32<true>(best);
    const uint32_t win = warp_reduce_u32<false>(best == top ? id : 0xffffffffu);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (uint32_t(lane + 32 * i) == win) key[i] = 0;  // taken
    const float v = top ? __uint_as_float(top - 1u) : -2.0f;
    sel_sum += v;  // every lane adds the same values in selection order
    if (lane == r) my_w = v, my_id = int32_t(win);
  }
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = renorm ? my_w / sel_sum : my_w;
  }
  return my_id;
}

}  // namespace moetier::cuda
