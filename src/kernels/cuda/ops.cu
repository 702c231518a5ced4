// Elementwise kernels, RMSNorm, RoPE, embedding rows and the softmax top-k
// router (kernels/cuda/cuda.h). Each mirrors the CPU kernel's arithmetic
// (double sum of squares in RMSNorm, f32 products, cos/sin in double).
#include <cfloat>
#include <cmath>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rowdot.cuh"

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

template <int ENC>
__global__ void embed_kernel(const uint8_t* w, const uint8_t* sc, int64_t cols, const int32_t* ids,
                             int64_t n, float* out) {
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  GRID_STRIDE(i, n * cols) out[i] = weight_at<ENC>(w, sc, ids[i / cols], i % cols, cols, lut);
}

// One warp per token; lane j holds the probabilities of experts j, j + 32,
// ... (V per lane). k rounds of a warp arg-max (ties to the lower id); the
// weights are summed in selection order by lane 0.
template <int V>
__global__ void __launch_bounds__(32)
    softmax_topk_kernel(const float* logits, int64_t e, int64_t k, int renorm, float* probs,
                        int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  float p[V];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t j = lane + 32 * i;
    p[i] = j < e ? logits[t * e + j] : -FLT_MAX;
    m = fmaxf(m, p[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    p[i] = lane + 32 * i < e ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < e) {
      p[i] = p[i] / sum;
      probs[t * e + j] = p[i];
    } else {
      p[i] = -1.0f;
    }
  }
  float sel_sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    float v = -2.0f;
    int id = INT32_MAX, at = 0;
#pragma unroll
    for (int i = 0; i < V; ++i)  // ascending ids: the first maximum wins ties
      if (p[i] > v) v = p[i], id = lane + 32 * i, at = i;
    const int mine = id;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
      const int id2 = __shfl_xor_sync(0xffffffffu, id, o);
      if (v2 > v || (v2 == v && id2 < id)) v = v2, id = id2;
    }
    if (id == mine) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i == at) p[i] = -2.0f;  // taken
    }
    if (lane == 0) {
      ids[t * k + r] = id;
      weights[t * k + r] = v;
      sel_sum += v;
    }
  }
  __syncwarp();
  if (renorm && lane == 0)
    for (int64_t r = 0; r < k; ++r) weights[t * k + r] = weights[t * k + r] / sel_sum;
}

// One block: each thread scans a strided slice (first maximum), then a
// shared-memory tree keeps the larger value, ties to the lower index.
__global__ void __launch_bounds__(1024) argmax_kernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float sv[1024];
  __shared__ int32_t si[1024];
  float v = -INFINITY;
  int32_t best = INT32_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (best == INT32_MAX || x[i] > v) v = x[i], best = int32_t(i);
  sv[threadIdx.x] = v, si[threadIdx.x] = best;
  __syncthreads();
  for (unsigned o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      const float v2 = sv[threadIdx.x + o];
      const int32_t i2 = si[threadIdx.x + o];
      if (i2 != INT32_MAX && (si[threadIdx.x] == INT32_MAX || v2 > sv[threadIdx.x] ||
                              (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x])))
        sv[threadIdx.x] = v2, si[threadIdx.x] = i2;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = si[0];
}

}  // namespace

void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s) {
  argmax_kernel<<<1, 1024, 0, s>>>(x, n, out);
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t s) {
  if (n <= 0) return;
  const int block = dim >= 1024 ? 1024 : (dim >= 256 ? 256 : 128);
  rmsnorm_kernel<<<unsigned(n), block, 0, s>>>(x, w, dim, eps, y);
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

void embed(const MatView& t, const int32_t* ids, int64_t n, float* out, cudaStream_t s) {
  const auto* w = static_cast<const uint8_t*>(t.data);
  const unsigned g = grid_for(n * t.cols, 256);
  switch (t.enc) {
    case WeightEncoding::F32:
      return embed_kernel<kF32><<<g, 256, 0, s>>>(w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::BF16:
      return embed_kernel<kBF16><<<g, 256, 0, s>>>(w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::MXFP4:
      return embed_kernel<kMXFP4><<<g, 256, 0, s>>>(w, t.scales, t.cols, ids, n, out);
    case WeightEncoding::CB3:
      return embed_kernel<kCB3><<<g, 256, 0, s>>>(w, t.scales, t.cols, ids, n, out);
  }
}

void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renorm, float* probs,
                  int32_t* ids, float* weights, cudaStream_t s) {
  if (n <= 0) return;
  const int r = renorm ? 1 : 0;
  const unsigned g = unsigned(n);
  if (e <= 128)
    softmax_topk_kernel<4><<<g, 32, 0, s>>>(logits, e, k, r, probs, ids, weights);
  else if (e <= 256)
    softmax_topk_kernel<8><<<g, 32, 0, s>>>(logits, e, k, r, probs, ids, weights);
  else
    softmax_topk_kernel<32><<<g, 32, 0, s>>>(logits, e, k, r, probs, ids, weights);
}

}  // namespace moetier::cuda
