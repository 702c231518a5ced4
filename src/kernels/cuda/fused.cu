// Fused kernels (kernels/cuda/cuda.h): attention's per-head norm + RoPE +
// KV-cache write in one launch (the GEMVs that take in their RMSNorm or their
// residual add: decode.cu). It computes what the separate kernels compute, with
// the same arithmetic (double sum of squares, cos/sin in double).
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

// Grid: n x (nh + 2 nkv) blocks (q heads, k heads, v heads) of one head row.
__global__ void qk_norm_rope_kv_kernel(float* q, float* k, const float* v, const float* q_norm,
                                       const float* k_norm, int64_t nh, int64_t nkv, int64_t hd,
                                       float eps, int64_t pos, const int64_t* d_pos,
                                       const float* inv_freq, float* k_cache, float* v_cache) {
  grid_wait();
  grid_launch_dependents();
  if (d_pos) pos = *d_pos;
  const int64_t t = blockIdx.x, j = blockIdx.y, kvd = nkv * hd;
  const int64_t cache_row = (pos + t) * kvd;
  if (j >= nh + nkv) {  // v head: the cache write only
    const int64_t h = j - nh - nkv;
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x)
      v_cache[cache_row + h * hd + d] = v[t * kvd + h * hd + d];
    return;
  }
  const bool is_q = j < nh;
  float* row = is_q ? q + (t * nh + j) * hd : k + (t * nkv + (j - nh)) * hd;
  const float* w = is_q ? q_norm : k_norm;
  __shared__ float y[512];
  __shared__ double part[33];
  double ss = 0.0;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    y[d] = row[d];
    ss += double(row[d]) * double(row[d]);
  }
  const double tot = block_sumsq(ss, part);
  if (w) {
    const float r = 1.0f / sqrtf(float(tot / double(hd)) + eps);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) y[d] = w[d] * (y[d] * r);
  }
  __syncthreads();
  const int64_t half = hd / 2;
  for (int64_t d = threadIdx.x; d < half; d += blockDim.x) {
    const float angle = inv_freq[d] * float(pos + t);
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    const float a = y[d], b = y[d + half];
    const float r0 = a * c - b * s, r1 = b * c + a * s;
    row[d] = r0, row[d + half] = r1;
    if (!is_q) {
      const int64_t h = j - nh;
      k_cache[cache_row + h * hd + d] = r0;
      k_cache[cache_row + h * hd + d + half] = r1;
    }
  }
}

}  // namespace

bool qk_norm_rope_kv(float* q, float* k, const float* v, const float* q_norm, const float* k_norm,
                     int64_t n, int64_t nh, int64_t nkv, int64_t hd, float eps, int64_t pos,
                     const int64_t* d_pos, const float* inv_freq, float* k_cache, float* v_cache,
                     cudaStream_t s) {
  if (n <= 0 || hd > 512 || hd % 2) return false;
  const dim3 grid(unsigned(n), unsigned(nh + 2 * nkv));
  const unsigned block = hd >= 128 ? 128 : (hd >= 64 ? 64 : 32);
  launch(qk_norm_rope_kv_kernel, grid, block, 0, s, q, k, v, q_norm, k_norm, nh, nkv, hd, eps, pos,
         d_pos, inv_freq, k_cache, v_cache);
  return true;
}

}  // namespace moetier::cuda
