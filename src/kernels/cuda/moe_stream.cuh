// The resident MoE decode step for MXFP4 experts with q8 activations in one
// persistent launch (opt-in: MOETIER_CUDA_MOE=fused; on the H200 it was not
// faster than decode_q8.cu's kernels, docs/cuda.md), its weights streamed
// into shared memory by the bulk copy engine (sm_90+: cp.async.bulk
// completing on an mbarrier): each warp keeps a private ring of stages in
// flight, one copy instruction per matrix row instead of one load per 16
// bytes per lane, and no block-wide synchronization in the loop.
//
// Two kernels (decode_q8.cu's moe_decode_fused), each started with PDL:
//  - quantize: x -> q8 blocks, word-transposed (Q8T: pair j of block b's
//    codes at p[j * nb + b], so that lanes reading consecutive blocks read
//    consecutive words of shared memory);
//  - the MoE step on a grid of one block per SM, W warps a block, in two
//    phases apart by a grid barrier:
//    gate/up: work unit g (one row of h of one selected expert: its gate row,
//    up row and their scales) goes to warp (g / G) % W of block g % G, so
//    consecutive units spread over the SMs; each warp writes h = silu(gate x)
//    * up x as f32 for its units;
//    down: work unit q (output rows 2q, 2q + 1) streams one stage per
//    selected expert, in ascending id order (rank_experts); after the barrier
//    every block quantizes h into shared memory (q8, each block of 32 with
//    its slot's routing weight folded into the scale) and each warp
//    accumulates its two rows over the k stages of a unit.
//    Each warp's ring runs on from its gate/up units into its down units, so
//    down's weights stream in while gate/up ends and the barrier is crossed.
// The integer block sums are those of the CPU's q8 mode; the f32 sums differ
// from it (and from decode_q8.cu's kernels) only in their order, which is fixed.
// A first version with gate/up and down as two kernels (f2e373a) measured the
// same as decode_q8.cu's kernels (bench/results/h200-moe-probe.json).
//
// Ring protocol (per warp, P stages): lane 0 initializes the warp's P
// mbarriers (count 1) before the block syncs; stage s of the warp lands in
// slot s % P and completes phase (s / P) & 1 of that slot's barrier (lane 0:
// arrive.expect_tx of the stage's bytes, then its copies). Every lane waits
// on the phase before reading the slot; after computing, the warp syncs
// (__syncwarp) and lane 0 issues stage s + P into the slot (its reads are
// done). The first P stages of every warp are issued before grid_wait when
// `early` (weights only; the ids that address them are two or more launches
// back, launch.cuh); x and h are read only after the wait.
#pragma once

#include <cstdint>

#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/q8.cuh"

namespace moetier::cuda {

constexpr int kStreamWarps = 16, kStreamThreads = kStreamWarps * 32;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// Makes the barriers' initialization visible to the copy engine (before the
// block syncs and the first copy is issued).
__device__ __forceinline__ void mbar_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nW%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W%=;\n}" ::"r"(smem_u32(bar)),
      "r"(phase)
      : "memory");
#endif
}

// nb q8 blocks, word-transposed, in global or shared memory: pair j (words 2j,
// 2j + 1) of block b's codes at p[j * nb + b], of their negations at
// n[j * nb + b], the scale at d[b]. 68 bytes a block.
struct Q8T {
  uint2* p;
  uint2* n;
  float* d;
  int nb;
  __device__ int dot(uint4 w, int b) const {
    int s = 0;
    const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 a = p[j * nb + b], c = n[j * nb + b];
      s = word_dot(wd[j], make_int2(int(a.x), int(a.y)), make_int2(int(c.x), int(c.y)), s);
    }
    return s;
  }
};
__host__ __device__ constexpr size_t q8t_bytes(int64_t nb) { return size_t(nb) * 68; }
__host__ __device__ inline Q8T q8t_at(void* base, int nb) {
  auto* p = static_cast<uint2*>(base);
  return {p, p + 4 * nb, reinterpret_cast<float*>(p + 8 * nb), nb};
}

__host__ __device__ constexpr size_t align128(size_t b) { return (b + 127) / 128 * 128; }
// A gate/up stage: one gate row [nb] uint4, one up row, their scales [nb] each.
__host__ __device__ constexpr size_t gu_stage_bytes(int64_t nb) { return size_t(nb) * 34; }
// A down stage: two rows [2][nch] uint4 of one expert, their scales [2][nch].
__host__ __device__ constexpr size_t dn_stage_bytes(int64_t nch) { return size_t(nch) * 34; }
// Grid: ceil(nb / 128). x [nb * 32] -> xt (q8t_at(xt, nb)).
__global__ void __launch_bounds__(128)
    quantize_q8t_kernel(const float* x, int nb, void* xt, int early) {
  const int b = int(blockIdx.x) * 128 + int(threadIdx.x);
  auto work = [&] {
    if (b >= nb) return;
    float v[32];
    const float4* p = reinterpret_cast<const float4*>(x) + 8 * size_t(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 a = __ldcg(p + j);
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
    }
    Q8x q;
    const Q8T t = q8t_at(xt, nb);
    t.d[b] = quantize32(v, &q);
    t.p[b] = make_uint2(q.p0.x, q.p0.y), t.p[nb + b] = make_uint2(q.p0.z, q.p0.w);
    t.p[2 * nb + b] = make_uint2(q.p1.x, q.p1.y), t.p[3 * nb + b] = make_uint2(q.p1.z, q.p1.w);
    t.n[b] = make_uint2(q.n0.x, q.n0.y), t.n[nb + b] = make_uint2(q.n0.z, q.n0.w);
    t.n[2 * nb + b] = make_uint2(q.n1.x, q.n1.y), t.n[3 * nb + b] = make_uint2(q.n1.z, q.n1.w);
  };
  if (early) work();  // x: two launches back (the router is in between)
  grid_wait();
  grid_launch_dependents();
  if (!early) work();
}

// Copies nq q8t blocks (global, written by the kernel before) into shared memory.
__device__ __forceinline__ void copy_q8t(const void* src, void* dst, int64_t nq) {
  const auto* s = static_cast<const uint2*>(src);
  auto* d = static_cast<uint2*>(dst);
  for (int64_t i = threadIdx.x; i < nq * 8; i += blockDim.x) d[i] = s[i];
  const float* sd = reinterpret_cast<const float*>(s + 8 * nq);
  float* dd = reinterpret_cast<float*>(d + 8 * nq);
  for (int64_t i = threadIdx.x; i < nq; i += blockDim.x) dd[i] = sd[i];
}

// h [k * inter] f32 -> q8t in shared memory (nq = k * inter / 32 blocks), the
// block of slot j scaled by weights[j]: a thread quantizes 4 values (one
// word), 8 threads a block; all of a thread's loads are issued first
// (nq * 8 <= kMaxHF * kStreamThreads, moe_stream_applies).
constexpr int kMaxHF = 8;
__device__ __forceinline__ void quantize_h(const float* h, const float* weights, int inter, Q8T t,
                                           int nq) {
  const int nf = nq * 8;  // float4s
  float4 v[kMaxHF];
#pragma unroll
  for (int j = 0; j < kMaxHF; ++j) {
    const int f = int(threadIdx.x) + j * kStreamThreads;
    v[j] = f < nf ? __ldcg(reinterpret_cast<const float4*>(h) + f) : make_float4(0, 0, 0, 0);
  }
  const int nch = inter / 32;
#pragma unroll
  for (int j = 0; j < kMaxHF; ++j) {
    const int f = int(threadIdx.x) + j * kStreamThreads, b = f / 8, w = f % 8;
    const float a[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(a[i])), finite = finite && isfinite(a[i]);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {  // the 8 threads of block b (f and lanes 8-aligned)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      finite = __shfl_xor_sync(0xffffffffu, int(finite), o) && finite;
    }
    if (f >= nf) continue;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = finite ? __float2int_rn(a[i] * id) : 0;
    reinterpret_cast<uint32_t*>(t.p + (w / 2) * nq + b)[w % 2] = pack4(q[0], q[1], q[2], q[3]);
    reinterpret_cast<uint32_t*>(t.n + (w / 2) * nq + b)[w % 2] = pack4(-q[0], -q[1], -q[2], -q[3]);
    if (w == 0)
      t.d[b] = (finite ? amax / 127.0f : __int_as_float(0x7fc00000)) * __ldcg(weights + b / nch);
  }
}

// A barrier of all G blocks of a grid, every one of them resident (a
// persistent grid of at most one block per SM): bar[0] counts arrivals, bar[1]
// is the generation (both 0 before the first launch). The last block to arrive
// resets the count, then moves the generation; the others wait for it to move.
// Writes of every thread of a block before the barrier are visible to every
// block after it (block sync, then a fence by the thread that arrives).
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned G) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = bar + 1;
    const unsigned g = *gen;  // read before arriving: it cannot move before this block arrives
    __threadfence();
    if (atomicAdd(bar, 1u) == G - 1) {
      bar[0] = 0;
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == g) __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
}

// Shared memory of the fused kernel: x (nb q8t blocks), h (nq), W rings of P
// slots of max(gate/up, down) stage bytes, W x P barriers.
__host__ __device__ constexpr size_t fused_slot_bytes(int64_t nb, int64_t nch) {
  return gu_stage_bytes(nb) > dn_stage_bytes(nch) ? gu_stage_bytes(nb) : dn_stage_bytes(nch);
}
__host__ __device__ constexpr size_t fused_ring_offset(int64_t nb, int64_t nq) {
  return align128(q8t_bytes(nb)) + align128(q8t_bytes(nq));
}
__host__ __device__ constexpr size_t fused_smem_bytes(int64_t nb, int64_t nch, int64_t nq, int P) {
  return align128(fused_ring_offset(nb, nq) +
                  size_t(kStreamWarps) * size_t(P) * fused_slot_bytes(nb, nch)) +
         size_t(kStreamWarps) * size_t(P) * 8;
}

// The MoE step (G blocks, all resident; see the top of this file). h goes
// through global memory (f32). bar: two device words, 0 before the first
// launch, used by one launch at a time.
template <int NC, int NU>
__global__ void __launch_bounds__(kStreamThreads, 1)
    moe_fused_stream_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights,
                            int k, const void* xt, int hidden, int inter, float* h, float* out,
                            unsigned* bar, int P, int early) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ const uint8_t* wp[32][4];  // slot -> gate codes, up codes, gate scales, up scales
  __shared__ RankedExperts rk;
  const int nb = hidden / 32, nch = inter / 32, nq = k * nch, G = int(gridDim.x);
  const int TW = G * kStreamWarps, warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int me = int(blockIdx.x) + G * warp, gtotal = k * inter, pairs = hidden / 2;
  const int ng = me < gtotal ? (gtotal - me + TW - 1) / TW : 0;
  const int n = ng + (me < pairs ? (pairs - me + TW - 1) / TW * k : 0);
  const size_t sb = fused_slot_bytes(nb, nch);
  const Q8T x = q8t_at(sm, nb), hq = q8t_at(sm + align128(q8t_bytes(nb)), nq);
  uint8_t* ring = sm + fused_ring_offset(nb, nq) + size_t(warp) * P * sb;
  auto* bars = reinterpret_cast<uint64_t*>(
                   sm + align128(fused_ring_offset(nb, nq) + size_t(kStreamWarps) * P * sb)) +
               warp * P;
  auto issue = [&](int s) {  // lane 0: stage s of this warp -> slot s % P
    uint8_t* dst = ring + size_t(s % P) * sb;
    uint64_t* b = bars + s % P;
    if (s < ng) {
      const int g = me + s * TW, slot = g / inter;
      const size_t r = size_t(g % inter) * size_t(nb);
      mbar_expect(b, uint32_t(gu_stage_bytes(nb)));
      bulk_load(dst, wp[slot][0] + 16 * r, uint32_t(16 * nb), b);
      bulk_load(dst + 16 * nb, wp[slot][1] + 16 * r, uint32_t(16 * nb), b);
      bulk_load(dst + 32 * nb, wp[slot][2] + r, uint32_t(nb), b);
      bulk_load(dst + 33 * nb, wp[slot][3] + r, uint32_t(nb), b);
    } else {
      const int t = s - ng, e = t % k;
      const size_t r = size_t(me + (t / k) * TW) * 2 * size_t(nch);
      mbar_expect(b, uint32_t(dn_stage_bytes(nch)));
      bulk_load(dst, rk.w[e] + 16 * r, uint32_t(32 * nch), b);
      bulk_load(dst + 32 * nch, rk.s[e] + r, uint32_t(2 * nch), b);
    }
  };
  auto prep = [&] {
    if (warp == 0 && lane < k) {
      const ExpertPtrs& ex = table[__ldcg(ids + lane)];
      wp[lane][0] = static_cast<const uint8_t*>(ex.w[0]);
      wp[lane][1] = static_cast<const uint8_t*>(ex.w[1]);
      wp[lane][2] = ex.s[0], wp[lane][3] = ex.s[1];
    }
    if (lane < P) mbar_init(bars + lane);
    mbar_fence_init();
    rank_experts(table, ids, weights, k, rk);  // syncs the block
    if (lane == 0)
      for (int s = 0; s < P && s < n; ++s) issue(s);
  };
  auto next = [&](int s) {  // the warp is done with stage s's slot
    __syncwarp();
    if (lane == 0 && s + P < n) issue(s + P);
  };
  if (early) prep();  // ids and weights: two launches back
  grid_wait();        // x comes from the kernel before
  if (!early) prep();
  copy_q8t(xt, sm, nb);
  __syncthreads();
  for (int s = 0; s < ng; ++s) {  // gate/up
    mbar_wait(bars + s % P, uint32_t(s / P) & 1u);
    const uint8_t* st = ring + size_t(s % P) * sb;
    const auto* gc = reinterpret_cast<const uint4*>(st);
    const uint8_t* gs = st + 32 * nb;
    float ag = 0.0f, au = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int i = lane + 32 * c;
      if (i < nb) {
        const float d = x.d[i];
        ag += float(x.dot(gc[i], i)) * (e8m0_half(gs[i]) * d);
        au += float(x.dot(gc[nb + i], i)) * (e8m0_half(gs[nb + i]) * d);
      }
    }
    const float g = warp_sum(ag), u = warp_sum(au);
    next(s);
    if (lane == 0) h[me + s * TW] = g / (1.0f + expf(-g)) * u;
  }
  grid_barrier(bar, unsigned(G));
  // Only now, with every block of this grid resident: a dependent launched
  // earlier could take the SM that a block not yet resident waits for, and
  // spin in its grid_wait while the barrier waits for that block (a hang seen
  // once in FusedMoeKernelMatchesCpu).
  grid_launch_dependents();
  quantize_h(h, weights, inter, hq, nq);
  __syncthreads();
  float a0 = 0.0f, a1 = 0.0f;
  for (int s = ng; s < n; ++s) {  // down
    mbar_wait(bars + s % P, uint32_t(s / P) & 1u);
    const uint8_t* st = ring + size_t(s % P) * sb;
    const int t = s - ng, e = t % k, hb = rk.slot[e] * nch;
    const auto* c = reinterpret_cast<const uint4*>(st);
    const uint8_t* sc = st + 32 * nch;
#pragma unroll
    for (int u = 0; u < NU; ++u) {
      const int i = lane + 32 * u;
      if (i < nch) {
        const float d = hq.d[hb + i];
        a0 += float(hq.dot(c[i], hb + i)) * (e8m0_half(sc[i]) * d);
        a1 += float(hq.dot(c[nch + i], hb + i)) * (e8m0_half(sc[nch + i]) * d);
      }
    }
    next(s);
    if (e == k - 1) {
      const float t0 = warp_sum(a0), t1 = warp_sum(a1);
      const int row = 2 * (me + (t / k) * TW);
      if (lane == 0) out[row] = t0, out[row + 1] = t1;
      a0 = a1 = 0.0f;
    }
  }
}

}  // namespace moetier::cuda
