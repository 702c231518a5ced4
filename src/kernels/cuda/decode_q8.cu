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
//  - gate/up: a block of 8 warps (or 16 of 2 rows) owns 32 rows of h of one
//    selected expert, a warp 4 rows (8 weight rows: 4 of gate, 4 of up), a lane one 32-column
//    chunk of each, read in two passes; h = silu(gate x) * up x is quantized as one q8
//    block, its scale times the expert's routing weight;
//  - down: a block of 128 threads owns two groups of 4 output rows (the pair
//    kernel, where a row's items fit one pass; set_moe_q8_kernels: one group
//    of 4 or 2, or the older kernel, a warp per 2 rows) and runs one dot
//    product per row over the (expert, chunk) items of the k experts in
//    ascending id order, split over its threads and added in a fixed order;
//    with Q8Fuse::accumulate it adds them to out (the residual add: out is x).
// With MoeQ8Kernels::stream and Q8Fuse::stream, gate/up and down are one
// persistent launch where it applies (moe_stream.cu; off by default: slower).
// A q8 block is its 32 int8 codes (32 bytes); the dot with 8 e2m1 codes
// takes 4 byte permutes and 4 dp4a (q8.cuh's word_dot: twice the dot of the
// positive codes' magnitudes less the dot of all magnitudes).
//
// Early reads (the `early` flag, set by CudaBackend::route_moe_resident and
// route_moe_resident_add, which launch router -> quantize -> gate/up -> down
// back to back, or router -> gate/up -> down with x_ready below): a kernel may
// read before grid_wait what the kernel two or more launches back wrote (x,
// the router's ids and weights), through L2 (ld.global.cg). That kernel has
// completed by then: the one in between called grid_launch_dependents only
// after its own grid_wait, which returned once its predecessor completed and
// its writes were flushed. Without `early` everything is read after the wait.
// With Q8Fuse::x_ready the router has quantized x itself (RouterQ8) and the
// sequence is router -> gate/up -> down: gate/up, launched while the router
// runs, reads everything after its wait; down's early reads are two back.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/q8.cuh"

namespace moetier::cuda {
namespace {

constexpr int kQuantThreads = 128;
constexpr int kDownWarps = 4, kDownRows = 2, kDownItems = 6;  // the warp down kernel
constexpr int kSplitThreads = 128;                            // the split down kernel
// The 4-row split down kernel's grid (hidden / 4 blocks) above this many a
// multiprocessor takes the pair kernel by default (MoeQ8Kernels::down_auto):
// its blocks cannot all be resident beside gate/up's, and the pair kernel's
// one wave won by 3.4% on DeepSeek-shaped experts (hidden 4096: 7.8 a
// multiprocessor of the H200), while on Qwen3-30B-A3B shapes (hidden 2048:
// 3.9) the split kernel won by 1.2% (docs/cuda.md).
constexpr int64_t kPairBlocksPerSm = 4;

MoeQ8Kernels g_kernels;  // set_moe_q8_kernels

// 16 bytes global -> shared, asynchronously (L2 only); committed as one group
// per pass (cp_async_commit), waited for with cp_async_wait<N> (all of this
// thread's groups but the newest N).
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  cp_async16_w(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem);
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

// cp_async_wait<n> for n in [0, 3] given at run time (constant-folded where
// the caller's loop is unrolled): all of this thread's groups but the newest n.
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  if (n >= 3)
    cp_async_wait<3>();
  else if (n == 2)
    cp_async_wait<2>();
  else if (n == 1)
    cp_async_wait<1>();
  else
    cp_async_wait<0>();
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

// The slot of the router's ids [k] whose expert the gate/up block of grid row
// `slot` computes, where that block started on pred[slot] (Q8Fuse::predicted):
// that slot where the router chose pred[slot]; else the r-th slot whose
// expert was not predicted for the r-th predicted slot that was not chosen
// (both in slot order), so that the k blocks of a column cover the k slots
// once (ids and pred each hold k distinct ids; a pred with repeats the
// router chose, whose counts of matches differ, maps every slot to itself).
// id: its expert. Every lane of the warp returns the same.
__device__ __forceinline__ int matched_slot(const int32_t* ids, const int32_t* pred, int slot,
                                            int k, int32_t& id) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = int(threadIdx.x & 31);
  const int32_t a = lane < k ? __ldcg(ids + lane) : -1;
  const int32_t p = lane < k ? __ldcg(pred + lane) : -2;
  bool p_in = false, a_in = false;
  for (int j = 0; j < k; ++j) {  // every lane shuffles (no short circuit: the mask is all)
    const int32_t aj = __shfl_sync(kAll, a, j), pj = __shfl_sync(kAll, p, j);
    p_in = p_in || p == aj;
    a_in = a_in || a == pj;
  }
  const unsigned km = k >= 32 ? kAll : (1u << k) - 1u;
  const unsigned pin = __ballot_sync(kAll, p_in) & km, ain = __ballot_sync(kAll, a_in) & km;
  const int32_t ps = __shfl_sync(kAll, p, slot);
  const unsigned same = __ballot_sync(kAll, a == ps) & km;
  const int s = __popc(pin) != __popc(ain) ? slot
                : (pin >> slot & 1u)
                    ? __ffs(int(same)) - 1
                    : int(__fns(~ain & km, 0, __popc(~pin & km & ((1u << slot) - 1u)) + 1));
  id = __shfl_sync(kAll, a, s & 31);
  return s;
}

// Grid: (inter / 32, k). hq [k, inter / 32] q8 blocks, hd the same [k, inter / 32]
// scales times the slot's routing weight. NW warps of R rows each (NW x R =
// 32): 2R weight rows a warp (R of gate, R of up), a lane one 32-column chunk
// i = lane + 32 c of each. Each chunk is read in two passes (c, h) of R rows,
// gate's (h = 0) then up's (h = 1), each copied to its own shared memory slot
// 2 (c & 1) + h (cp.async, each lane its own 16-byte chunks), so that up to
// three passes are in flight while one is computed. Passes are issued in
// order (c, h) and the slot of (c, h) is refilled with (c + 2, h) after the
// lane's shared loads of (c, h) (the only reads of it) are issued, which the
// asm's memory clobber keeps in program order; the copy writes the slot only
// after its global read returns. x's codes of chunk i are read into registers
// once (2 x 16 bytes), the chunk's scales one chunk ahead.
// Dynamic shared memory: kGateSmem.
constexpr size_t kGateSmem = size_t(4) * 32 * 32 * sizeof(uint4);
template <int NW>
__global__ void __launch_bounds__(NW * 32, NW == 8 ? 3 : 2)
    moe_gate_up_q8_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights,
                          const Q8x* xq, const float* xd, int64_t hidden, int64_t inter, Q8x* hq,
                          float* hd, int early, const int32_t* pred, int npre) {
  const unsigned long long t_start = trace_clock();  // (the trace build's start of the block)
  constexpr int R = 32 / NW, R2 = 2 * R;
  extern __shared__ uint4 stage[];  // [4][NW][R][32]
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), slot = int(blockIdx.y);
  const int64_t nb = hidden / 32, row0 = int64_t(blockIdx.x) * 32 + warp * R;
  const int nbi = int(nb);
  const uint4 *gw = nullptr, *uw = nullptr;  // this warp's first gate / up row
  const uint8_t *gs = nullptr, *us = nullptr;
  uint32_t sc[2] = {}, sn[2] = {};  // e8m0 scales of chunks c, c + 1: gate rows, up rows (R a word)
  auto at = [&](int b, int r) { return stage + ((b * NW + warp) * R + r) * 32 + lane; };
  auto issue = [&](int i, int b, int h) {  // gate (h 0) or up (1) rows of chunk i -> slot b
    asm("" : "+r"(i));  // addresses from the bases each pass: no hoisted pointers
    const uint4* w = h == 0 ? gw : uw;
#pragma unroll
    for (int r = 0; r < R; ++r) cp_async16(at(b, r), w + r * nbi + i);
    cp_async_commit();
  };
  auto scales = [&](int i) {  // of chunk i -> sn
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* p = (h == 0 ? gs : us) + i;
      sn[h] = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) sn[h] |= uint32_t(ldg_w(p + r * nbi)) << (8 * r);
    }
  };
  // passes p0 .. p1 - 1 of (0, 0), (0, 1), (1, 0), (1, 1), in that order
  auto passes = [&](int p0, int p1) {
#pragma unroll
    for (int p = 0; p < 4; ++p)
      if (p >= p0 && p < p1 && lane + 32 * (p / 2) < nbi) issue(lane + 32 * (p / 2), p, p & 1);
  };
  auto prep = [&](int32_t id, int p1) {  // expert id's bases and scales, its passes 0 .. p1 - 1
    const ExpertPtrs& ex = table[id];
    gw = static_cast<const uint4*>(ex.w[0]) + row0 * nb;
    uw = static_cast<const uint4*>(ex.w[1]) + row0 * nb;
    gs = ex.s[0] + row0 * nb, us = ex.s[1] + row0 * nb;
    passes(0, p1);
    if (lane < nbi) scales(lane), sc[0] = sn[0], sc[1] = sn[1];
  };
  int32_t pe = -1;  // pred: the expert started before the wait (its first npre passes)
  if (early)
    prep(__ldcg(ids + slot), 4);  // ids and weights: two launches back
  else if (pred)
    pe = __ldcg(pred + slot), prep(pe, npre);  // the predicted ids: two or more launches back
  const unsigned ts = grid_wait<2>(t_start);   // xq comes from the kernel before; marks: dots, end
  grid_launch_dependents();
  int sl = slot;  // the router's slot this block computes
  if (!early && pred) {
    int32_t id;
    sl = matched_slot(ids, pred, slot, int(gridDim.y), id);
    if (id != pe)
      cp_async_wait<0>(), prep(id, 4);  // mispredicted: the started copies dropped
    else
      passes(npre, 4);  // (the groups stay in pass order)
  } else if (!early) {
    prep(__ldcg(ids + slot), 4);
  }
  float acc[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r) acc[r] = 0.0f;
  int c = 0;
#pragma unroll 1
  for (int i = lane; i < nbi; i += 32, ++c) {
    const bool more = i + 32 < nbi, refill = i + 64 < nbi;
    if (more) scales(i + 32);
    int4 xr[2];  // x's codes of chunk i
#pragma unroll
    for (int j = 0; j < 2; ++j) xr[j] = __ldg(reinterpret_cast<const int4*>(xq + i) + j);
    const float d = __ldg(xd + i);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // passes issued after (c, h): (c, 1) for h = 0, those of c + 1, (c + 2, 0) for h = 1
      cp_async_wait_upto(1 - h + (more ? 2 : 0) + (refill ? h : 0));
      const int b = 2 * (c & 1) + h;
#pragma unroll
      for (int r = 0; r < R; ++r)
        acc[h * R + r] +=
            float(dot_chunk(*at(b, r), xr)) * (e8m0_half((sc[h] >> (8 * r)) & 0xffu) * d);
      if (refill) issue(i + 64, b, h);
    }
    sc[0] = sn[0], sc[1] = sn[1];
  }
  trace_mark(ts, 1);
  const float g = warp_rows_scatter<R2>(acc);           // lane r: gate row r; lane R + r: up
  const float u = __shfl_down_sync(0xffffffffu, g, R);  // lane r: up row r
  if (lane < R) hs[warp * R + lane] = g / (1.0f + expf(-g)) * u;
  __syncthreads();
  if (warp == 0) {
    const int64_t b = int64_t(sl) * (inter / 32) + blockIdx.x;
    const float d = quantize_warp(hs[lane], hq + b);
    if (lane == 0) hd[b] = d * __ldcg(weights + sl);
  }
  trace_mark(ts, 2);
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
          q[u][r] = ldg_w(reinterpret_cast<const uint4*>(rk.w[e]) + row * nch + i);
          s[u][r] = ldg_w(rk.s[e] + row * nch + i);
        }
      i += step_i, e += step_e;
      if (i >= nch) i -= nch, ++e;
    }
  };
  if (early) rank_experts(table, ids, weights, k, rk);  // ids: two or three launches back
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

// The same sum split over the block: a block owns R output rows and its
// kSplitThreads threads split their (expert, chunk) items, thread t taking
// items t + kSplitThreads u (U per pass, all of a pass loaded before any is
// used); the warps' partial sums are added in warp order. More warps in
// flight than the warp kernel (a warp per 2 rows) where hidden is small.
template <int R, int U>
__global__ void __launch_bounds__(kSplitThreads)
    moe_down_q8_split_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights,
                             int k, const Q8x* hq, const float* hd, int64_t hidden, int64_t inter,
                             float* out, int accumulate, int early) {
  const unsigned long long t_start = trace_clock();  // (the trace build's start of the block)
  constexpr int NT = kSplitThreads, NW = NT / 32;
  __shared__ RankedExperts rk;  // its weights are unused: h carries them
  __shared__ float red[R][NW];
  const int t = int(threadIdx.x), lane = t & 31, warp = t / 32;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int nch = int(inter / 32), items = k * nch;
  const int step_e = NT / nch, step_i = NT % nch;
  int e = t / nch, i = t % nch;  // this thread's next item
  uint4 q[U][R];
  uint32_t s[U][R];
  int ie[U], ii[U];
  auto load = [&](int base) {  // items base + t + NT u, u < U
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ie[u] = e, ii[u] = i;
      if (base + t + NT * u < items)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t row = row0 + r < hidden ? row0 + r : row0;
          q[u][r] = ldg_w(reinterpret_cast<const uint4*>(rk.w[e]) + row * nch + i);
          s[u][r] = ldg_w(rk.s[e] + row * nch + i);
        }
      i += step_i, e += step_e;
      while (i >= nch) i -= nch, ++e;
    }
  };
  if (early) rank_experts(table, ids, weights, k, rk), load(0);  // ids: two or three back
  const unsigned ts = grid_wait<2>(t_start);  // h comes from the kernel before; marks: dots, end
  grid_launch_dependents();
  if (!early) rank_experts(table, ids, weights, k, rk), load(0);
  float old = 0.0f;  // accumulate: out's row t, read now (not after the dot)
  if (accumulate && t < R && row0 + t < hidden) old = out[row0 + t];
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int base = 0; base < items; base += NT * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + t + NT * u >= items) break;
      const int64_t hb = int64_t(rk.slot[ie[u]]) * nch + ii[u];
      const float d = __ldg(hd + hb);
      int is[R];
      dot_rows<R>(q[u], reinterpret_cast<const int2*>(hq + hb), is);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += float(is[r]) * (e8m0_half(s[u][r]) * d);
    }
    if (base + NT * U < items) load(base + NT * U);
  }
  trace_mark(ts, 1);
  const float w = warp_rows_sum<R>(acc);
  if (lane < R) red[lane][warp] = w;
  __syncthreads();
  if (t < R && row0 + t < hidden) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NW; ++j) sum += red[t][j];
    out[row0 + t] = accumulate ? old + sum : sum;
  }
  trace_mark(ts, 2);
}

// The split kernel's sum for two groups of R rows a block, all of whose
// weights are in flight before grid_wait: group b (its codes in registers,
// as the split kernel) and group b + gridDim.x (its codes copied to shared
// memory by cp.async, its scales in registers). One wave of half the blocks,
// so no block of a second wave waits for a first-wave block to finish before
// its loads start. One pass: k (inter / 32) <= kSplitThreads U.
template <int R, int U>
__global__ void __launch_bounds__(kSplitThreads)
    moe_down_q8_pair_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights,
                            int k, const Q8x* hq, const float* hd, int64_t hidden, int64_t inter,
                            float* out, int accumulate, int early) {
  const unsigned long long t_start = trace_clock();  // (the trace build's start of the block)
  constexpr int NT = kSplitThreads, NW = NT / 32;
  __shared__ RankedExperts rk;  // its weights are unused: h carries them
  __shared__ float red[2][R][NW];
  __shared__ uint4 qs[U][R][NT];  // the second group's codes
  const int t = int(threadIdx.x), lane = t & 31, warp = t / 32;
  const int nch = int(inter / 32), items = k * nch;
  const int64_t rows0[2] = {int64_t(blockIdx.x) * R, int64_t(blockIdx.x + gridDim.x) * R};
  uint4 q[U][R];
  uint32_t s[2][U][R];
  int ie[U], ii[U];
  auto load = [&] {  // item t + NT u of both groups
    int e = t / nch, i = t % nch;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ie[u] = e, ii[u] = i;
      if (t + NT * u < items)
#pragma unroll
        for (int g = 0; g < 2; ++g)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int64_t row = rows0[g] + r < hidden ? rows0[g] + r : 0;
            const auto* src = reinterpret_cast<const uint4*>(rk.w[e]) + row * nch + i;
            if (g == 0)
              q[u][r] = ldg_w(src);
            else
              cp_async16(&qs[u][r][t], src);
            s[g][u][r] = ldg_w(rk.s[e] + row * nch + i);
          }
      i += NT % nch, e += NT / nch;
      while (i >= nch) i -= nch, ++e;
    }
    cp_async_commit();
  };
  if (early) rank_experts(table, ids, weights, k, rk), load();  // ids: two or three back
  const unsigned ts = grid_wait<2>(t_start);  // h comes from the kernel before; marks: group 0, end
  grid_launch_dependents();
  if (!early) rank_experts(table, ids, weights, k, rk), load();
  float old[2] = {0.0f, 0.0f};  // accumulate: out's row t of each group, read now
#pragma unroll
  for (int g = 0; g < 2; ++g)
    if (accumulate && t < R && rows0[g] + t < hidden) old[g] = out[rows0[g] + t];
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    if (rows0[g] >= hidden) break;  // (uniform: the block's second group may be past the end)
    if (g == 1) cp_async_wait<0>();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t + NT * u >= items) break;
      const int64_t hb = int64_t(rk.slot[ie[u]]) * nch + ii[u];
      const float d = __ldg(hd + hb);
      uint4 w[R];
#pragma unroll
      for (int r = 0; r < R; ++r) w[r] = g == 0 ? q[u][r] : qs[u][r][t];
      int is[R];
      dot_rows<R>(w, reinterpret_cast<const int2*>(hq + hb), is);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += float(is[r]) * (e8m0_half(s[g][u][r]) * d);
    }
    const float wsum = warp_rows_sum<R>(acc);
    if (lane < R) red[g][lane][warp] = wsum;
    __syncthreads();
    if (t < R && rows0[g] + t < hidden) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < NW; ++j) sum += red[g][t][j];
      out[rows0[g] + t] = accumulate ? old[g] + sum : sum;
    }
    if (g == 0) trace_mark(ts, 1);  // the first group's rows written
  }
  cp_async_wait<0>();  // (a block with no second group: its copies land before it exits)
  trace_mark(ts, 2);
}

}  // namespace

// x and h as q8 blocks, then their scales.
size_t moe_q8_scratch_bytes(int64_t k, int64_t hidden, int64_t inter) {
  return size_t(hidden / 32 + k * (inter / 32)) * (sizeof(Q8x) + sizeof(float));
}

bool moe_q8_applies(WeightEncoding enc, bool vec, int k, int64_t hidden, int64_t inter) {
  return vec && enc == WeightEncoding::MXFP4 && hidden % 32 == 0 && inter % 32 == 0 && k >= 1 &&
         k <= 32 && hidden >= 32 && inter >= 32 && hidden <= (int64_t(1) << 20) &&
         k * (inter / 32) <= (1 << 24);
}

Q8XSlots moe_q8_x(void* scratch, int64_t k, int64_t hidden, int64_t inter) {
  auto* xq = static_cast<Q8x*>(scratch);  // [nb] q8 blocks of x, then [k, inter / 32] of h
  const int64_t nb = hidden / 32, nh = k * (inter / 32);
  return {xq, reinterpret_cast<float*>(xq + nb + nh)};  // [nb] scales of x, then of h
}

int moe_decode_q8(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                  const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                  void* scratch, float* out, bool early, cudaStream_t s, const Q8Fuse& fuse) {
  if (!moe_q8_applies(enc, vec, k, hidden, inter)) return 0;
  const int64_t nb = hidden / 32;
  const Q8XSlots xs = moe_q8_x(scratch, k, hidden, inter);
  auto* xq = static_cast<Q8x*>(xs.xq);
  Q8x* hq = xq + nb;
  float* xd = xs.xd;
  float* hd = xd + nb;
  const bool wide = g_kernels.gate_warps == 16;
  const auto gate = wide ? moe_gate_up_q8_kernel<16> : moe_gate_up_q8_kernel<8>;
  static const bool smem_ok[2] = {
      // more than the default 48 KB of dynamic shared memory
      cudaFuncSetAttribute(moe_gate_up_q8_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kGateSmem)) == cudaSuccess,
      cudaFuncSetAttribute(moe_gate_up_q8_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kGateSmem)) == cudaSuccess};
  if (!smem_ok[wide ? 1 : 0]) return 0;
  const int e = early ? 1 : 0;
  if (!fuse.x_ready)
    launch(quantize_q8_kernel, unsigned((nb + kQuantThreads - 1) / kQuantThreads), kQuantThreads, 0,
           s, x, nb, fuse.norm, fuse.eps, xq, xd, e);
  // x_ready: gate/up follows the router itself (its ids are read after the wait)
  if (g_kernels.stream && fuse.stream &&
      moe_stream_q8(table, ids, weights, k, xq, xd, hidden, inter, hq, hd, out, fuse.accumulate,
                    fuse.stream, s))
    return 2;
  const dim3 grid(unsigned(inter / 32), unsigned(k));
  const int acc = fuse.accumulate ? 1 : 0;
  launch(gate, grid, unsigned(g_kernels.gate_warps * 32), kGateSmem, s, table, ids, weights, xq, xd,
         hidden, inter, hq, hd, fuse.x_ready ? 0 : e, fuse.x_ready ? fuse.predicted : nullptr,
         g_kernels.predict_passes);
  if (g_kernels.down_rows == 0) {
    constexpr int64_t kRowsPerBlock = kDownWarps * kDownRows;
    launch(moe_down_q8_kernel, unsigned((hidden + kRowsPerBlock - 1) / kRowsPerBlock),
           kDownWarps * 32, 0, s, table, ids, weights, k, hq, hd, hidden, inter, out, acc, e);
    return 1;
  }
  // U items per thread and pass: all of a row's items in one pass up to 4.
  const int64_t passes = (k * (inter / 32) + kSplitThreads - 1) / kSplitThreads;
  const int R = g_kernels.down_rows, U = int(std::min<int64_t>(passes, 4));
  using Down = void (*)(const ExpertPtrs*, const int32_t*, const float*, int, const Q8x*,
                        const float*, int64_t, int64_t, float*, int, int);
  if (g_kernels.down_pair && R == 4 && passes <= 4 &&
      (!g_kernels.down_auto ||
       (hidden + 3) / 4 > kPairBlocksPerSm * int64_t(current_device_sms()))) {
    static constexpr Down kPair[4] = {moe_down_q8_pair_kernel<4, 1>, moe_down_q8_pair_kernel<4, 2>,
                                      moe_down_q8_pair_kernel<4, 3>, moe_down_q8_pair_kernel<4, 4>};
    const int64_t groups = (hidden + 3) / 4;
    launch(kPair[U - 1], unsigned((groups + 1) / 2), kSplitThreads, 0, s, table, ids, weights, k,
           hq, hd, hidden, inter, out, acc, e);
    return 1;
  }
  static constexpr Down kDown[2][4] = {
      {moe_down_q8_split_kernel<2, 1>, moe_down_q8_split_kernel<2, 2>,
       moe_down_q8_split_kernel<2, 3>, moe_down_q8_split_kernel<2, 4>},
      {moe_down_q8_split_kernel<4, 1>, moe_down_q8_split_kernel<4, 2>,
       moe_down_q8_split_kernel<4, 3>, moe_down_q8_split_kernel<4, 4>}};
  launch(kDown[R == 4 ? 1 : 0][U - 1], unsigned((hidden + R - 1) / R), kSplitThreads, 0, s, table,
         ids, weights, k, hq, hd, hidden, inter, out, acc, e);
  return 1;
}

void set_moe_q8_kernels(const MoeQ8Kernels& k) { g_kernels = k; }

}  // namespace moetier::cuda
