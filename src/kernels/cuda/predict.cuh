// Predicted experts brought into L2 during a decode layer's attention
// (cuda.h ExpertPrefetch; docs/cuda.md "Predicted experts"), and the router's
// count of how many it then chose.
//
// Protocol: the q/k/v GEMV writes logits [e] (the layer's router applied to
// the layer's input, normalized with its post-attention norm); every block of
// the o projection's GEMV, launched while attention runs, reads them before
// its grid_wait (two launches back: attention called grid_launch_dependents
// only after its own wait, so the GEMV has completed) and takes the top k,
// block 0 writes them to ids [k] (read only by the router, after its wait),
// and each block issues its share of the prefetches, then goes on to its rows. The expert table is
// read in place: it changes only between steps. Prefetches are hints (no completion, no result
// changes).
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

__device__ __forceinline__ void l2_bulk_prefetch(const void* p, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#else
  (void)p, (void)n;
#endif
}

// Every block of the launch, every thread (it syncs): the top k of pf.logits
// by warp 0 (k rounds of a warp arg-max over keys in shared memory, ties to
// the lower id; block 0 writes them to pf.ids), then the block's share of the
// prefetch: the experts' regions laid end to end (expert r's gate, up, gate
// scales, up scales), cut into gridDim.x equal slices, slice b issued by
// block b, one bulk prefetch per region it meets. Spread so: an SM's copy
// engine issues about one 128-byte line a clock (one block prefetching 16 MB
// held the launch about 60 us on the H200).
__device__ __forceinline__ void predict_prefetch(const ExpertPrefetch& pf) {
  __shared__ uint32_t key[1024];  // e <= 1024 (the router's limit)
  __shared__ int32_t sid[32];     // k <= 32
  const int lane = int(threadIdx.x & 31);
  if (threadIdx.x < 32) {
    for (int i = lane; i < pf.e; i += 32)
      key[i] = order_key(__ldcg(pf.logits + i)) | 1u;  // 0: taken
    __syncwarp();
    for (int r = 0; r < pf.k; ++r) {
      uint32_t best = 0, id = 0xffffffffu;
      for (int i = lane; i < pf.e; i += 32)  // ascending ids: the first maximum wins ties
        if (key[i] > best) best = key[i], id = uint32_t(i);
      const uint32_t top = warp_reduce_u32<true>(best);
      const uint32_t win = warp_reduce_u32<false>(best == top ? id : 0xffffffffu);
      if (lane == 0) {
        key[win] = 0, sid[r] = int32_t(win);
        if (blockIdx.x == 0) pf.ids[r] = int32_t(win);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  if (threadIdx.x >= 4 * unsigned(pf.k)) return;
  const int r = int(threadIdx.x / 4), g = int(threadIdx.x % 4);  // expert rank, region
  const uint64_t per = uint64_t(pf.bytes[0]) + pf.bytes[1] + pf.bytes[2] + pf.bytes[3];
  const uint64_t all = per * uint64_t(pf.k), share = (all / gridDim.x + 16) / 16 * 16;
  uint64_t off = per * uint64_t(r);  // the region's first byte, end to end
  for (int j = 0; j < g; ++j) off += pf.bytes[j];
  const uint64_t lo = share * blockIdx.x, hi = lo + share, end = off + pf.bytes[g];
  if (hi <= off || lo >= end) return;
  const ExpertPtrs& ex = pf.table[sid[r]];
  const void* base = g == 0 ? ex.w[0] : g == 1 ? ex.w[1] : g == 2 ? ex.s[0] : ex.s[1];
  if (!base || (reinterpret_cast<uintptr_t>(base) & 15u)) return;
  const uint64_t a = lo > off ? lo : off, b = hi < end ? hi : end;
  l2_bulk_prefetch(static_cast<const char*>(base) + (a - off), uint32_t(b - a));
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
