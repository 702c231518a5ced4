// A decode layer's experts predicted before its router runs (cuda.h
// ExpertPredict; docs/cuda.md "Predicted experts start gate/up early"), and
// the router's count of how many of them it then chose.
//
// Protocol: the q/k/v GEMV writes logits [e] (the layer's router applied to
// the layer's input, normalized with its post-attention norm); block 0 of the
// o projection's GEMV, launched while attention runs, reads them before its
// grid_wait (two launches back: attention called grid_launch_dependents only
// after its own wait, so the GEMV has completed), takes the top k and writes
// them to ids [k]. The router (the next launch) counts them after its wait;
// gate/up (two launches after the o projection) reads them before its wait
// and starts copying those experts' weights while the router runs
// (decode_q8.cu). No result depends on the prediction.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/topk.cuh"

namespace moetier::cuda {

// A float's bits as an unsigned key in the float's order (NaN anywhere: a hint).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// Block 0 of the launch, warp 0: the top k of pf.logits (k rounds of a warp
// arg-max over keys in shared memory, ties to the lower id) written to pf.ids.
// The keys are the launch's dynamic shared memory (kPredictSmem, given only
// to launches that predict).
constexpr size_t kPredictSmem = ExpertPredict::kMaxExperts * sizeof(uint32_t);
__device__ __forceinline__ void predict_ids(const ExpertPredict& pf) {
  extern __shared__ uint32_t key[];  // [e]
  if (blockIdx.x != 0 || threadIdx.x >= 32) return;
  const int lane = int(threadIdx.x & 31);
  for (int i = lane; i < pf.e; i += 32) key[i] = order_key(__ldcg(pf.logits + i)) | 1u;  // 0: taken
  __syncwarp();
  for (int r = 0; r < pf.k; ++r) {
    uint32_t best = 0, id = 0xffffffffu;
    for (int i = lane; i < pf.e; i += 32)  // ascending ids: the first maximum wins ties
      if (key[i] > best) best = key[i], id = uint32_t(i);
    const uint32_t top = warp_reduce_u32<true>(best);
    const uint32_t win = warp_reduce_u32<false>(best == top ? id : 0xffffffffu);
    if (lane == 0) key[win] = 0, pf.ids[r] = int32_t(win);
    __syncwarp();
  }
}

// Warp 0 of the router's last block, after its top-k: lane r < k holds the
// router's round-r id (mine) and the predicted id pid; counts [0] += how many
// predicted ids the router chose, counts [1] += k.
__device__ __forceinline__ void count_predicted(int32_t pid, int32_t mine, int k,
                                                unsigned long long* counts) {
  const int lane = int(threadIdx.x & 31);
  bool hit = false;
  for (int j = 0; j < k; ++j) hit |= pid == __shfl_sync(0xffffffffu, mine, j);
  const unsigned n = __popc(__ballot_sync(0xffffffffu, lane < k && hit));
  if (lane == 0) atomicAdd(counts, 1ull * n), atomicAdd(counts + 1, 1ull * unsigned(k));
}

}  // namespace moetier::cuda
