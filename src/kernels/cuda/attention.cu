// Causal GQA attention on CUDA cores with an online softmax.
//
// Decode (one query, head_dim a multiple of 4, up to 32 query heads per kv
// head): one block per (kv head, split) serves every query head of the group,
// so each K/V row is read from memory once. The block stages tiles of kTile
// positions of K and V in shared memory; a warp takes one or more query
// heads: each lane scores one position of the tile, the warp updates its
// running max / sum, and each lane accumulates its float4 slices of the value
// rows. The split layout (tiles per split, splits) is a function of the
// sequence length only, computed on the device from the position, so a graph
// replay (grid sized for the capacity, splits past the length do nothing) and
// a plain step split identically; a second kernel merges the splits.
//
// Otherwise one block of 4 warps per (head, split, query). A warp takes 32 positions at
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

constexpr int64_t kTile = 32;        // positions per shared-memory tile (decode)
constexpr int64_t kMaxSplitsD = 64;  // splits per kv head (decode)
constexpr int kMaxGroupWarps = 8;

__host__ __device__ inline void decode_layout(int64_t len, int64_t& tps, int64_t& splits) {
  const int64_t tiles = (len + kTile - 1) / kTile;
  const int64_t s = tiles < kMaxSplitsD ? tiles : kMaxSplitsD;
  tps = (tiles + s - 1) / s;
  splits = (tiles + tps - 1) / tps;
}

// One warp's online-softmax step for query head qh over a tile of cnt
// positions in shared memory (rows of ld floats): lane j scores position j,
// then each lane adds its float4 slices (dims 4 (lane + 32 c)) of the values.
__device__ __forceinline__ void attend_tile(const float* qh, const float* ks, const float* vs,
                                            int64_t ld, int64_t hd, int64_t cnt, float scale,
                                            float& m, float& l, float4 (&acc)[2]) {
  const int lane = int(threadIdx.x & 31);
  const int64_t nd4 = hd / 4;
  float sc = -FLT_MAX;
  if (lane < cnt) {
    const float* kr = ks + lane * ld;
    float d0 = 0.0f;
    for (int64_t d = 0; d < hd; d += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(kr + d);
      d0 += qh[d] * kk.x + qh[d + 1] * kk.y + qh[d + 2] * kk.z + qh[d + 3] * kk.w;
    }
    sc = d0 * scale;
  }
  float cm = sc;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
  const float mn = fmaxf(m, cm), corr = expf(m - mn);
  const float pj0 = lane < cnt ? expf(sc - mn) : 0.0f;
  l = l * corr + warp_sum(pj0);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    acc[c].x *= corr, acc[c].y *= corr, acc[c].z *= corr, acc[c].w *= corr;
  }
  for (int64_t j = 0; j < cnt; ++j) {
    const float pj = __shfl_sync(0xffffffffu, pj0, int(j));
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t d4 = lane + 32 * c;
      if (d4 < nd4) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + j * ld + 4 * d4);
        acc[c].x += pj * vv.x, acc[c].y += pj * vv.y;
        acc[c].z += pj * vv.z, acc[c].w += pj * vv.w;
      }
    }
  }
  m = mn;
}

// Grid: kv heads x S (>= the length's splits); block: 32 x min(G, 8) threads.
// Dynamic shared memory: K and V tiles [kTile, hd + 4] and the group's q [G, hd].
template <int HPW>
__global__ void __launch_bounds__(kMaxGroupWarps * 32)
    attn_decode_kernel(const float* q, const float* k, const float* v, int64_t first_pos,
                       const int64_t* d_pos, int64_t heads, int64_t kvh, int64_t hd, float scale,
                       float* out, float* scratch) {
  extern __shared__ float4 smem4[];
  const int64_t len = (d_pos ? *d_pos : first_pos) + 1;
  int64_t tps = 0, splits = 0;
  decode_layout(len, tps, splits);
  const int64_t sp = blockIdx.y, S = gridDim.y, g = blockIdx.x, G = heads / kvh;
  if (sp >= splits) return;
  const int nw = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int64_t ld = hd + 4, nd4 = hd / 4;
  float* ks = reinterpret_cast<float*>(smem4);
  float* vs = ks + kTile * ld;
  float* qs = vs + kTile * ld;
  for (int64_t i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[g * G * hd + i];
  float m[HPW], l[HPW];
  float4 acc[HPW][2];  // dims 4 (lane + 32 c) .. + 3, c < 2 (hd <= 256)
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    m[hh] = -FLT_MAX, l[hh] = 0.0f;
    acc[hh][0] = acc[hh][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const int64_t stride = kvh * hd;
  const int64_t pb = sp * tps * kTile, pe = pb + tps * kTile < len ? pb + tps * kTile : len;
  for (int64_t p0 = pb; p0 < pe; p0 += kTile) {
    const int64_t cnt = pe - p0 < kTile ? pe - p0 : kTile;
    __syncthreads();  // the previous tile is consumed (and qs written)
    for (int64_t i = threadIdx.x; i < cnt * nd4; i += blockDim.x) {
      const int64_t r = i / nd4, c = i - r * nd4, src = (p0 + r) * stride + g * hd + 4 * c;
      *reinterpret_cast<float4*>(ks + r * ld + 4 * c) = *reinterpret_cast<const float4*>(k + src);
      *reinterpret_cast<float4*>(vs + r * ld + 4 * c) = *reinterpret_cast<const float4*>(v + src);
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const int64_t hl = warp + int64_t(hh) * nw;
      if (hl >= G) break;
      attend_tile(qs + hl * hd, ks, vs, ld, hd, cnt, scale, m[hh], l[hh], acc[hh]);
    }
  }
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const int64_t hl = warp + int64_t(hh) * nw;
    if (hl >= G) break;
    const int64_t h = g * G + hl;
    float* part = scratch + (h * S + sp) * (hd + 2);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t d4 = lane + 32 * c;
      if (d4 >= nd4) continue;
      float4 a = acc[hh][c];
      if (splits == 1) {
        a.x /= l[hh], a.y /= l[hh], a.z /= l[hh], a.w /= l[hh];
        *reinterpret_cast<float4*>(out + h * hd + 4 * d4) = a;
      } else {
        part[2 + 4 * d4] = a.x, part[3 + 4 * d4] = a.y;
        part[4 + 4 * d4] = a.z, part[5 + 4 * d4] = a.w;
      }
    }
    if (splits > 1 && lane == 0) part[0] = m[hh], part[1] = l[hh];
  }
}

// Merges the length's splits (partials at stride S per head); nothing to do
// for one split (the first kernel wrote the output).
__global__ void attn_decode_combine(const float* scratch, int64_t S, int64_t first_pos,
                                    const int64_t* d_pos, int64_t hd, float* out) {
  const int64_t len = (d_pos ? *d_pos : first_pos) + 1;
  int64_t tps = 0, splits = 0;
  decode_layout(len, tps, splits);
  if (splits == 1) return;
  const int64_t h = blockIdx.x;
  const float* p = scratch + h * S * (hd + 2);
  float M = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, p[s * (hd + 2)]);
  float L = 0.0f;
  for (int64_t s = 0; s < splits; ++s) L += p[s * (hd + 2) + 1] * expf(p[s * (hd + 2)] - M);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int64_t s = 0; s < splits; ++s) a += p[s * (hd + 2) + 2 + d] * expf(p[s * (hd + 2)] - M);
    out[h * hd + d] = a / L;
  }
}

bool decode_applies(int64_t n_q, int64_t heads, int64_t kvh, int64_t hd) {
  return n_q == 1 && hd % 4 == 0 && hd <= 256 && heads / kvh <= 4 * kMaxGroupWarps;
}

int64_t decode_grid_splits(int64_t positions) {
  const int64_t tiles = (positions + kTile - 1) / kTile;
  return tiles < kMaxSplitsD ? (tiles > 0 ? tiles : 1) : kMaxSplitsD;
}

template <int HPW>
void launch_decode(const float* q, const float* k, const float* v, int64_t first_pos,
                   const int64_t* d_pos, int64_t S, int64_t heads, int64_t kvh, int64_t hd,
                   float scale, float* out, float* scratch, cudaStream_t s) {
  const int64_t G = heads / kvh;
  const int warps = int(G < kMaxGroupWarps ? G : kMaxGroupWarps);
  const size_t smem = size_t(2 * kTile * (hd + 4) + G * hd) * sizeof(float);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(attn_decode_kernel<HPW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         int(smem));
  const dim3 grid{unsigned(kvh), unsigned(S)};
  attn_decode_kernel<HPW><<<grid, unsigned(32 * warps), smem, s>>>(q, k, v, first_pos, d_pos, heads,
                                                                   kvh, hd, scale, out, scratch);
  attn_decode_combine<<<unsigned(heads), 128, 0, s>>>(scratch, S, first_pos, d_pos, hd, out);
}

}  // namespace

int64_t attention_scratch_floats(int64_t n_q, int64_t positions, int64_t heads, int64_t hd) {
  const int64_t s = splits_for(n_q, positions);
  const int64_t old = s > 1 ? heads * s * (hd + 2) : 0;
  const int64_t dec = n_q == 1 ? heads * decode_grid_splits(positions) * (hd + 2) : 0;
  return old > dec ? old : dec;
}

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
               int64_t hd, float scale, float* out, float* scratch, cudaStream_t s) {
  if (n_q <= 0) return;
  const int64_t len = d_pos ? max_positions : first_pos + n_q;  // positions the grid covers
  if (decode_applies(n_q, heads, kv_heads, hd)) {
    const int64_t S = decode_grid_splits(len),
                  hpw = (heads / kv_heads + kMaxGroupWarps - 1) / kMaxGroupWarps;
    if (hpw == 1)
      return launch_decode<1>(q, k, v, first_pos, d_pos, S, heads, kv_heads, hd, scale, out,
                              scratch, s);
    if (hpw == 2)
      return launch_decode<2>(q, k, v, first_pos, d_pos, S, heads, kv_heads, hd, scale, out,
                              scratch, s);
    return launch_decode<4>(q, k, v, first_pos, d_pos, S, heads, kv_heads, hd, scale, out, scratch,
                            s);
  }
  const int64_t splits = splits_for(n_q, len);
  const int64_t split_len = (len + splits - 1) / splits;
  const dim3 grid{unsigned(heads), unsigned(splits), unsigned(n_q)};
  attn_kernel<<<grid, kWarpsA * 32, 0, s>>>(q, k, v, first_pos, d_pos, heads, kv_heads, hd, scale,
                                            out, scratch, split_len);
  if (splits > 1) attn_combine<<<unsigned(heads), 128, 0, s>>>(scratch, splits, hd, out);
}

}  // namespace moetier::cuda
