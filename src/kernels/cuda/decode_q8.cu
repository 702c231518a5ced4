// The resident MoE decode step with int8 activations for MXFP4 experts (the
// q8 mode, as on the CPU: kernels/cpu/q8.h): the activations are cut into
// blocks of 32, each quantized to int8 with one f32 scale d = amax / 127
// (q = round-half-even(x * 127 / amax), a non-finite block gives d = NaN),
// and dotted with the weights' e2m1 codes as integers (2 x e2m1 in int8,
// four products per dp4a), each block's integer sum scaled by d times half
// the block's e8m0 scale. The CPU computes the same integer sums; the two
// differ only in f32 rounding (the order in which the scaled block sums are
// added; the routing weight folded into h's block scales).
//
// Three kernels, each started with PDL (launch.cuh):
//  - quantize: x [hidden] -> xq, one lane per block of 32 (no shuffles);
//  - gate/up: a block of 8 warps owns 32 rows of h of one selected expert, a
//    warp 4 rows (8 weight rows: 4 of gate, 4 of up), a lane one 32-column
//    chunk of each per pass; h = silu(gate x) * up x is quantized as one q8
//    block, its scale times the expert's routing weight;
//  - down: a warp owns 2 output rows and runs one dot product over the
//    (expert, chunk) items of the k experts in ascending id order.
// A q8 block is 64 bytes: its 32 int8 codes, then their 32 negations, so that
// one byte permute gives the activations with the weights' signs applied
// (e2m1 sign-magnitude: the magnitudes come from a second permute), 11
// instructions per 8 weights.
//
// Early reads (the `early` flag, set by CudaBackend::route_moe_resident, which
// launches router -> quantize -> gate/up -> down back to back): a kernel may
// read before grid_wait what the kernel two or more launches back wrote (x,
// the router's ids and weights), through L2 (ld.global.cg). That kernel has
// completed by then: the one in between called grid_launch_dependents only
// after its own grid_wait, which returned once its predecessor completed and
// its writes were flushed. Without `early` everything is read after the wait.
#include <cfloat>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

constexpr int kQuantThreads = 128;
constexpr int kGateWarps = 8, kGateRows = 4;  // 32 rows of h per block
constexpr int kDownWarps = 4, kDownRows = 2, kDownItems = 6;

// One q8 block in memory: codes q[32] then -q[32] as 4 x int4 (its scale d
// is stored apart, in an array of floats).
struct Q8x {
  int4 p0, p1, n0, n1;
};

__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xffu) | (uint32_t(b) & 0xffu) << 8 | (uint32_t(c) & 0xffu) << 16 |
         uint32_t(d) << 24;
}

// 16 bytes global -> shared, asynchronously (L2 only); committed as one group
// per pass (cp_async_commit), waited for with cp_async_wait<N> (all of this
// thread's groups but the newest N).
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *smem = __ldg(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Quantizes v[32] (one lane's block) into dst; returns d (NaN if any v is
// not finite, whose codes are then 0).
__device__ __forceinline__ float quantize32(const float (&v)[32], Q8x* dst) {
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j])), finite = finite && isfinite(v[j]);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  uint32_t p[8], n[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    int q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = finite ? __float2int_rn(v[4 * w + j] * id) : 0;
    p[w] = pack4(q[0], q[1], q[2], q[3]);
    n[w] = pack4(-q[0], -q[1], -q[2], -q[3]);
  }
  dst->p0 = make_int4(int(p[0]), int(p[1]), int(p[2]), int(p[3]));
  dst->p1 = make_int4(int(p[4]), int(p[5]), int(p[6]), int(p[7]));
  dst->n0 = make_int4(int(n[0]), int(n[1]), int(n[2]), int(n[3]));
  dst->n1 = make_int4(int(n[4]), int(n[5]), int(n[6]), int(n[7]));
  return finite ? amax / 127.0f : __int_as_float(0x7fc00000);
}

// One q8 block from the 32 lanes' values (lane j holds v[j]): lane j writes
// byte j of the codes and of their negations; every lane returns d.
__device__ __forceinline__ float quantize_warp(float v, Q8x* dst) {
  float amax = fabsf(v);
  bool finite = isfinite(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __shfl_xor_sync(0xffffffffu, int(finite), o) && finite;
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q = finite ? __float2int_rn(v * id) : 0;
  auto* b = reinterpret_cast<int8_t*>(dst);
  const int lane = int(threadIdx.x & 31);
  b[lane] = int8_t(q), b[32 + lane] = int8_t(-q);
  return finite ? amax / 127.0f : __int_as_float(0x7fc00000);
}

// prmt without __byte_perm's masking of the selector (every nibble here is < 8).
__device__ __forceinline__ int prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return int(d);
}
// Integer dot of the 8 codes of one word w of an MXFP4 chunk (nibble k =
// column 8j + k) with the q8 block's words 2j, 2j + 1 (p) and their
// negations (n), added to s: magnitudes by permuting a table of the 8 e2m1
// magnitudes (doubled: 0 1 2 3 4 6 8 12), signs by picking each activation
// byte from the codes or their negations.
__device__ __forceinline__ int word_dot(uint32_t w, int2 p, int2 n, int s) {
  constexpr uint32_t kMag0 = 0x03020100u, kMag1 = 0x0c080604u;
  const uint32_t idx = w & 0x77777777u, sel = ((w >> 1) & 0x44444444u) | 0x32103210u;
  s = __dp4a(prmt(kMag0, kMag1, idx), prmt(uint32_t(p.x), uint32_t(n.x), sel), s);
  return __dp4a(prmt(kMag0, kMag1, idx >> 16), prmt(uint32_t(p.y), uint32_t(n.y), sel >> 16), s);
}

// is[r] = integer dot of chunk q[r] (16 bytes: 32 columns) of R rows with one
// q8 block xv [8] (4 words of codes, 4 of negations as int2), read a word
// pair at a time so that only 4 of its 16 words are live.
template <int R>
__device__ __forceinline__ void dot_rows(const uint4 (&q)[R], const int2* xv, int (&is)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) is[r] = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int2 p = __ldg(xv + j), n = __ldg(xv + 4 + j);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t w = j == 0 ? q[r].x : j == 1 ? q[r].y : j == 2 ? q[r].z : q[r].w;
      is[r] = word_dot(w, p, n, is[r]);
    }
  }
}

// Half the e8m0 scale (the codes hold 2 e2m1), without branches: 2^(e - 128),
// (e - 1) << 23 for e in [2, 254], the subnormals 2^-128 and 2^-127 for 0 and
// 1, NaN for 0xff (kernels/cpu/q8.h's e8m0_half).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  const uint32_t b = e <= 1 ? 0x00200000u << e : (e - 1) << 23;
  return __uint_as_float(e == 0xffu ? 0x7fc00000u : b);
}

// Grid: ceil(nb / kQuantThreads). xq [nb], xd [nb].
__global__ void __launch_bounds__(kQuantThreads)
    quantize_q8_kernel(const float* x, int64_t nb, Q8x* xq, float* xd, int early) {
  const int64_t b = int64_t(blockIdx.x) * kQuantThreads + threadIdx.x;
  auto work = [&] {
    if (b >= nb) return;
    float v[32];
    const float4* p = reinterpret_cast<const float4*>(x) + 8 * b;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 a = __ldcg(p + j);
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
    }
    xd[b] = quantize32(v, xq + b);
  };
  if (early) work();  // x: two launches back (the router is in between)
  grid_wait();
  grid_launch_dependents();
  if (!early) work();
}

// Grid: (inter / 32, k). hq [k, inter / 32] q8 blocks, hd the same [k, inter / 32]
// scales times the slot's routing weight. Pass p: chunk lane + 32 p of the
// warp's 8 rows, copied to shared memory slot p & 1 (cp.async, each lane its
// own 16-byte chunks) while pass p - 1 is computed. The slot of pass p is
// refilled with pass p + 2 after the lane's shared loads of pass p (the only
// reads of it) are issued, which the asm's memory clobber keeps in program
// order; the copy writes the slot only after its global read returns.
// Dynamic shared memory: kGateSmem.
constexpr int kGateR2 = 2 * kGateRows;
constexpr size_t kGateSmem = size_t(2) * kGateWarps * kGateR2 * 32 * sizeof(uint4);
__global__ void __launch_bounds__(kGateWarps * 32, 3)
    moe_gate_up_q8_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights,
                          const Q8x* xq, const float* xd, int64_t hidden, int64_t inter, Q8x* hq,
                          float* hd, int early) {
  constexpr int R = kGateRows, R2 = kGateR2;
  extern __shared__ uint4 stage[];  // [2][kGateWarps][R2][32]
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), slot = int(blockIdx.y);
  const int64_t nb = hidden / 32, row0 = int64_t(blockIdx.x) * 32 + warp * R;
  const int nbi = int(nb);
  const uint4 *gw = nullptr, *uw = nullptr;  // this warp's first gate / up row
  const uint8_t *gs = nullptr, *us = nullptr;
  uint32_t sc[2] = {},
           sn[2] = {};  // e8m0 scales of passes p, p + 1: gate rows, up rows (4 per word)
  auto at = [&](int b, int r) { return stage + ((b * kGateWarps + warp) * R2 + r) * 32 + lane; };
  auto issue = [&](int i, int b) {  // the pass of chunk i -> slot b, its scales -> sn
    asm("" : "+r"(i));              // addresses from the 4 bases each pass: no 16 hoisted pointers
#pragma unroll
    for (int r = 0; r < R2; ++r) cp_async16(at(b, r), (r < R ? gw : uw) + (r % R) * nbi + i);
    cp_async_commit();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* p = (h == 0 ? gs : us) + i;
      sn[h] = uint32_t(__ldg(p)) | uint32_t(__ldg(p + nbi)) << 8 |
              uint32_t(__ldg(p + 2 * nbi)) << 16 | uint32_t(__ldg(p + 3 * nbi)) << 24;
    }
  };
  auto prep = [&] {
    const ExpertPtrs& ex = table[__ldcg(ids + slot)];
    gw = static_cast<const uint4*>(ex.w[0]) + row0 * nb;
    uw = static_cast<const uint4*>(ex.w[1]) + row0 * nb;
    gs = ex.s[0] + row0 * nb, us = ex.s[1] + row0 * nb;
    if (lane < nbi) issue(lane, 0), sc[0] = sn[0], sc[1] = sn[1];
    if (lane + 32 < nbi) issue(lane + 32, 1);
  };
  if (early) prep();  // ids and weights: two launches back
  grid_wait();        // xq comes from the kernel before
  grid_launch_dependents();
  if (!early) prep();
  float acc[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r) acc[r] = 0.0f;
  int p = 0;
#pragma unroll 1
  for (int i = lane; i < nbi; i += 32, ++p) {
    if (i + 32 < nbi)
      cp_async_wait<1>();  // pass p has landed; pass p + 1 may still be in flight
    else
      cp_async_wait<0>();
    uint4 q[R2];
#pragma unroll
    for (int r = 0; r < R2; ++r) q[r] = *at(p & 1, r);
    int is[R2];
    dot_rows<R2>(q, reinterpret_cast<const int2*>(xq + i), is);
    const float d = __ldg(xd + i);
#pragma unroll
    for (int r = 0; r < R2; ++r)
      acc[r] += float(is[r]) * (e8m0_half((sc[r / R] >> (8 * (r % R))) & 0xffu) * d);
    sc[0] = sn[0], sc[1] = sn[1];
    if (i + 64 < nbi) issue(i + 64, p & 1);
  }
  const float g = warp_rows_sum<R2>(acc);               // lane r: gate row r; lane R + r: up
  const float u = __shfl_down_sync(0xffffffffu, g, R);  // lane r: up row r
  if (lane < R) hs[warp * R + lane] = g / (1.0f + expf(-g)) * u;
  __syncthreads();
  if (warp == 0) {
    const int64_t b = int64_t(slot) * (inter / 32) + blockIdx.x;
    const float d = quantize_warp(hs[lane], hq + b);
    if (lane == 0) hd[b] = d * __ldcg(weights + slot);
  }
}

// out[row] = sum over the k experts in ascending id order of (down_e h[e])[row],
// h as q8 blocks whose scales carry the routing weights (hq, hd [k, nch]).
// Lane items it = lane + 32 u: expert it / nch, chunk it % nch (stepped, not divided).
__global__ void __launch_bounds__(kDownWarps * 32)
    moe_down_q8_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                       const Q8x* hq, const float* hd, int64_t hidden, int64_t inter, float* out,
                       int early) {
  constexpr int R = kDownRows, U = kDownItems;
  __shared__ RankedExperts rk;  // its weights are unused: h carries them
  const int lane = int(threadIdx.x & 31);
  const int64_t row0 = (int64_t(blockIdx.x) * kDownWarps + threadIdx.x / 32) * R;
  const int nch = int(inter / 32), items = k * nch;
  const int step_e = 32 / nch, step_i = 32 % nch;
  int e = lane / nch, i = lane % nch;  // this lane's next item
  uint4 q[U][R];
  uint32_t s[U][R];
  int ie[U], ii[U];
  auto load = [&](int base) {  // items base + lane + 32 u, u < U
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ie[u] = e, ii[u] = i;
      if (base + lane + 32 * u < items)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t row = row0 + r < hidden ? row0 + r : row0;
          q[u][r] = __ldg(reinterpret_cast<const uint4*>(rk.w[e]) + row * nch + i);
          s[u][r] = __ldg(rk.s[e] + row * nch + i);
        }
      i += step_i, e += step_e;
      if (i >= nch) i -= nch, ++e;
    }
  };
  if (early) rank_experts(table, ids, weights, k, rk);  // ids: three launches back
  if (early && row0 < hidden) load(0);
  grid_wait();  // h comes from the kernel before
  grid_launch_dependents();
  if (!early) rank_experts(table, ids, weights, k, rk);
  if (row0 >= hidden) return;
  if (!early) load(0);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int base = 0; base < items; base += 32 * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + lane + 32 * u >= items) break;
      const int64_t hb = int64_t(rk.slot[ie[u]]) * nch + ii[u];
      const float d = __ldg(hd + hb);
      int is[R];
      dot_rows<R>(q[u], reinterpret_cast<const int2*>(hq + hb), is);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += float(is[r]) * (e8m0_half(s[u][r]) * d);
    }
    if (base + 32 * U < items) load(base + 32 * U);
  }
  const float t = warp_rows_sum<R>(acc);
  if (lane < R && row0 + lane < hidden) out[row0 + lane] = t;
}

}  // namespace

size_t moe_q8_scratch_bytes(int64_t k, int64_t hidden, int64_t inter) {
  const int64_t blocks = hidden / 32 + k * (inter / 32);
  return size_t(blocks) * (sizeof(Q8x) + sizeof(float)) + 16;
}

bool moe_q8_applies(WeightEncoding enc, bool vec, int k, int64_t hidden, int64_t inter) {
  return vec && enc == WeightEncoding::MXFP4 && hidden % 32 == 0 && inter % 32 == 0 && k >= 1 &&
         k <= 32 && hidden >= 32 && inter >= 32 && hidden <= (int64_t(1) << 20) &&
         k * (inter / 32) <= (1 << 24);
}

bool moe_decode_q8(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                   const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                   void* scratch, float* out, bool early, cudaStream_t s) {
  if (!moe_q8_applies(enc, vec, k, hidden, inter)) return false;
  const int64_t nb = hidden / 32, nh = int64_t(k) * (inter / 32);
  auto* xq = static_cast<Q8x*>(scratch);  // [nb] q8 blocks of x, then [k, inter / 32] of h
  Q8x* hq = xq + nb;
  auto* xd = reinterpret_cast<float*>(hq + nh);  // [nb] scales of x, then of h
  float* hd = xd + nb;
  static const bool smem_ok =  // more than the default 48 KB of dynamic shared memory
      cudaFuncSetAttribute(moe_gate_up_q8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kGateSmem)) == cudaSuccess;
  if (!smem_ok) return false;
  const int e = early ? 1 : 0;
  launch(quantize_q8_kernel, unsigned((nb + kQuantThreads - 1) / kQuantThreads), kQuantThreads, 0,
         s, x, nb, xq, xd, e);
  launch(moe_gate_up_q8_kernel, dim3(unsigned(inter / 32), unsigned(k)), kGateWarps * 32, kGateSmem,
         s, table, ids, weights, xq, xd, hidden, inter, hq, hd, e);
  constexpr int64_t kRowsPerBlock = kDownWarps * kDownRows;
  launch(moe_down_q8_kernel, unsigned((hidden + kRowsPerBlock - 1) / kRowsPerBlock),
         kDownWarps * 32, 0, s, table, ids, weights, k, hq, hd, hidden, inter, out, e);
  return true;
}

}  // namespace moetier::cuda
