// Elementwise kernels, RMSNorm, RoPE, embedding rows and the softmax top-k
// router (kernels/cuda/cuda.h). Each mirrors the CPU kernel's arithmetic
// (double sum of squares in RMSNorm, f32 products, cos/sin in double).
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rowdot.cuh"
#include "kernels/cuda/topk.cuh"

namespace moetier::cuda {
namespace {

unsigned grid_for(int64_t n, int block) {
  const int64_t g = (n + block - 1) / block;
  return unsigned(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void rmsnorm_kernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  grid_wait();
  grid_launch_dependents();
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
  __shared__ double part[33];
  const float var = float(block_sumsq(ss, part) / double(dim));
  const float r = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

__global__ void rope_kernel(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0,
                            const int64_t* d_pos, const float* inv_freq) {
  if (d_pos) pos0 = *d_pos;
  const int64_t half = hd / 2;
  GRID_STRIDE(i, n * heads * half) {
    const int64_t d = i % half, th = i / half, t = th / heads;
    const float angle = inv_freq[d] * float(pos0 + t);
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    float* v = x + th * hd;
    const float a = v[d], b = v[d + half];
    v[d] = a * c - b * s;
    v[d + half] = b * c + a * s;
  }
}

__global__ void kv_write_kernel(float* cache, const float* src, int64_t pos, const int64_t* d_pos,
                                int64_t row, int64_t n) {
  if (d_pos) pos = *d_pos;
  GRID_STRIDE(i, n * row) cache[pos * row + i] = src[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) { GRID_STRIDE(i, n) x[i] += y[i]; }
__global__ void add_rows_kernel(float* y, const float* b, int64_t n, int64_t dim) {
  GRID_STRIDE(i, n * dim) y[i] += b[i % dim];
}
__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  GRID_STRIDE(i, n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
__global__ void fill_kernel(float* x, int64_t n) { GRID_STRIDE(i, n) x[i] = 0.0f; }

// A PDL launch (launch.cuh): nothing is read or written before grid_wait (the
// ids may be an earlier kernel's output: a decode graph's step slot, which the
// previous replay's argmax advanced), and the trigger right after it lets the
// kernel after (the first layer's q/k/v) stream its weights while this runs.
template <int ENC>
__global__ void embed_kernel(const uint8_t* w, const uint8_t* sc, int64_t cols, const int32_t* ids,
                             int64_t n, float* out) {
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  grid_wait();
  grid_launch_dependents();
  GRID_STRIDE(i, n * cols) out[i] = weight_at<ENC>(w, sc, ids[i / cols], i % cols, cols, lut);
}

// One warp per token (kernels/cuda/topk.cuh).
template <int V>
__global__ void __launch_bounds__(32)
    softmax_topk_kernel(const float* logits, int64_t e, int64_t k, int renorm, float* probs,
                        int32_t* ids, float* weights) {
  grid_wait();
  grid_launch_dependents();
  const int64_t t = blockIdx.x;
  softmax_topk_warp<V>(logits + t * e, e, k, renorm, probs + t * e, ids + t * k, weights + t * k);
}

// (v2, i2) beats (v, i): a valid index, a larger value, or an equal value
// at a lower index (INT32_MAX: no index yet).
__device__ __forceinline__ bool argmax_beats(float v2, int32_t i2, float v, int32_t i) {
  return i2 != INT32_MAX && (i == INT32_MAX || v2 > v || (v2 == v && i2 < i));
}

// The block's best of (v, i) over its threads (shared-memory tree).
__device__ __forceinline__ void argmax_block(float v, int32_t i, float* sv, int32_t* si) {
  sv[threadIdx.x] = v, si[threadIdx.x] = i;
  __syncthreads();
  for (unsigned o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o &&
        argmax_beats(sv[threadIdx.x + o], si[threadIdx.x + o], sv[threadIdx.x], si[threadIdx.x]))
      sv[threadIdx.x] = sv[threadIdx.x + o], si[threadIdx.x] = si[threadIdx.x + o];
    __syncthreads();
  }
}

// Block b scans x [b * chunk, (b + 1) * chunk) (each thread a strided slice,
// first maximum, 8 loads in flight), writes its best to part; the last block
// to finish (counted in *done, reset to 0 by it) reduces the partials in block
// order (a grid of one block skips the count) and, with adv, advances the
// decode graph's step as advance_step_kernel does (with adv.fence, a
// system-scope fence after the host slot's write).
__global__ void __launch_bounds__(kArgThreads)
    argmax_kernel(const float* x, int64_t n, int32_t* out, ArgmaxScratch* sc, StepAdvance adv) {
  const unsigned ts = grid_wait<2>();  // trace marks: the block's best, the end
  grid_launch_dependents();
  __shared__ float sv[kArgThreads];
  __shared__ int32_t si[kArgThreads];
  constexpr int U = 8;
  const int64_t chunk = (n + gridDim.x - 1) / gridDim.x, b0 = int64_t(blockIdx.x) * chunk;
  const int64_t e = b0 + chunk < n ? b0 + chunk : n, step = blockDim.x;
  float v = -INFINITY;
  int32_t best = INT32_MAX;
  for (int64_t i0 = b0 + threadIdx.x; i0 < e; i0 += U * step) {
    float xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) xv[u] = i0 + u * step < e ? x[i0 + u * step] : 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * step < e && (best == INT32_MAX || xv[u] > v))
        v = xv[u], best = int32_t(i0 + u * step);
  }
  argmax_block(v, best, sv, si);
  trace_mark(ts, 1);
  if (gridDim.x > 1) {
    if (threadIdx.x == 0) sc->value[blockIdx.x] = sv[0], sc->index[blockIdx.x] = si[0];
    if (!last_block_arrive(&sc->done, gridDim.x)) return;
    const bool mine = threadIdx.x < gridDim.x;
    argmax_block(mine ? __ldcg(&sc->value[threadIdx.x]) : -INFINITY,
                 mine ? __ldcg(&sc->index[threadIdx.x]) : INT32_MAX, sv, si);
  }
  if (threadIdx.x == 0) {
    *out = si[0];
    if (gridDim.x > 1) sc->done = 0;
    if (adv.pos) {  // as advance_step_kernel, after every kernel of the step (grid_wait)
      const int64_t p = *adv.pos;
      *adv.pos = p + 1, *adv.token = si[0], adv.ring[p & 1] = si[0];
      if (adv.fence) __threadfence_system();
    }
  }
  trace_mark(ts, 2);
}

}  // namespace

namespace {
thread_local int t_pdl_off = 0;  // PlainLaunches in scope on this thread
}  // namespace

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOETIER_CUDA_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on && t_pdl_off == 0;
}

namespace {
std::atomic<int> g_carveout{-1};  // set_carveout
}  // namespace

void set_carveout(int percent) { g_carveout.store(percent, std::memory_order_relaxed); }

void apply_carveout(const void* kernel) {
  const int p = g_carveout.load(std::memory_order_relaxed);
  if (p < 0) return;
  static std::mutex m;
  static std::unordered_set<const void*> done;  // (one percentage a process)
  const std::lock_guard<std::mutex> lock(m);
  if (done.insert(kernel).second)
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, p);
}

PlainLaunches::PlainLaunches() { ++t_pdl_off; }
PlainLaunches::~PlainLaunches() { --t_pdl_off; }

namespace {
int g_arg_values = 32;  // set_argmax_values
}  // namespace

void set_argmax_values(int per_thread) {
  g_arg_values = per_thread == 16 || per_thread == 64 ? per_thread : 32;
}

void argmax(const float* x, int64_t n, int32_t* out, ArgmaxScratch* sc, cudaStream_t s,
            const StepAdvance* adv) {
  const int64_t per = int64_t(g_arg_values) * kArgThreads;  // values per block at the least
  const int64_t blocks = (n + per - 1) / per;
  const unsigned g = unsigned(blocks < kArgBlocks ? (blocks > 0 ? blocks : 1) : kArgBlocks);
  launch(argmax_kernel, g, kArgThreads, 0, s, x, n, out, sc, adv ? *adv : StepAdvance{});
}

namespace {
__global__ void advance_step_kernel(int64_t* pos, int32_t* token, const int32_t* next,
                                    int32_t* ring) {
  const int64_t p = *pos;
  const int32_t t = *next;
  *pos = p + 1;
  *token = t;
  ring[p & 1] = t;
  __threadfence_system();
}
}  // namespace

void advance_step(int64_t* pos, int32_t* token, const int32_t* next, int32_t* ring,
                  cudaStream_t s) {
  advance_step_kernel<<<1, 1, 0, s>>>(pos, token, next, ring);  // after argmax completes
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t s) {
  if (n <= 0) return;
  const int block = dim >= 1024 ? 1024 : (dim >= 256 ? 256 : 128);
  launch(rmsnorm_kernel, unsigned(n), block, 0, s, x, w, dim, eps, y);
}

void rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0, const int64_t* d_pos,
          const float* inv_freq, cudaStream_t s) {
  rope_kernel<<<grid_for(n * heads * hd / 2, 256), 256, 0, s>>>(x, n, heads, hd, pos0, d_pos,
                                                                inv_freq);
}

void kv_write(float* cache, const float* src, int64_t pos, const int64_t* d_pos, int64_t row,
              int64_t n, cudaStream_t s) {
  kv_write_kernel<<<grid_for(n * row, 256), 256, 0, s>>>(cache, src, pos, d_pos, row, n);
}

void add(float* x, const float* y, int64_t n, cudaStream_t s) {
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
}
void add_rows(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t s) {
  add_rows_kernel<<<grid_for(n * dim, 256), 256, 0, s>>>(y, b, n, dim);
}
void silu_mul(float* g, const float* u, int64_t n, cudaStream_t s) {
  silu_mul_kernel<<<grid_for(n, 256), 256, 0, s>>>(g, u, n);
}
void fill_zero(float* x, int64_t n, cudaStream_t s) {
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n);
}

__global__ void table_write_kernel(const TableWrite* w, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  *w[i].dst = w[i].v;
  if (w[i].flag) *w[i].flag = w[i].host;
}

void write_table_entries(const TableWrite* w, int n, cudaStream_t s) {
  if (n > 0) table_write_kernel<<<grid_for(n, 128), 128, 0, s>>>(w, n);
}

void embed(const MatView& t, const int32_t* ids, int64_t n, float* out, cudaStream_t s) {
  const auto* w = static_cast<const uint8_t*>(t.data);
  const unsigned g = grid_for(n * t.cols, 256);
  switch (t.enc) {
    case WeightEncoding::F32:
      return launch(embed_kernel<kF32>, g, 256, 0, s, w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::BF16:
      return launch(embed_kernel<kBF16>, g, 256, 0, s, w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::MXFP4:
      return launch(embed_kernel<kMXFP4>, g, 256, 0, s, w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::CB3:
      return launch(embed_kernel<kCB3>, g, 256, 0, s, w, t.scales, t.cols, ids, n, out);
  }
}

void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renorm, float* probs,
                  int32_t* ids, float* weights, cudaStream_t s) {
  if (n <= 0) return;
  const int r = renorm ? 1 : 0;
  const unsigned g = unsigned(n);
  if (e <= 128)
    launch(softmax_topk_kernel<4>, g, 32, 0, s, logits, e, k, r, probs, ids, weights);
  else if (e <= 256)
    launch(softmax_topk_kernel<8>, g, 32, 0, s, logits, e, k, r, probs, ids, weights);
  else
    launch(softmax_topk_kernel<32>, g, 32, 0, s, logits, e, k, r, probs, ids, weights);
}

}  // namespace moetier::cuda
