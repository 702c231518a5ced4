// The router's softmax top-k for one token in one warp (ops.cu's kernel and
// the fused router of decode.cu). Logits are read through L2 (__ldcg): the
// fused router's last block reads what the other blocks just wrote.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {

// One warp per token; lane j holds the probabilities of experts j, j + 32,
// ... (V per lane). k rounds of a warp arg-max (ties to the lower id); the
// weights are summed in selection order by lane 0.
template <int V>
__device__ __forceinline__ void softmax_topk_warp(const float* logits, int64_t e, int64_t k,
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
  float sel_sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    float v = -2.0f;
    int id = INT32_MAX, at = 0;
#pragma unroll
    for (int i = 0; i < V; ++i)  // ascending ids: the first maximum wins ties
      if (p[i] > v) v = p[i], id = lane + 32 * i, at = i;
    const int mine = id;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
      const int id2 = __shfl_xor_sync(0xffffffffu, id, o);
      if (v2 > v || (v2 == v && id2 < id)) v = v2, id = id2;
    }
    if (id == mine) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i == at) p[i] = -2.0f;  // taken
    }
    if (lane == 0) {
      ids[r] = id;
      weights[r] = v;
      sel_sum += v;
    }
  }
  __syncwarp();
  if (renorm && lane == 0)
    for (int64_t r = 0; r < k; ++r) weights[r] = weights[r] / sel_sum;
}

}  // namespace moetier::cuda
