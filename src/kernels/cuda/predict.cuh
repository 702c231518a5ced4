// Predicted experts brought into L2 during a decode layer's attention
// (cuda.h ExpertPrefetch; docs/cuda.md "Predicted experts"), and the router's
// count of how many it then chose.
//
// Protocol: the q/k/v GEMV writes logits [e] (the layer's router applied to
// the layer's input, normalized with its post-attention norm); block 0 of the
// o projection's GEMV, launched while attention runs, reads them before its
// grid_wait (two launches back: attention called grid_launch_dependents only
// after its own wait, so the GEMV has completed), writes the top k to ids [k]
// (read only by the router, after its wait) and issues the prefetches, then
// waits like every block. The expert table is read in place: it changes only
// between steps. Prefetches are hints (no completion, no result changes).
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

// Bytes brought into L2 by one bulk prefetch (cp.async.bulk.prefetch, sm_90+).
constexpr uint32_t kPrefetchPiece = 64 * 1024;

__device__ __forceinline__ void l2_bulk_prefetch(const void* p, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#else
  (void)p, (void)n;
#endif
}

// Block-wide, every thread (it syncs): the top k of pf.logits by warp 0 (k
// rounds of a warp arg-max over keys in shared memory, ties to the lower id),
// then the prefetches in 64 KiB pieces spread over the block's threads.
static __device__ __noinline__ void predict_prefetch(const ExpertPrefetch& pf) {
  __shared__ uint32_t key[1024];  // e <= 1024 (the router's limit)
  __shared__ int32_t sid[32];     // k <= 32
  const int lane = int(threadIdx.x & 31);
  for (int i = int(threadIdx.x); i < pf.e; i += int(blockDim.x))
    key[i] = order_key(__ldcg(pf.logits + i)) | 1u;  // 0: taken
  __syncthreads();
  if (threadIdx.x < 32) {
    for (int r = 0; r < pf.k; ++r) {
      uint32_t best = 0, id = 0xffffffffu;
      for (int i = lane; i < pf.e; i += 32)  // ascending ids: the first maximum wins ties
        if (key[i] > best) best = key[i], id = uint32_t(i);
      const uint32_t top = warp_reduce_u32<true>(best);
      const uint32_t win = warp_reduce_u32<false>(best == top ? id : 0xffffffffu);
      if (lane == 0) key[win] = 0, sid[r] = int32_t(win), pf.ids[r] = int32_t(win);
      __syncwarp();
    }
  }
  __syncthreads();
  int64_t j0 = 0;  // pieces before this region, over all experts
  for (int r = 0; r < pf.k; ++r) {
    const ExpertPtrs& ex = pf.table[sid[r]];
    const void* base[4] = {ex.w[0], ex.w[1], ex.s[0], ex.s[1]};
    for (int g = 0; g < 4; ++g) {
      const uint32_t n = pf.bytes[g];
      const int64_t np = (n + kPrefetchPiece - 1) / kPrefetchPiece, bd = blockDim.x;
      if (base[g] && (reinterpret_cast<uintptr_t>(base[g]) & 15u) == 0)
        for (int64_t pc = ((int64_t(threadIdx.x) - j0) % bd + bd) % bd; pc < np; pc += bd) {
          const uint32_t off = uint32_t(pc) * kPrefetchPiece;
          l2_bulk_prefetch(static_cast<const char*>(base[g]) + off,
                           n - off < kPrefetchPiece ? n - off : kPrefetchPiece);
        }
      j0 += np;
    }
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
