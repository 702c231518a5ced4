// Decode (one token) kernels: GEMVs for one matrix or several of one input
// (q/k/v) in one launch, either a block per R rows with the columns split
// over its threads (most matrices: many threads in flight) or a warp per R
// rows, each lane issuing all its 16-byte weight loads of an iteration before
// it uses any (tall matrices such as the LM head, above warp_rows rows); and the resident MoE step
// in two launches: gate/up of every selected expert (grid: row tiles x k) and the down projections
// of all k experts summed with their routing weights inside one kernel (the weighted sum fused into
// the down projection: a row's dot product runs over the k experts' chunks, in ascending expert id
// order), reading expert ids, weights and pointers from device memory so the step can be captured
// in a CUDA graph.
//
// A lane takes the 16-byte chunks lane, lane + 32, ... of a row (bf16: 8
// columns, f32: 4, MXFP4: one 32-column block and its scale), sums them in
// that order, and the warp reduces by butterflies: every result is
// deterministic and independent of the grid.
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/predict.cuh"
#include "kernels/cuda/q8.cuh"
#include "kernels/cuda/topk.cuh"

namespace moetier::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kRows = 2;   // weight rows per warp
int64_t g_warp_rows = 32768;
int g_block_rows = 0;   // 0: the rule of gemv_warps
int g_router_rows = 2;  // rows per block of router_topk_kernel: 1, 2 or 4 (set_router_rows)

int64_t blocks_of(const GemvMulti& g, int64_t per) {
  int64_t n = 0;
  for (int m = 0; m < g.count; ++m) n += (g.tile0[m + 1] - g.tile0[m] + per - 1) / per;
  return n;
}

// 1 / rms(x) from the per-warp sums of squares red_ss [blockDim / 32] that
// block_rows_dot<..., NORM> leaves (the same value in every thread that asks).
__device__ __forceinline__ float block_rstd(const float* red_ss, int64_t cols, float eps) {
  float ss = 0.0f;
  for (int wi = 0; wi < int(blockDim.x / 32); ++wi) ss += red_ss[wi];
  return 1.0f / sqrtf(ss / float(cols) + eps);
}

// R rows row0.. of one matrix [rows, cols] dotted with x by one block, its
// threads taking the rows' 16-byte chunks in turn (the first chunk's weights
// loaded before grid_wait); thread r < R returns row r's total. NORM: the
// rows are dotted with rmsnorm(x) = nw * x * rstd(x) instead, computed as
// rstd * (w . (nw * x)) with the sum of squares of x reduced alongside the
// rows (so each block normalizes x itself: no norm launch before it); nw's
// first chunk is read before grid_wait too. red: [R + NORM][kMaxThreads / 32].
// y (or null): thread r < R reads y[row0 + r] into *y_old right after the
// wait, so the caller's accumulate costs no load after the dot. stash (or
// null): [64] shared, gets x's (and with NORM nw's) columns 32 blockIdx.x ..
// + 31 as the dot reads them (the caller reads it after the dot's syncs).
template <int ENC, int R, bool NORM = false, int M = 0>
__device__ __forceinline__ float block_rows_dot(const uint8_t* w, const uint8_t* sc, int64_t rows,
                                                int64_t row0, int64_t cols, const float* x,
                                                const float* lut, float (*red)[kMaxThreads / 32],
                                                const float* nw = nullptr, float eps = 0.0f,
                                                unsigned* ts = nullptr, const float* y = nullptr,
                                                float* y_old = nullptr, float* stash = nullptr) {
  using C = Chunk<ENC>;
  constexpr int S = R + (NORM ? 1 : 0);  // the rows, then (NORM) x's sum of squares
  const int64_t nch = cols / C::kCols;
  float acc[S];
#pragma unroll
  for (int r = 0; r < S; ++r) acc[r] = 0.0f;
  typename C::W q[R];
  float g[NORM ? C::kCols : 1];
  auto load = [&](int64_t i) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < rows) q[r] = C::load(w, sc, row0 + r, cols, i);
    if constexpr (NORM) load_x<C::kCols>(nw, i, g);
  };
  const int64_t i0 = threadIdx.x;
  if (i0 < nch) load(i0);                // weights only: in flight while the previous kernel ends
  const unsigned slot = grid_wait<M>();  // M trace marks for the caller (ts)
  if (ts) *ts = slot;
  grid_launch_dependents();
  if (y && threadIdx.x < R && row0 + threadIdx.x < rows) *y_old = y[row0 + threadIdx.x];
  for (int64_t i = i0; i < nch; i += blockDim.x) {
    if (i != i0) load(i);
    float xv[C::kCols];
    load_x<C::kCols>(x, i, xv);
    if (stash) {  // x's and nw's columns of the block's q8 block (32 blockIdx.x ..)
      const int64_t c0 = i * C::kCols - 32 * int64_t(blockIdx.x);
      if (c0 >= 0 && c0 < 32) {
#pragma unroll
        for (int j = 0; j < C::kCols; ++j) {
          stash[c0 + j] = xv[j];
          if constexpr (NORM) stash[32 + c0 + j] = g[j];
        }
      }
    }
    if constexpr (NORM) {
#pragma unroll
      for (int j = 0; j < C::kCols; ++j) acc[R] += xv[j] * xv[j], xv[j] *= g[j];
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < rows) acc[r] += C::dot(q[r], xv, lut);
  }
  float t = block_sum<S>(acc, red);  // (syncs: every warp's partials are in red)
  if constexpr (NORM) {
    if (threadIdx.x < R) t *= block_rstd(red[R], cols, eps);
  }
  return t;
}

// Block b owns R rows of one matrix (matrix m's rows take ceil(rows_m / R)
// consecutive blocks); NORM: of rmsnorm(x, g.norms[m] or g.norm, g.eps).
// With g.pf, block 0 first predicts the layer's experts (predict.cuh), before
// its grid_wait.
template <int ENC, int R, bool NORM>
__global__ void __launch_bounds__(kMaxThreads)
    gemv_block_kernel(const GemvMulti g, int64_t cols, const float* x, int accumulate) {
  __shared__ float lut[16];
  __shared__ float red[R + (NORM ? 1 : 0)][kMaxThreads / 32];
  if (g.pf.logits) predict_ids(g.pf);
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  int64_t b = blockIdx.x;
  int m = 0;
  for (; m + 1 < g.count; ++m) {
    const int64_t bm = (g.tile0[m + 1] - g.tile0[m] + R - 1) / R;
    if (b < bm) break;
    b -= bm;
  }
  const int64_t rows = g.tile0[m + 1] - g.tile0[m], row0 = b * R;
  const float* nw = g.norms[m] ? g.norms[m] : g.norm;
  float old = 0.0f;  // accumulate: y's rows, read right after the wait
  const float t = block_rows_dot<ENC, R, NORM>(g.w[m], g.sc[m], rows, row0, cols, x, lut, red, nw,
                                               g.eps, nullptr, accumulate ? g.y[m] : nullptr, &old);
  if (threadIdx.x < R && row0 + threadIdx.x < rows)
    g.y[m][row0 + threadIdx.x] = accumulate ? old + t : t;
}

// The block's share of RouterQ8: L2 prefetches of the table's 128-byte lines
// (before the wait: a hint, never a read of what it names).
__device__ __forceinline__ void prefetch_l2(const RouterQ8& q8) {
  const int64_t lines = (q8.prefetch_bytes + 127) / 128;
  const auto* p = static_cast<const char*>(q8.prefetch);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < lines;
       i += int64_t(gridDim.x) * blockDim.x)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128 * i));
}

// x's q8 blocks b = blockIdx.x, + gridDim.x, ... (warp `warp`, lane j column
// 32 b + j), of nw * (x * r) with r the router's own 1 / rms(x) (block_rstd)
// where NORM. After block_rows_dot.
template <bool NORM, int R>
__device__ __forceinline__ void router_quantize(const float* x, const float* nw, float eps,
                                                int64_t cols, const float (*red)[kMaxThreads / 32],
                                                const RouterQ8& q8, int warp, const float* stash) {
  if (int(threadIdx.x / 32) != warp) return;
  const int lane = int(threadIdx.x & 31);
  const float r = NORM ? block_rstd(red[R], cols, eps) : 1.0f;
  auto* xq = static_cast<Q8x*>(q8.xq);
  for (int64_t b = blockIdx.x; b < cols / 32; b += gridDim.x) {
    const int64_t j = 32 * b + lane;
    const bool st = stash && b == blockIdx.x;  // the dot's copy: no load after the count
    float v = st ? stash[lane] : __ldg(x + j);
    if constexpr (NORM) v = (st ? stash[32 + lane] : __ldg(nw + j)) * (v * r);
    const float d = quantize_warp(v, xq + b);
    if (lane == 0) q8.xd[b] = d;
  }
}

// The router of one token: logits [e] = w x (a block per R rows), then the
// last block to finish (counted in *done, which it resets to 0) runs the
// softmax top-k on all e logits (probs may alias nothing but itself: logits go
// to probs). NORM: the logits of rmsnorm(x, nw, eps). q8 (RouterQ8): x's q8
// blocks for the MoE step, and the table's prefetch, quantized after the
// block's count (warp 1, beside the last block's top-k in warp 0; a block of
// one warp after its top-k), so the count, and with it the top-k, does not
// wait for the quantization (before the count: 0.7-0.9% slower decode on one
// H100, bench/results/h100-stop40-switches-ab.json).
template <int ENC, int V, bool NORM, int R>
__global__ void __launch_bounds__(kMaxThreads)
    router_topk_kernel(const uint8_t* w, const uint8_t* sc, int64_t e, int64_t cols, const float* x,
                       const float* nw, float eps, int64_t k, int renorm, float* probs,
                       int32_t* ids, float* weights, unsigned* done, float* xcopy, RouterQ8 q8) {
  __shared__ float lut[16];
  __shared__ float red[R + (NORM ? 1 : 0)][kMaxThreads / 32];
  __shared__ float stash_mem[64];  // RouterQ8::stash: x (and nw) of the block's q8 block
  float* stash = q8.xq && q8.stash ? stash_mem : nullptr;
  if (q8.prefetch) prefetch_l2(q8);
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t row0 = int64_t(blockIdx.x) * R;
  unsigned ts = 0;  // trace marks: dot, count, top-k, the block's end (a sync: trace build only)
  const float t = block_rows_dot<ENC, R, NORM, 4>(w, sc, e, row0, cols, x, lut, red, nw, eps, &ts,
                                                  nullptr, nullptr, stash);
  auto end_mark = [ts] {
#ifdef MOETIER_CUDA_TRACE_BUILD
    __syncthreads();
    trace_mark(ts, 4);
#endif
  };
  trace_mark(ts, 1);
  if (xcopy && blockIdx.x == 0)
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xcopy[i] = x[i];
  if (threadIdx.x < R && row0 + threadIdx.x < e) probs[row0 + threadIdx.x] = t;
  const bool last = last_block_arrive(done, gridDim.x);  // the logits visible to the last block
  trace_mark(ts, 2);
  const int qw = blockDim.x > 32 ? 1 : 0;  // the quantizing warp
  if (q8.xq && (!last || qw == 1)) router_quantize<NORM, R>(x, nw, eps, cols, red, q8, qw, stash);
  if (!last) return end_mark();
  if (threadIdx.x < 32) {
    int32_t pid = -1;  // in flight during the top-k
    if (q8.predicted && threadIdx.x < k) pid = __ldcg(q8.predicted + threadIdx.x);
    const int32_t mine = softmax_topk_warp<V>(probs, e, k, renorm, probs, ids, weights);
    if (q8.predicted) count_predicted(pid, mine, int(k), q8.counts);
  }
  if (threadIdx.x == 0) *done = 0;
  trace_mark(ts, 3);  // (the top-k's end; a block of one warp quantizes after it)
  if (q8.xq && qw == 0) router_quantize<NORM, R>(x, nw, eps, cols, red, q8, 0, stash);
  end_mark();
}

// Matrix m's rows belong to warps [sum of earlier warps, + ceil(rows_m / R)).
template <int ENC, int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_warps_kernel(GemvMulti g, int64_t cols, const float* x, int accumulate) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m = 0;
  for (; m < g.count; ++m) {
    const int64_t wm = (g.tile0[m + 1] - g.tile0[m] + R - 1) / R;
    if (warp < wm) break;
    warp -= wm;
  }
  const int lane = threadIdx.x & 31;
  const bool live = m < g.count;
  const int mm = live ? m : 0;
  const int64_t rows = live ? g.tile0[mm + 1] - g.tile0[mm] : 0, row0 = warp * R;
  const int64_t nch = cols / C::kCols;
  const uint8_t* w = g.w[mm];
  const uint8_t* sc = g.sc[mm];
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  typename C::W q[U][R];
  auto load = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + lane + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (i < nch && row0 + r < rows) q[u][r] = C::load(w, sc, row0 + r, cols, i);
    }
  };
  load(0);  // weights only: in flight while the previous kernel ends
  grid_wait();
  grid_launch_dependents();
  if (!live) return;
  for (int64_t base = 0; base < nch; base += 32 * U) {
    if (base > 0) load(base);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + lane + 32 * u;
      if (i >= nch) break;
      float xv[C::kCols];
      load_x<C::kCols>(x, i, xv);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < rows) acc[r] += C::dot(q[u][r], xv, lut);
    }
  }
  const float t = warp_rows_sum<R>(acc);
  if (lane < R && row0 + lane < rows) {
    float* o = g.y[m] + row0 + lane;
    *o = accumulate ? *o + t : t;
  }
}

// h[slot] = silu(gate x) * up x for expert ids[slot] (grid: row tiles x k;
// a warp owns R rows of gate and of up).
template <int ENC, int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    moe_gate_up_kernel(const ExpertPtrs* table, const int32_t* ids, const float* x, int64_t hidden,
                       int64_t inter, float* h) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  grid_wait();  // ids come from the router
  grid_launch_dependents();
  const int slot = int(blockIdx.y), lane = threadIdx.x & 31;
  const ExpertPtrs& ex = table[ids[slot]];
  const auto* gw = static_cast<const uint8_t*>(ex.w[0]);
  const auto* uw = static_cast<const uint8_t*>(ex.w[1]);
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= inter) return;
  const int64_t nch = hidden / C::kCols;
  float acc[2 * R];  // gate rows, then up rows
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = 0.0f;
  for (int64_t base = 0; base < nch; base += 32 * U) {
    typename C::W q[U][2 * R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + lane + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (i < nch && row0 + r < inter) {
          q[u][r] = C::load(gw, ex.s[0], row0 + r, hidden, i);
          q[u][R + r] = C::load(uw, ex.s[1], row0 + r, hidden, i);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + lane + 32 * u;
      if (i >= nch) break;
      float xv[C::kCols];
      load_x<C::kCols>(x, i, xv);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < inter) {
          acc[r] += C::dot(q[u][r], xv, lut);
          acc[R + r] += C::dot(q[u][R + r], xv, lut);
        }
    }
  }
  const float g = warp_rows_sum<2 * R>(acc);            // lane r: gate row r; lane R + r: up row r
  const float u = __shfl_down_sync(0xffffffffu, g, R);  // lane r: up row r
  if (lane < R && row0 + lane < inter)
    h[int64_t(slot) * inter + row0 + lane] = g / (1.0f + expf(-g)) * u;
}

// out[row] = sum over the k experts in ascending id order of
// weights[j] * (down_{ids[j]} h[j])[row]. A warp owns R rows; a row's dot
// product runs over the items (expert rank e, chunk i), e major.
template <int ENC, int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    moe_down_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                    const float* h, int64_t hidden, int64_t inter, float* out) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  __shared__ RankedExperts rk;
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  grid_wait();  // ids, weights and h come from earlier kernels
  grid_launch_dependents();
  rank_experts(table, ids, weights, k, rk);  // (syncs the block: lut too)
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= hidden) return;
  const int64_t nch = inter / C::kCols, items = int64_t(k) * nch;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t base = 0; base < items; base += 32 * U) {
    typename C::W q[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t it = base + lane + 32 * u;
      if (it < items) {
        const int e = int(it / nch);
        const int64_t i = it - e * nch;
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (row0 + r < hidden) q[u][r] = C::load(rk.w[e], rk.s[e], row0 + r, inter, i);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t it = base + lane + 32 * u;
      if (it >= items) break;
      const int e = int(it / nch);
      const int64_t i = it - e * nch;
      float hv[C::kCols];
      load_x<C::kCols>(h + int64_t(rk.slot[e]) * inter, i, hv);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < hidden) acc[r] += rk.weight[e] * C::dot(q[u][r], hv, lut);
    }
  }
  const float t = warp_rows_sum<R>(acc);
  if (lane < R && row0 + lane < hidden) out[row0 + lane] = t;
}

int enc_cols(WeightEncoding e) {
  return e == WeightEncoding::F32 ? 4 : e == WeightEncoding::BF16 ? 8 : 32;
}

// Chunks per lane per iteration: enough for `chunks` in one pass, at most 8.
int unroll_for(int64_t chunks) {
  const int64_t per_lane = (chunks + 31) / 32;
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
}

template <int ENC, int U>
void gemv_warps_u(const GemvMulti& g, int64_t cols, const float* x, bool acc, cudaStream_t s) {
  const int64_t warps = blocks_of(g, kRows);
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  launch(gemv_warps_kernel<ENC, kRows, U>, blocks, kWarps * 32, 0, s, g, cols, x, acc ? 1 : 0);
}

// Threads for `chunks` 16-byte chunks per row: a multiple of 32, at most 256.
unsigned threads_for(int64_t chunks) {
  const int64_t t = (chunks + 31) / 32 * 32;
  return unsigned(t < 32 ? 32 : t > kMaxThreads ? kMaxThreads : t);
}

template <int ENC, int R>
void gemv_block(const GemvMulti& g, int64_t cols, const float* x, bool acc, cudaStream_t s) {
  const unsigned t = threads_for(cols / Chunk<ENC>::kCols), b = unsigned(blocks_of(g, R));
  const size_t smem = g.pf.logits ? kPredictSmem : 0;  // predict_ids' keys
  if (g.norm)
    launch(gemv_block_kernel<ENC, R, true>, b, t, smem, s, g, cols, x, acc ? 1 : 0);
  else
    launch(gemv_block_kernel<ENC, R, false>, b, t, smem, s, g, cols, x, acc ? 1 : 0);
}

// false: nothing launched (a norm asked of the warp-per-rows path).
template <int ENC>
bool gemv_warps(const GemvMulti& g, int64_t cols, const float* x, bool acc, cudaStream_t s) {
  if (g.tile0[g.count] < g_warp_rows) {
    // Rows per block: 4 from 4096 rows in all (q/k/v of Qwen3-30B-A3B: 1280
    // blocks, against 2560 at 2: 4% faster decode, docs/cuda.md), 2 from 2048
    // (o_proj: 1024 blocks; 1 or 4 are not faster), else 1; with the norm
    // taken in (every block re-reads x and the norm weights, 8 bytes a column,
    // against 2 a column of each bf16 row) 4 from 1024 rows (q/k/v of the
    // DeepSeek-shaped model: 1280 rows of 4096 columns, 5.6% faster decode
    // than at 1).
    const int64_t rows = g.tile0[g.count];
    const int r = g.rows_per_block         ? g.rows_per_block
                  : g_block_rows           ? g_block_rows
                  : rows >= 4096           ? 4
                  : g.norm && rows >= 1024 ? 4
                  : rows >= 2048           ? 2
                                           : 1;
    if (r == 8)
      gemv_block<ENC, 8>(g, cols, x, acc, s);
    else if (r == 4)
      gemv_block<ENC, 4>(g, cols, x, acc, s);
    else if (r == 2)
      gemv_block<ENC, 2>(g, cols, x, acc, s);
    else
      gemv_block<ENC, 1>(g, cols, x, acc, s);
    return true;
  }
  if (g.norm || g.pf.logits) return false;
  switch (unroll_for(cols / Chunk<ENC>::kCols)) {
    case 1:
      return gemv_warps_u<ENC, 1>(g, cols, x, acc, s), true;
    case 2:
      return gemv_warps_u<ENC, 2>(g, cols, x, acc, s), true;
    case 4:
      return gemv_warps_u<ENC, 4>(g, cols, x, acc, s), true;
    default:
      return gemv_warps_u<ENC, 8>(g, cols, x, acc, s), true;
  }
}

bool gemv_any(const GemvMulti& g, WeightEncoding enc, int64_t cols, const float* x, bool acc,
              cudaStream_t s) {
  if (g.count < 1 || g.count > GemvMulti::kMax || enc == WeightEncoding::CB3 ||
      cols % enc_cols(enc))
    return false;
  switch (enc) {
    case WeightEncoding::F32:
      return gemv_warps<kF32>(g, cols, x, acc, s);
    case WeightEncoding::BF16:
      return gemv_warps<kBF16>(g, cols, x, acc, s);
    default:
      return gemv_warps<kMXFP4>(g, cols, x, acc, s);
  }
}

template <int ENC, int U>
void moe_gate_up(const ExpertPtrs* table, const int32_t* ids, int k, const float* x, int64_t hidden,
                 int64_t inter, float* h, cudaStream_t s) {
  const dim3 g(unsigned((inter + kWarps * kRows - 1) / (kWarps * kRows)), unsigned(k));
  launch(moe_gate_up_kernel<ENC, kRows, U>, g, kWarps * 32, 0, s, table, ids, x, hidden, inter, h);
}

template <int ENC, int U>
void moe_down(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
              const float* h, int64_t hidden, int64_t inter, float* out, cudaStream_t s) {
  const unsigned g = unsigned((hidden + kWarps * kRows - 1) / (kWarps * kRows));
  launch(moe_down_kernel<ENC, kRows, U>, g, kWarps * 32, 0, s, table, ids, weights, k, h, hidden,
         inter, out);
}

template <int ENC>
void moe_enc(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
             const float* x, int64_t hidden, int64_t inter, float* h, float* out, cudaStream_t s) {
  constexpr int kc = Chunk<ENC>::kCols;
  switch (unroll_for(hidden / kc)) {  // U = 8 holds 8 x 2R chunks: cap gate/up at 4
    case 1:
      moe_gate_up<ENC, 1>(table, ids, k, x, hidden, inter, h, s);
      break;
    case 2:
      moe_gate_up<ENC, 2>(table, ids, k, x, hidden, inter, h, s);
      break;
    default:
      moe_gate_up<ENC, 4>(table, ids, k, x, hidden, inter, h, s);
  }
  switch (unroll_for(int64_t(k) * (inter / kc))) {
    case 1:
      return moe_down<ENC, 1>(table, ids, weights, k, h, hidden, inter, out, s);
    case 2:
      return moe_down<ENC, 2>(table, ids, weights, k, h, hidden, inter, out, s);
    case 4:
      return moe_down<ENC, 4>(table, ids, weights, k, h, hidden, inter, out, s);
    default:
      return moe_down<ENC, 8>(table, ids, weights, k, h, hidden, inter, out, s);
  }
}

template <int ENC, bool NORM>
void router_launch(const MatView& w, const float* x, const float* nw, float eps, int64_t k,
                   bool renorm, float* probs, int32_t* ids, float* weights, unsigned* done,
                   float* xc, const RouterQ8& q8, cudaStream_t s) {
  using K = void (*)(const uint8_t*, const uint8_t*, int64_t, int64_t, const float*, const float*,
                     float, int64_t, int, float*, int32_t*, float*, unsigned*, float*, RouterQ8);
  static constexpr K kK[3][3] = {
      // [V: 4, 8, 32][R: 1, 2, 4]
      {router_topk_kernel<ENC, 4, NORM, 1>, router_topk_kernel<ENC, 4, NORM, 2>,
       router_topk_kernel<ENC, 4, NORM, 4>},
      {router_topk_kernel<ENC, 8, NORM, 1>, router_topk_kernel<ENC, 8, NORM, 2>,
       router_topk_kernel<ENC, 8, NORM, 4>},
      {router_topk_kernel<ENC, 32, NORM, 1>, router_topk_kernel<ENC, 32, NORM, 2>,
       router_topk_kernel<ENC, 32, NORM, 4>}};
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int R = g_router_rows;
  const unsigned g = unsigned((w.rows + R - 1) / R), t = threads_for(w.cols / Chunk<ENC>::kCols);
  const K kern = kK[w.rows <= 128 ? 0 : w.rows <= 256 ? 1 : 2][R == 4 ? 2 : R == 2 ? 1 : 0];
  launch(kern, g, t, 0, s, wp, w.scales, w.rows, w.cols, x, nw, eps, k, renorm ? 1 : 0, probs, ids,
         weights, done, xc, q8);
}

template <int ENC>
void router_enc(const MatView& w, const float* x, const float* nw, float eps, int64_t k,
                bool renorm, float* probs, int32_t* ids, float* weights, unsigned* done, float* xc,
                const RouterQ8& q8, cudaStream_t s) {
  if (nw)
    router_launch<ENC, true>(w, x, nw, eps, k, renorm, probs, ids, weights, done, xc, q8, s);
  else
    router_launch<ENC, false>(w, x, nw, eps, k, renorm, probs, ids, weights, done, xc, q8, s);
}

}  // namespace

bool router_topk(const MatView& w, const float* x, int64_t k, bool renorm, float* probs,
                 int32_t* ids, float* weights, unsigned* done, cudaStream_t s, const float* norm,
                 float eps, float* x_copy, const RouterQ8& q8) {
  if (w.enc == WeightEncoding::CB3 || !vectorizable(w) || w.rows < 1 || w.rows > 1024 || k < 1 ||
      k > 32 || k > w.rows || w.cols % enc_cols(w.enc) || (q8.xq && w.cols % 32))
    return false;
  switch (w.enc) {
    case WeightEncoding::F32:
      return router_enc<kF32>(w, x, norm, eps, k, renorm, probs, ids, weights, done, x_copy, q8, s),
             true;
    case WeightEncoding::BF16:
      return router_enc<kBF16>(w, x, norm, eps, k, renorm, probs, ids, weights, done, x_copy, q8,
                               s),
             true;
    default:
      return router_enc<kMXFP4>(w, x, norm, eps, k, renorm, probs, ids, weights, done, x_copy, q8,
                                s),
             true;
  }
}

void set_gemv_warp_rows(int64_t rows) { g_warp_rows = rows; }
void set_gemv_block_rows(int rows) { g_block_rows = rows; }
void set_router_rows(int rows) { g_router_rows = rows == 1 || rows == 4 ? rows : 2; }

bool gemv1(const MatView& w, const float* x, float* y, bool accumulate, cudaStream_t s,
           const ExpertPredict& pf) {
  if (w.enc == WeightEncoding::CB3 || !vectorizable(w) || w.rows <= 0) return false;
  if (pf.logits && (pf.e < 1 || pf.e > ExpertPredict::kMaxExperts || pf.k < 1 ||
                    pf.k > ExpertPredict::kMaxK || pf.k > pf.e))
    return false;
  GemvMulti g;
  g.pf = pf;
  g.w[0] = static_cast<const uint8_t*>(w.data);
  g.sc[0] = w.scales;
  g.y[0] = y;
  g.tile0[1] = w.rows;
  g.count = 1;
  return gemv_any(g, w.enc, w.cols, x, accumulate, s);
}

bool gemv_multi(const GemvMulti& g, WeightEncoding enc, int64_t cols, const float* x,
                cudaStream_t s) {
  return gemv_any(g, enc, cols, x, false, s);
}

bool moe_decode(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                float* h, float* out, cudaStream_t s) {
  const int64_t m = enc_cols(enc);
  if (!vec || enc == WeightEncoding::CB3 || hidden % m || inter % m || k < 1 || k > 32)
    return false;
  switch (enc) {
    case WeightEncoding::F32:
      return moe_enc<kF32>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    case WeightEncoding::BF16:
      return moe_enc<kBF16>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    case WeightEncoding::MXFP4:
      return moe_enc<kMXFP4>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    default:
      return false;
  }
}

}  // namespace moetier::cuda
