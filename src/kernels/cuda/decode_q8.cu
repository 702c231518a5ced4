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
//  - quantize: x [hidden] -> xq, one lane per block of 32 (no shuffles); with
//    Q8Fuse::norm it first normalizes x (RMSNorm, every block summing the
//    squares of all of x), so no norm launch precedes the step;
//  - gate/up: a block of 8 warps owns 32 rows of h of one selected expert, a
//    warp 4 rows (8 weight rows: 4 of gate, 4 of up), a lane one 32-column
//    chunk of each per pass; h = silu(gate x) * up x is quantized as one q8
//    block, its scale times the expert's routing weight;
//  - down: a warp owns 2 output rows and runs one dot product over the
//    (expert, chunk) items of the k experts in ascending id order; with
//    Q8Fuse::accumulate it adds them to out (the residual add: out is x).
// A q8 block is 64 bytes: its 32 int8 codes, then their 32 negations, so that
// one byte permute gives the activations with the weights' signs applied
// (e2m1 sign-magnitude: the magnitudes come from a second permute), 11
// instructions per 8 weights.
//
// Early reads (the `early` flag, set by CudaBackend::route_moe_resident and
// route_moe_resident_add, which launch router -> quantize -> gate/up -> down
// back to back): a kernel may
// read before grid_wait what the kernel two or more launches back wrote (x,
// the router's ids and weights), through L2 (ld.global.cg). That kernel has
// completed by then: the one in between called grid_launch_dependents only
// after its own grid_wait, which returned once its predecessor completed and
// its writes were flushed. Without `early` everything is read after the wait.
#include <algorithm>
#include <cfloat>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_stream.cuh"
#include "kernels/cuda/q8.cuh"

namespace moetier::cuda {
namespace {

constexpr int kQuantThreads = 128;
constexpr int kGateWarps = 8, kGateRows = 4;  // 32 rows of h per block
constexpr int kDownWarps = 4, kDownRows = 2, kDownItems = 6;

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

// Grid: ceil(nb / kQuantThreads). xq [nb], xd [nb]. nw: x is first replaced by
// rmsnorm(x, nw, eps) = nw * (x * r), r computed as the norm kernels compute
// it (a double sum of squares; every block sums all of x).
__global__ void __launch_bounds__(kQuantThreads)
    quantize_q8_kernel(const float* x, int64_t nb, const float* nw, float eps, Q8x* xq, float* xd,
                       int early) {
  __shared__ double part[33];
  const int64_t b = int64_t(blockIdx.x) * kQuantThreads + threadIdx.x;
  auto work = [&] {
    float v[32];
    if (b < nb) {
      const float4* p = reinterpret_cast<const float4*>(x) + 8 * b;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 a = __ldcg(p + j);
        v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
      }
    }
    if (nw) {  // every thread of the block reaches the reduction
      double ss = 0.0;
      for (int64_t i = threadIdx.x; i < 8 * nb; i += kQuantThreads) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(x) + i);
        ss += double(a.x) * a.x + double(a.y) * a.y + double(a.z) * a.z + double(a.w) * a.w;
      }
      const float r = 1.0f / sqrtf(float(block_sumsq(ss, part) / double(32 * nb)) + eps);
      if (b < nb)
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = __ldg(nw + 32 * b + j) * (v[j] * r);
    }
    if (b < nb) xd[b] = quantize32(v, xq + b);
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
                       int accumulate, int early) {
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
  if (lane < R && row0 + lane < hidden) out[row0 + lane] = accumulate ? out[row0 + lane] + t : t;
}

}  // namespace

// moe_decode_q8: x and h as q8 blocks and their scales; moe_decode_fused: x as
// q8 (128-byte aligned), then h [k, inter] as f32 (twice the bytes of h's q8 blocks).
size_t moe_q8_scratch_bytes(int64_t k, int64_t hidden, int64_t inter) {
  return align128(size_t(hidden / 32) * (sizeof(Q8x) + sizeof(float))) + size_t(k * inter) * 4 + 16;
}

bool moe_q8_applies(WeightEncoding enc, bool vec, int k, int64_t hidden, int64_t inter) {
  return vec && enc == WeightEncoding::MXFP4 && hidden % 32 == 0 && inter % 32 == 0 && k >= 1 &&
         k <= 32 && hidden >= 32 && inter >= 32 && hidden <= (int64_t(1) << 20) &&
         k * (inter / 32) <= (1 << 24);
}

bool moe_decode_q8(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                   const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                   void* scratch, float* out, bool early, cudaStream_t s, const Q8Fuse& fuse) {
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
         s, x, nb, fuse.norm, fuse.eps, xq, xd, e);
  launch(moe_gate_up_q8_kernel, dim3(unsigned(inter / 32), unsigned(k)), kGateWarps * 32, kGateSmem,
         s, table, ids, weights, xq, xd, hidden, inter, hq, hd, e);
  constexpr int64_t kRowsPerBlock = kDownWarps * kDownRows;
  launch(moe_down_q8_kernel, unsigned((hidden + kRowsPerBlock - 1) / kRowsPerBlock),
         kDownWarps * 32, 0, s, table, ids, weights, k, hq, hd, hidden, inter, out,
         fuse.accumulate ? 1 : 0, e);
  return true;
}

namespace {

// What the fused kernel needs of the current device, read once per device:
// its SM count (one block per SM, so that every block is resident at the grid
// barrier) and the shared memory a block may opt into, less what the kernel
// declares statically (0 where bulk copies cannot run: a device below sm_90,
// or a build with an architecture below it, where they compile to nothing).
struct DeviceLimits {
  int sms = 0;
  size_t smem = 0;
};
constexpr int kMaxDevices = 64;

std::mutex g_limits_mu;  // guards the two tables below

DeviceLimits device_limits() {
  static DeviceLimits known[kMaxDevices];
  static bool read[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return {};
  const std::lock_guard<std::mutex> lock(g_limits_mu);
  if (!read[dev]) {
    int sms = 0, major = 0, optin = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess)
      known[dev] = {sms, MOETIER_CUDA_MIN_ARCH >= 90 && major >= 9 && optin > 4096
                             ? size_t(optin) - 4096
                             : 0};
    read[dev] = true;
  }
  return known[dev];
}

// Raises a kernel's dynamic shared-memory limit to `bytes` once (not per
// launch: launches are captured into graphs).
bool smem_allowed(const void* kernel, size_t bytes) {
  static std::vector<std::pair<const void*, size_t>> set;  // kernel -> limit set
  const std::lock_guard<std::mutex> lock(g_limits_mu);
  for (auto& [k, b] : set)
    if (k == kernel && bytes <= b) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) !=
      cudaSuccess)
    return false;
  set.emplace_back(kernel, bytes);
  return true;
}

using FusedKernel = void (*)(const ExpertPtrs*, const int32_t*, const float*, int, const void*, int,
                             int, float*, float*, unsigned*, int, int);
template <int NC>
FusedKernel fused_kernel_u(int64_t nch) {
  if (nch <= 32) return moe_fused_stream_kernel<NC, 1>;
  if (nch <= 64) return moe_fused_stream_kernel<NC, 2>;
  return moe_fused_stream_kernel<NC, 4>;
}
FusedKernel fused_kernel(int64_t nb, int64_t nch) {
  if (nb <= 64) return fused_kernel_u<2>(nch);
  if (nb <= 128) return fused_kernel_u<4>(nch);
  return fused_kernel_u<8>(nch);
}

}  // namespace

bool moe_stream_applies(WeightEncoding enc, bool bulk, int k, int64_t hidden, int64_t inter) {
  return bulk && moe_q8_applies(enc, true, k, hidden, inter) && hidden % 512 == 0 &&
         inter % 256 == 0 && hidden <= 8192 && inter <= 4096 &&
         k * (inter / 32) * 8 <= kMaxHF * kStreamThreads;
}

bool moe_decode_fused(const ExpertPtrs* table, WeightEncoding enc, bool bulk, const int32_t* ids,
                      const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                      void* scratch, float* out, unsigned* bar, bool early, cudaStream_t s,
                      const StreamConfig& cfg) {
  if (!moe_stream_applies(enc, bulk, k, hidden, inter)) return false;
  const DeviceLimits lim = device_limits();
  const int grid = cfg.grid > 0 ? std::min(cfg.grid, lim.sms) : lim.sms;
  const int64_t nb = hidden / 32, nch = inter / 32, nq = k * nch;
  const size_t budget = std::min(cfg.budget, lim.smem);
  int P = 1;
  while (P < 32 && fused_smem_bytes(nb, nch, nq, P + 1) <= budget) ++P;
  const size_t smem = fused_smem_bytes(nb, nch, nq, P);
  const FusedKernel fk = fused_kernel(nb, nch);
  if (grid <= 0 || smem > budget || !smem_allowed(reinterpret_cast<const void*>(fk), smem))
    return false;
  // scratch: x as q8t [nb], then h [k, inter] f32
  float* h = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + align128(q8t_bytes(nb)));
  const int e = early ? 1 : 0;
  launch(quantize_q8t_kernel, unsigned((nb + 127) / 128), 128, 0, s, x, int(nb), scratch, e);
  launch(fk, unsigned(grid), kStreamThreads, smem, s, table, ids, weights, k,
         static_cast<const void*>(scratch), int(hidden), int(inter), h, out, bar, P, e);
  return true;
}

}  // namespace moetier::cuda
