// Causal GQA attention on CUDA cores with an online softmax.
//
// One block of 4 warps per (head, split, query). A warp takes 32 positions at
// a time: each lane scores one position (q . k, the query in shared memory),
// the warp updates its running max / sum, then every lane accumulates its
// head_dim / 32 slice of the value rows of those 32 positions (coalesced). The
// warps are merged in shared memory. Decode (one query) cuts the context into
// splits of kSplit positions whose partials (max, sum, acc) go to scratch and
// a second kernel merges them (flash-decoding); prefill uses one split.
//
// Graph mode: with d_pos non-null, the query's position is *d_pos (the
// host's first_pos is only the capture-time value): the grid covers
// max_positions, and splits past the position do nothing.
#include <cfloat>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {
namespace {

constexpr int kWarpsA = 4;
constexpr int64_t kSplit = 128;
constexpr int64_t kMaxSplits = 256;
constexpr int kMaxD = 8;  // head_dim <= 256

int64_t splits_for(int64_t n_q, int64_t positions) {
  if (n_q > 1) return 1;
  const int64_t s = (positions + kSplit - 1) / kSplit;
  return s < kMaxSplits ? s : kMaxSplits;
}

__global__ void __launch_bounds__(kWarpsA * 32)
    attn_kernel(const float* q, const float* k, const float* v, int64_t first_pos,
                const int64_t* d_pos, int64_t heads, int64_t kvh, int64_t hd, float scale,
                float* out, float* scratch, int64_t split_len) {
  const int64_t h = blockIdx.x, sp = blockIdx.y, t = blockIdx.z, splits = gridDim.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t len = (d_pos ? *d_pos : first_pos) + t + 1;
  const int64_t p0 = sp * split_len, p1 = p0 + split_len < len ? p0 + split_len : len;
  const int64_t kv = h / (heads / kvh);
  const int nd = int((hd + 31) / 32);
  __shared__ float sq[kMaxD * 32];
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) sq[d] = q[(t * heads + h) * hd + d];
  __syncthreads();
  float acc[kMaxD];
#pragma unroll
  for (int i = 0; i < kMaxD; ++i) acc[i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;
  const int64_t stride = kvh * hd;
  for (int64_t c0 = p0 + 32 * warp; c0 < p1; c0 += 32 * kWarpsA) {
    const int64_t pos = c0 + lane;
    float sc = -FLT_MAX;
    if (pos < p1) {
      const float* kr = k + pos * stride + kv * hd;
      float s = 0.0f;
      if (hd % 4 == 0) {
        for (int64_t d = 0; d < hd; d += 4) {
          const float4 kk = *reinterpret_cast<const float4*>(kr + d);
          s += sq[d] * kk.x + sq[d + 1] * kk.y + sq[d + 2] * kk.z + sq[d + 3] * kk.w;
        }
      } else {
        for (int64_t d = 0; d < hd; ++d) s += sq[d] * kr[d];
      }
      sc = s * scale;
    }
    float cm = sc;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
    const float mn = fmaxf(m, cm), corr = expf(m - mn);
    const float pe = pos < p1 ? expf(sc - mn) : 0.0f;
    l = l * corr + warp_sum(pe);
#pragma unroll
    for (int i = 0; i < kMaxD; ++i) acc[i] *= corr;
    const int64_t cnt = p1 - c0 < 32 ? p1 - c0 : 32;
    for (int64_t j = 0; j < cnt; ++j) {
      const float pj = __shfl_sync(0xffffffffu, pe, int(j));
      const float* vr = v + (c0 + j) * stride + kv * hd;
#pragma unroll
      for (int i = 0; i < kMaxD; ++i) {
        const int64_t d = lane + 32 * i;
        if (i < nd && d < hd) acc[i] += pj * vr[d];
      }
    }
    m = mn;
  }
  __shared__ float sm[kWarpsA], sl[kWarpsA];
  __shared__ float sacc[kWarpsA][kMaxD * 32];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
  for (int i = 0; i < kMaxD; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = sm[0];
  for (int w = 1; w < kWarpsA; ++w) M = fmaxf(M, sm[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarpsA; ++w) L += sl[w] * (sl[w] > 0.0f ? expf(sm[w] - M) : 0.0f);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kWarpsA; ++w) a += sl[w] > 0.0f ? sacc[w][d] * expf(sm[w] - M) : 0.0f;
    if (splits == 1)
      out[(t * heads + h) * hd + d] = a / L;
    else
      scratch[((h * splits + sp) * (hd + 2)) + 2 + d] = a;
  }
  if (splits > 1 && threadIdx.x == 0) {
    scratch[(h * splits + sp) * (hd + 2)] = M;
    scratch[(h * splits + sp) * (hd + 2) + 1] = L;  // 0 for a split past the position
  }
}

__global__ void attn_combine(const float* scratch, int64_t splits, int64_t hd, float* out) {
  const int64_t h = blockIdx.x;
  const float* p = scratch + h * splits * (hd + 2);
  float M = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s)
    if (p[s * (hd + 2) + 1] > 0.0f) M = fmaxf(M, p[s * (hd + 2)]);
  float L = 0.0f;
  for (int64_t s = 0; s < splits; ++s)
    if (p[s * (hd + 2) + 1] > 0.0f) L += p[s * (hd + 2) + 1] * expf(p[s * (hd + 2)] - M);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int64_t s = 0; s < splits; ++s)
      if (p[s * (hd + 2) + 1] > 0.0f) a += p[s * (hd + 2) + 2 + d] * expf(p[s * (hd + 2)] - M);
    out[h * hd + d] = a / L;
  }
}

}  // namespace

int64_t attention_scratch_floats(int64_t n_q, int64_t positions, int64_t heads, int64_t hd) {
  const int64_t s = splits_for(n_q, positions);
  return s > 1 ? heads * s * (hd + 2) : 0;
}

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
               int64_t hd, float scale, float* out, float* scratch, cudaStream_t s) {
  if (n_q <= 0) return;
  const int64_t len = d_pos ? max_positions : first_pos + n_q;  // positions the grid covers
  const int64_t splits = splits_for(n_q, len);
  const int64_t split_len = (len + splits - 1) / splits;
  const dim3 grid{unsigned(heads), unsigned(splits), unsigned(n_q)};
  attn_kernel<<<grid, kWarpsA * 32, 0, s>>>(q, k, v, first_pos, d_pos, heads, kv_heads, hd, scale,
                                            out, scratch, split_len);
  if (splits > 1) attn_combine<<<unsigned(heads), 128, 0, s>>>(scratch, splits, hd, out);
}

}  // namespace moetier::cuda
