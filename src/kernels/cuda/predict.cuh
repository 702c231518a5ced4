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
// One warp: the top k of logits [e] to ids [k] (lane 0 writes; global or
// shared memory), key [e] its shared scratch.
__device__ __forceinline__ void warp_topk_ids(const float* logits, int e, int k, uint32_t* key,
                                              int32_t* ids) {
  const int lane = int(threadIdx.x & 31);
  for (int i = lane; i < e; i += 32) key[i] = order_key(__ldcg(logits + i)) | 1u;  // 0: taken
  __syncwarp();
  for (int r = 0; r < k; ++r) {
    uint32_t best = 0, id = 0xffffffffu;
    for (int i = lane; i < e; i += 32)  // ascending ids: the first maximum wins ties
      if (key[i] > best) best = key[i], id = uint32_t(i);
    const uint32_t top = warp_reduce_u32<true>(best);
    const uint32_t win = warp_reduce_u32<false>(best == top ? id : 0xffffffffu);
    if (lane == 0) key[win] = 0, ids[r] = int32_t(win);
    __syncwarp();
  }
}
__device__ __forceinline__ void predict_ids(const ExpertPredict& pf) {
  extern __shared__ uint32_t key[];  // [e]
  if (blockIdx.x != 0 || threadIdx.x >= 32) return;
  warp_topk_ids(pf.logits, pf.e, pf.k, key, pf.ids);
}

// Block b of l.blocks (ExpertL2), after its grid_wait (the logits come from
// the kernel before): the top k of l.logits as predict_ids takes them, then
// its share of their gate and up rows' bytes [from, to) and all of their
// scales asked of L2 (bulk prefetches of at most 1 KB: hints, never reads).
// smem: (e + k) words of shared memory.
__device__ __forceinline__ void prefetch_predicted(const ExpertL2& l, int b, uint32_t* smem) {
  int32_t* ids = reinterpret_cast<int32_t*>(smem + l.e);
  if (threadIdx.x < 32) warp_topk_ids(l.logits, l.e, l.k, smem, ids);
  __syncthreads();
  constexpr int64_t kPiece = 1024;
  const int64_t span = l.to - l.from, wp = (span + kPiece - 1) / kPiece;  // pieces of a row
  const int64_t sbytes = l.rows * l.scale_bytes, sp = (sbytes + kPiece - 1) / kPiece;
  const int64_t per = l.rows * wp + sp;  // pieces of one matrix and its scales
  const int64_t n = int64_t(l.k) * 2 * per;
  for (int64_t i = int64_t(b) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(l.blocks) * blockDim.x) {
    const int64_t m = i / per, j = i % per;  // matrix m: expert slot m / 2, gate (0) or up (1)
    const ExpertPtrs& ex = l.table[ids[m / 2]];
    const char* a;
    int64_t len;
    if (j < l.rows * wp) {
      const int64_t row = j / wp, o = l.from + (j % wp) * kPiece;
      a = static_cast<const char*>(ex.w[m % 2]) + row * l.row_bytes + o;
      len = l.to - o < kPiece ? l.to - o : kPiece;
    } else {
      const int64_t o = (j - l.rows * wp) * kPiece;
      a = reinterpret_cast<const char*>(ex.s[m % 2]) + o;
      len = sbytes - o < kPiece ? sbytes - o : kPiece;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // 16-byte bounds, inside [a, a + len) but for the first bytes below a
    // (regions need not be aligned; an allocation's base is)
    const auto a0 = reinterpret_cast<uintptr_t>(a) & ~uintptr_t(15);
    const auto a1 = (reinterpret_cast<uintptr_t>(a) + uintptr_t(len)) & ~uintptr_t(15);
    if (a1 > a0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a0), "r"(unsigned(a1 - a0))
                   : "memory");
#else
    for (int64_t o = 0; o < len; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + o));
#endif
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
