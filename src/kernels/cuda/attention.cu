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
// a plain step split identically; the last block of each kv head to finish
// merges its splits. attention_decode also does attention's per-head input
// steps (q/k norm, RoPE, the KV write) in the same launch.
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
#include <utility>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/launch.cuh"
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

// One warp's online-softmax step for its lane's score sc (valid: the lane
// holds a position; an invalid lane's sc is -FLT_MAX): the running max m and
// sum l advance over the warp's scores; returns the lane's weight
// exp(sc - m') and sets corr = exp(m - m'), the factor on earlier sums.
__device__ __forceinline__ float online_softmax(float sc, bool valid, float& m, float& l,
                                                float& corr) {
  float cm = sc;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
  const float mn = fmaxf(m, cm);
  corr = expf(m - mn);
  const float pe = valid ? expf(sc - mn) : 0.0f;
  l = l * corr + warp_sum(pe);
  m = mn;
  return pe;
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
    float corr;
    const float pe = online_softmax(sc, pos < p1, m, l, corr);
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

constexpr int kTile = 32;        // positions per shared-memory tile (decode)
constexpr int kMaxSplitsD = 64;  // splits per kv head (decode)
constexpr int kMaxGroupWarps = 8;
constexpr int kPer = 4;   // float4 of K (and of V) per thread per tile, held in registers
constexpr int kPre = 16;  // splits whose partials decode_merge reads with their max and sum

__host__ __device__ inline void decode_layout(int64_t len, int64_t& tps, int64_t& splits) {
  const int64_t tiles = (len + kTile - 1) / kTile;
  const int64_t s = tiles < kMaxSplitsD ? tiles : kMaxSplitsD;
  tps = (tiles + s - 1) / s;
  splits = (tiles + tps - 1) / tps;
}

// One tile's K and V rows (p0 .. p0 + cnt - 1 of one kv head, columns col0 ..,
// nd4 float4 each) in flight in registers: element e = threadIdx.x + u
// blockDim.x (u < kPer) is row e / nd4, float4 e % nd4. `fetch` issues the
// loads, `put` stores them into the tiles ks / vs (rows of ld floats). A tile
// fits when kTile nd4 <= kPer blockDim (head_dim 128 with 8 warps); otherwise
// load_tile() goes through it in several rounds.
// The loads are plain (coherent) ones: a later tile of the last split reads
// back the row at pos that its block wrote after grid_wait (never __ldg or
// ld.global.nc here, nor __restrict__ on the caches).
struct TileRegs {
  float4 k[kPer], v[kPer];
  __device__ __forceinline__ void fetch(const float* kc, const float* vc, int64_t p0, int cnt,
                                        int64_t stride, int64_t col0, int nd4, int base) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int e = base + int(threadIdx.x) + u * int(blockDim.x);
      if (e >= cnt * nd4) break;
      const int r = e / nd4, c = e - r * nd4;
      const int64_t src = (p0 + r) * stride + col0 + 4 * c;
      k[u] = *reinterpret_cast<const float4*>(kc + src);
      v[u] = *reinterpret_cast<const float4*>(vc + src);
    }
  }
  __device__ __forceinline__ void put(float* ks, float* vs, int cnt, int nd4, int ld,
                                      int base) const {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int e = base + int(threadIdx.x) + u * int(blockDim.x);
      if (e >= cnt * nd4) break;
      const int r = e / nd4, c = e - r * nd4;
      *reinterpret_cast<float4*>(ks + r * ld + 4 * c) = k[u];
      *reinterpret_cast<float4*>(vs + r * ld + 4 * c) = v[u];
    }
  }
};

__device__ __forceinline__ void load_tile(const float* k, const float* v, int64_t p0, int cnt,
                                          int64_t stride, int64_t col0, int nd4, int ld, float* ks,
                                          float* vs) {
  TileRegs t;
  for (int base = 0; base < cnt * nd4; base += kPer * int(blockDim.x)) {
    t.fetch(k, v, p0, cnt, stride, col0, nd4, base);
    t.put(ks, vs, cnt, nd4, ld, base);
  }
}

// One warp's online-softmax step for query head qh over a tile of cnt
// positions in shared memory (rows of ld floats): lane j scores position j,
// then each lane adds its float4 slices (dims 4 (lane + 32 c)) of the values.
// HD: head_dim when known at compile time (the loops unroll), else 0.
template <int HD>
__device__ __forceinline__ void attend_tile(const float* qh, const float* ks, const float* vs,
                                            int ld, int hd_rt, int cnt, float scale, float& m,
                                            float& l, float4 (&acc)[2]) {
  const int hd = HD ? HD : hd_rt;
  const int lane = int(threadIdx.x & 31), nd4 = hd / 4;
  float sc = -FLT_MAX;
  if (lane < cnt) {
    const float* kr = ks + lane * ld;
    float d0 = 0.0f, d1 = 0.0f;  // two chains (even and odd float4), summed at the end
#pragma unroll
    for (int d = 0; d < hd; d += 8) {
      const float4 k0 = *reinterpret_cast<const float4*>(kr + d);
      const float4 q0 = *reinterpret_cast<const float4*>(qh + d);
      d0 += q0.x * k0.x + q0.y * k0.y + q0.z * k0.z + q0.w * k0.w;
      if (d + 4 < hd) {
        const float4 k1 = *reinterpret_cast<const float4*>(kr + d + 4);
        const float4 q1 = *reinterpret_cast<const float4*>(qh + d + 4);
        d1 += q1.x * k1.x + q1.y * k1.y + q1.z * k1.z + q1.w * k1.w;
      }
    }
    sc = (d0 + d1) * scale;
  }
  float corr;
  const float pj0 = online_softmax(sc, lane < cnt, m, l, corr);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    acc[c].x *= corr, acc[c].y *= corr, acc[c].z *= corr, acc[c].w *= corr;
  }
#pragma unroll 8
  for (int j = 0; j < cnt; ++j) {
    const float pj = __shfl_sync(0xffffffffu, pj0, j);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int d4 = lane + 32 * c;
      if (d4 < nd4) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + j * ld + 4 * d4);
        acc[c].x += pj * vv.x, acc[c].y += pj * vv.y;
        acc[c].z += pj * vv.z, acc[c].w += pj * vv.w;
      }
    }
  }
}

// A group of 8 query heads over one tile of cnt positions (kTile rows of ld
// floats in shared memory, head_dim 128, 8 warps), each K element read once
// and each V element by four warps (attend_tile reads the tile once a head).
// Scores: thread (warp w, lane j) holds K rows w + 8u (u < 4) at dims 4j ..
// 4j + 3; its partial dots (heads 4H .. 4H + 3, H = 0 then 1, with its 4 rows)
// are summed over the lanes by a reduce-scatter: lane j writes head j / 4 with
// row w + 8 (j % 4) into ss [8][kTile]. Warp h then runs head h's online
// softmax (m, l: its running max and sum) and writes the weights to pp
// [8][kTile] and the factor on earlier sums to cf [8]. Values: warp w adds,
// for heads 2 (w % 4) and + 1, rows 16 (w / 4) .. + 15 of p x v at dims 4j ..
// into acc [2] (scaled by cf first). qs: the group's q rows [8][128]. The K
// tile is read before its first block barrier, the V tile after its second;
// ss, pp and cf are next written after the caller's next barrier. (Few
// registers: two blocks fit a multiprocessor, beside the q/k/v GEMV's.)
__device__ __forceinline__ void attend_tile8(const float* qs, const float* ks, const float* vs,
                                             int ld, int cnt, float scale, float* ss, float* pp,
                                             float* cf, float& m, float& l, float4 (&acc)[2]) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  float4 kk[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = warp + 8 * u;  // (rows past cnt hold stale values: never read)
    kk[u] = r < cnt ? *reinterpret_cast<const float4*>(ks + r * ld + 4 * lane)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float sc = 0.0f;
#pragma unroll
  for (int H = 0; H < 2; ++H) {
    float part[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = *reinterpret_cast<const float4*>(qs + (4 * H + i) * 128 + 4 * lane);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        part[4 * i + u] = q.x * kk[u].x + q.y * kk[u].y + q.z * kk[u].z + q.w * kk[u].w;
    }
    const float t =
        warp_rows_scatter<16>(part);  // head 4H + lane % 16 / 4, row warp + 8 (lane % 4)
    if ((lane >> 4) == H) sc = t * scale;
  }
  const int row = warp + 8 * (lane & 3);
  ss[(lane >> 2) * kTile + row] = row < cnt ? sc : -FLT_MAX;
  __syncthreads();
  float corr;
  pp[warp * kTile + lane] = online_softmax(ss[warp * kTile + lane], lane < cnt, m, l, corr);
  if (lane == 0) cf[warp] = corr;
  __syncthreads();
  const int h0 = 2 * (warp & 3), r0 = 16 * (warp >> 2);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float c = cf[h0 + j];
    acc[j].x *= c, acc[j].y *= c, acc[j].z *= c, acc[j].w *= c;
  }
  const int n = cnt - r0 < 16 ? cnt - r0 : 16;  // this warp's rows (weights past cnt are 0)
#pragma unroll 4
  for (int r = 0; r < n; ++r) {
    const float4 vv = *reinterpret_cast<const float4*>(vs + (r0 + r) * ld + 4 * lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p = pp[(h0 + j) * kTile + r0 + r];
      acc[j].x += p * vv.x, acc[j].y += p * vv.y, acc[j].z += p * vv.z, acc[j].w += p * vv.w;
    }
  }
}

// attend_tile8's acc added over each pair of warps w, w + 4 (through red
// [8][32] float4 in shared memory): warp h's lane j returns head h's dims 4j ..
// 4j + 3. red may alias only the K tile, which the last attend_tile8 read
// before its first barrier (so no barrier is needed before red is written).
__device__ __forceinline__ float4 gather_acc8(const float4 (&acc)[2], float4* red) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int h0 = 2 * (warp & 3);
  if (warp >= 4)
#pragma unroll
    for (int j = 0; j < 2; ++j) red[(h0 + j) * 32 + lane] = acc[j];
  __syncthreads();
  if (warp < 4)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float4 b = red[(h0 + j) * 32 + lane];
      red[(h0 + j) * 32 + lane] =
          make_float4(acc[j].x + b.x, acc[j].y + b.y, acc[j].z + b.z, acc[j].w + b.w);
    }
  __syncthreads();
  return red[warp * 32 + lane];
}

// A head row y [hd] in shared memory, in place, by one warp: RMSNorm with w
// (null: none; double sum of squares, as the CPU) and RoPE with the position's
// cos / sin [hd / 2] (computed in double from the f32 angle, as
// qk_norm_rope_kv does).
__device__ __forceinline__ void norm_rope_row(float* y, const float* w, int hd, float eps,
                                              const float* cs, const float* sn) {
  const int lane = int(threadIdx.x & 31);
  if (w) {
    double ss = 0.0;
    for (int d = lane; d < hd; d += 32) ss += double(y[d]) * double(y[d]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = 1.0f / sqrtf(float(ss / double(hd)) + eps);
    for (int d = lane; d < hd; d += 32) y[d] = w[d] * (y[d] * r);
    __syncwarp();
  }
  const int half = hd / 2;
  for (int d = lane; d < half; d += 32) {
    const float c = cs[d], s = sn[d], a = y[d], b = y[d + half];
    y[d] = a * c - b * s, y[d + half] = b * c + a * s;
  }
  __syncwarp();
}

// The last of a kv head's split blocks to finish (counted in done[g], reset to
// 0 by it) merges the splits of the group's heads from the partials (rows of
// hd + 4 floats: acc [hd], max, sum; at stride S per head): warp w takes heads
// w, w + nw, ..., lane j the splits j and j + 32 for the max and the sum, then
// its float4 of dims over all splits, 16 loads at a time (S <= 64).
__device__ void decode_merge(const float* scratch, int64_t g, int64_t G, int64_t S, int64_t splits,
                             int64_t hd, unsigned* done, float* out) {
  if (!last_block_arrive(&done[g], unsigned(splits))) return;  // every split's partials visible
  const int nw = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int64_t ps = hd + 4, nd4 = hd / 4;  // a partial: acc [hd], max, sum (16-byte rows)
  for (int64_t hl = warp; hl < G; hl += nw) {
    const float* p = scratch + (g * G + hl) * S * ps;
    // The first kPre splits' float4 of dims 4 lane .. (c = 0 below), read with
    // the maxima and sums: one L2 round trip before the weighted sum, not two.
    float4 pre[kPre];
#pragma unroll
    for (int sp = 0; sp < kPre; ++sp)
      if (sp < splits && lane < nd4)
        pre[sp] = __ldcg(reinterpret_cast<const float4*>(p + sp * ps) + lane);
    float m[2], l[2], e[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t sp = lane + 32 * c;
      m[c] = sp < splits ? __ldcg(p + sp * ps + hd) : -FLT_MAX;
      l[c] = sp < splits ? __ldcg(p + sp * ps + hd + 1) : 0.0f;
    }
    float M = fmaxf(m[0], m[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll
    for (int c = 0; c < 2; ++c) e[c] = lane + 32 * c < splits ? expf(m[c] - M) : 0.0f;
    const float L = warp_sum(l[0] * e[0] + l[1] * e[1]);
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // dims 4 (lane + 32 c) .. + 3 (hd <= 256)
      const int64_t d4 = lane + 32 * c;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (c == 0) {
#pragma unroll
        for (int sp = 0; sp < kPre; ++sp) {
          if (sp >= splits) break;
          const float w = __shfl_sync(0xffffffffu, e[0], sp);
          if (d4 < nd4) {
            const float4 v = pre[sp];
            a.x += v.x * w, a.y += v.y * w, a.z += v.z * w, a.w += v.w * w;
          }
        }
      }
#pragma unroll 16
      for (int64_t sp = c == 0 ? kPre : 0; sp < splits; ++sp) {  // every lane shuffles
        const float w = __shfl_sync(0xffffffffu, sp < 32 ? e[0] : e[1], int(sp & 31));
        if (d4 < nd4) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(p + sp * ps) + d4);
          a.x += v.x * w, a.y += v.y * w, a.z += v.z * w, a.w += v.w * w;
        }
      }
      if (d4 < nd4)
        *reinterpret_cast<float4*>(out + (g * G + hl) * hd + 4 * d4) =
            make_float4(a.x / L, a.y / L, a.z / L, a.w / L);
    }
  }
  if (threadIdx.x == 0) done[g] = 0;
}

// Attention's input steps inside the decode kernel (DecodePrep), after
// grid_wait. decode_new_kv, by the block of the last split only, while the
// block's q rows are read (one round trip for both): this token's v row of its
// kv head to the cache, and its k and v rows to ktmp, the tile rows pr when pos
// falls in the first tile (pr >= 0). Then (a sync later) decode_prep: the
// group's q rows (in qs) and the k row are normalized and rotated, and the k
// row written to the cache. c: q_norm, k_norm [hd], cos, sin [hd / 2] in shared
// memory.
__device__ __forceinline__ void decode_new_kv(float* vc, int64_t pos, int64_t g, int hd,
                                              int64_t stride, int pr, const DecodePrep& p,
                                              float* ktmp, float* ks, float* vs, int ld) {
  float* krow = pr >= 0 ? ks + pr * ld : ktmp;
  for (int i = int(threadIdx.x); i < hd; i += int(blockDim.x)) {
    krow[i] = p.k_new[g * hd + i];
    const float vv = p.v_new[g * hd + i];
    if (pr >= 0) vs[pr * ld + i] = vv;
    vc[pos * stride + g * hd + i] = vv;
  }
}
__device__ void decode_prep(float* kc, int64_t pos, int64_t g, int hd, int64_t stride, int G,
                            bool last, int pr, const DecodePrep& p, const float* c, float* ktmp,
                            float* qs, float* ks, int ld) {
  float* krow = pr >= 0 ? ks + pr * ld : ktmp;
  const int nw = int(blockDim.x / 32), warp = int(threadIdx.x / 32);
  const float* qn = p.q_norm ? c : nullptr;
  const float* kn = p.k_norm ? c + hd : nullptr;
  for (int r = warp; r < G + (last ? 1 : 0); r += nw)
    norm_rope_row(r < G ? qs + r * hd : krow, r < G ? qn : kn, hd, p.eps, c + 2 * hd,
                  c + 2 * hd + hd / 2);
  __syncthreads();
  if (last) {
    for (int i = int(threadIdx.x); i < hd; i += int(blockDim.x))
      kc[pos * stride + g * hd + i] = krow[i];
    if (pr < 0) __syncthreads();  // a later tile of this block reads the row back
  }
}

// Grid: kv heads x S (>= the length's splits); block: 32 x min(G, 8) threads.
// Dynamic shared memory: K and V tiles [kTile, hd + 4], the group's q [G, hd]
// and (prep) q_norm, k_norm [hd], cos, sin [hd / 2], a k row [hd], then
// attend_tile8's scores and weights [8][kTile] and factors [8]. Before
// grid_wait the block reads what no kernel of this step writes: the position
// (copied before the graph), the norms, and its first tile's cache rows below
// pos (into registers), and computes the position's cos / sin. After it: the
// group's q rows; with prep.k_new the input steps (decode_prep); then the
// tiles, each next one in flight in registers while the warps attend to the
// current one; with more than one split the last block of each kv head merges
// (decode_merge). HD: head_dim at compile time (128), or 0 (hd). G8 (HD 128,
// HPW 1, 8 heads a group): attend_tile8 instead, each next tile read after the
// current one (its registers kept free: two blocks fit a multiprocessor).
template <int HPW, int HD, bool G8>
__global__ void __launch_bounds__(kMaxGroupWarps * 32, G8 ? 2 : 0)  // (0: no minimum)
    attn_decode_kernel(const float* q, float* k, float* v, int64_t first_pos, const int64_t* d_pos,
                       int64_t heads, int64_t kvh, int64_t hd_rt, float scale, float* out,
                       float* scratch, DecodePrep prep, unsigned* done) {
  const unsigned long long t_start = trace_clock();  // (the trace build's start of the block)
  extern __shared__ float4 smem4[];
  const int hd = HD ? HD : int(hd_rt);
  const int64_t len = (d_pos ? *d_pos : first_pos) + 1, pos = len - 1;
  int64_t tps = 0, splits = 0;
  decode_layout(len, tps, splits);
  const int64_t sp = blockIdx.y, S = gridDim.y, g = blockIdx.x;
  const int G = int(heads / kvh);
  const int nw = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int ld = hd + 4, nd4 = hd / 4;
  const int64_t stride = kvh * hd;
  float* ks = reinterpret_cast<float*>(smem4);
  float* vs = ks + kTile * ld;
  float* qs = vs + kTile * ld;
  float* cs = qs + G * hd;  // q_norm [hd], k_norm [hd], cos [hd / 2], sin [hd / 2], ktmp [hd]
  const int64_t pb = sp * tps * kTile, pe = pb + tps * kTile < len ? pb + tps * kTile : len;
  const int cnt0 = pe - pb < kTile ? int(pe - pb) : kTile;
  const bool live = sp < splits, fused = prep.k_new != nullptr;
  const bool last = fused && live && sp == splits - 1;
  const int pr = last && pos < pb + cnt0 ? int(pos - pb) : -1;  // pos's row in the first tile
  // HD = 0 (head_dim not compiled in) always takes load_tile: TileRegs held
  // across attend_tile would cost it a block per SM in registers.
  const bool one_round = HD != 0 && kTile * nd4 <= kPer * int(blockDim.x);
  TileRegs t;
  const int c0 = fused && pr >= 0 ? pr : cnt0;  // the first tile's rows read before grid_wait
  if (live && fused) {                          // rows below pos only: written by earlier steps
    if (one_round)
      t.fetch(k, v, pb, c0, stride, g * hd, nd4, 0);
    else
      load_tile(k, v, pb, c0, stride, g * hd, nd4, ld, ks, vs);
    for (int i = int(threadIdx.x); i < 2 * hd; i += int(blockDim.x))
      cs[i] = i < hd ? (prep.q_norm ? prep.q_norm[i] : 0.0f)
                     : (prep.k_norm ? prep.k_norm[i - hd] : 0.0f);
    for (int i = int(threadIdx.x); i < hd / 2; i += int(blockDim.x)) {
      const float angle = prep.inv_freq[i] * float(pos);
      cs[2 * hd + i] = float(cos(double(angle)));
      cs[2 * hd + hd / 2 + i] = float(sin(double(angle)));
    }
  }
  const unsigned ts = grid_wait<5>(t_start);  // trace marks: q, prep, tiles, partials, merge
  grid_launch_dependents();
  if (!live) return;
  for (int i = int(threadIdx.x); i < G * hd; i += int(blockDim.x)) qs[i] = q[g * G * hd + i];
  if (fused) {
    if (last) decode_new_kv(v, pos, g, hd, stride, pr, prep, cs + 3 * hd, ks, vs, ld);
    if (one_round) t.put(ks, vs, c0, nd4, ld, 0);  // (rows below pr: not the new ones)
    __syncthreads();  // cs, qs, the new k / v rows and the tile written
    trace_mark(ts, 1);
    decode_prep(k, pos, g, hd, stride, G, last, pr, prep, cs, cs + 3 * hd, qs, ks, ld);
  } else {
    load_tile(k, v, pb, cnt0, stride, g * hd, nd4, ld, ks, vs);
  }
  trace_mark(ts, 2);
  float m[HPW], l[HPW];
  float4 acc[HPW][2];  // dims 4 (lane + 32 c) .. + 3, c < 2 (hd <= 256)
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    m[hh] = -FLT_MAX, l[hh] = 0.0f;
    acc[hh][0] = acc[hh][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  // Groups of 8 heads at head_dim 128 read each tile once (attend_tile8):
  // its scores, weights [8][kTile] and factors [8] after cs.
  float* ss8 = cs + 4 * hd;
  float4 acc8[2] = {};  // G8: the warp's sums (attend_tile8; launch_decode picks G8)
  for (int64_t p0 = pb; p0 < pe; p0 += kTile) {
    const int cnt = pe - p0 < kTile ? int(pe - p0) : kTile;
    const int64_t p1 = p0 + kTile;
    const int cnt1 = pe - p1 < kTile ? int(pe - p1) : kTile;
    // the next tile in flight in registers (G8: read after this one, its registers kept free)
    if (p1 < pe && one_round && !G8) t.fetch(k, v, p1, cnt1, stride, g * hd, nd4, 0);
    __syncthreads();  // the tile (and qs) written
    if constexpr (G8) {
      attend_tile8(qs, ks, vs, ld, cnt, scale, ss8, ss8 + 8 * kTile, ss8 + 16 * kTile, m[0], l[0],
                   acc8);
    } else {
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) {
        const int hl = warp + hh * nw;
        if (hl >= G) break;
        attend_tile<HD>(qs + hl * hd, ks, vs, ld, hd, cnt, scale, m[hh], l[hh], acc[hh]);
      }
    }
    if (p1 < pe) {
      __syncthreads();  // the tile is consumed
      if (one_round && !G8)
        t.put(ks, vs, cnt1, nd4, ld, 0);
      else
        load_tile(k, v, p1, cnt1, stride, g * hd, nd4, ld, ks, vs);
    }
  }
  if constexpr (G8)
    acc[0][0] = gather_acc8(acc8, reinterpret_cast<float4*>(ks));  // head warp's sums
  trace_mark(ts, 3);
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const int hl = warp + hh * nw;
    if (hl >= G) break;
    const int64_t h = g * G + hl;
    float* part = scratch + (h * S + sp) * (hd + 4);  // acc [hd], max, sum
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int d4 = lane + 32 * c;
      if (d4 >= nd4) continue;
      float4 a = acc[hh][c];
      if (splits == 1) a.x /= l[hh], a.y /= l[hh], a.z /= l[hh], a.w /= l[hh];
      *reinterpret_cast<float4*>((splits == 1 ? out + h * hd : part) + 4 * d4) = a;
    }
    if (splits > 1 && lane == 0) part[hd] = m[hh], part[hd + 1] = l[hh];
  }
  trace_mark(ts, 4);
  if (splits > 1) decode_merge(scratch, g, G, S, splits, hd, done, out);
  trace_mark(ts, 5);
}

bool decode_applies(int64_t n_q, int64_t heads, int64_t kvh, int64_t hd) {
  return n_q == 1 && hd % 4 == 0 && hd <= 256 && heads / kvh <= 4 * kMaxGroupWarps;
}

int64_t decode_grid_splits(int64_t positions) {
  const int64_t tiles = (positions + kTile - 1) / kTile;
  return tiles < kMaxSplitsD ? (tiles > 0 ? tiles : 1) : kMaxSplitsD;
}

template <int HPW, int HD>
void launch_decode(const float* q, float* k, float* v, int64_t first_pos, const int64_t* d_pos,
                   int64_t S, int64_t heads, int64_t kvh, int64_t hd, float scale, float* out,
                   float* scratch, const DecodePrep& prep, unsigned* done, cudaStream_t s) {
  const int64_t G = heads / kvh;
  const int warps = int(G < kMaxGroupWarps ? G : kMaxGroupWarps);
  // groups of 8 heads at head_dim 128: attend_tile8, with its scores, weights
  // [8][kTile] and factors [8] in shared memory
  auto kern = attn_decode_kernel<HPW, HD, false>;
  int64_t tile8 = 0;
  if constexpr (HD == 128 && HPW == 1)
    if (G == 8) kern = attn_decode_kernel<HPW, HD, true>, tile8 = 16 * kTile + 8;
  // the tiles, q, cs (4 hd), then attend_tile8's
  const size_t smem = size_t(2 * kTile * (hd + 4) + G * hd + 4 * hd + tile8) * sizeof(float);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const dim3 grid{unsigned(kvh), unsigned(S)};
  launch(kern, grid, unsigned(32 * warps), smem, s, q, k, v, first_pos, d_pos, heads, kvh, hd,
         scale, out, scratch, prep, done);
}
}  // namespace

int64_t attention_scratch_floats(int64_t n_q, int64_t positions, int64_t heads, int64_t hd) {
  const int64_t s = splits_for(n_q, positions);
  const int64_t old = s > 1 ? heads * s * (hd + 2) : 0;
  const int64_t dec = n_q == 1 ? heads * decode_grid_splits(positions) * (hd + 4) : 0;
  return old > dec ? old : dec;
}

namespace {

template <int HD, typename... A>
void decode_hd(int64_t hpw, A&&... args) {
  if (hpw == 1) return launch_decode<1, HD>(std::forward<A>(args)...);
  if (hpw == 2) return launch_decode<2, HD>(std::forward<A>(args)...);
  return launch_decode<4, HD>(std::forward<A>(args)...);
}

// hd picks the kernel; args: launch_decode's.
template <typename... A>
void decode_hpw(int64_t hpw, int64_t hd, A&&... args) {
  if (hd == 128) return decode_hd<128>(hpw, std::forward<A>(args)...);
  return decode_hd<0>(hpw, std::forward<A>(args)...);
}

}  // namespace

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
               int64_t hd, float scale, float* out, float* scratch, unsigned* done,
               cudaStream_t s) {
  if (n_q <= 0) return;
  const int64_t len = d_pos ? max_positions : first_pos + n_q;  // positions the grid covers
  if (decode_applies(n_q, heads, kv_heads, hd)) {
    const int64_t S = decode_grid_splits(len),
                  hpw = (heads / kv_heads + kMaxGroupWarps - 1) / kMaxGroupWarps;
    // Without prep.k_new the kernel writes no cache row: k and v are only read.
    return decode_hpw(hpw, hd, q, const_cast<float*>(k), const_cast<float*>(v), first_pos, d_pos, S,
                      heads, kv_heads, hd, scale, out, scratch, DecodePrep{}, done, s);
  }
  const int64_t splits = splits_for(n_q, len);
  const int64_t split_len = (len + splits - 1) / splits;
  const dim3 grid{unsigned(heads), unsigned(splits), unsigned(n_q)};
  attn_kernel<<<grid, kWarpsA * 32, 0, s>>>(q, k, v, first_pos, d_pos, heads, kv_heads, hd, scale,
                                            out, scratch, split_len);
  if (splits > 1) attn_combine<<<unsigned(heads), 128, 0, s>>>(scratch, splits, hd, out);
}

bool attention_decode(const float* q, float* k_cache, float* v_cache, int64_t pos,
                      const int64_t* d_pos, int64_t max_positions, int64_t heads, int64_t kv_heads,
                      int64_t hd, float scale, const DecodePrep& prep, float* out, float* scratch,
                      unsigned* done, cudaStream_t s) {
  if (!decode_applies(1, heads, kv_heads, hd) || !prep.k_new || !prep.v_new || !prep.inv_freq)
    return false;
  const int64_t len = d_pos ? max_positions : pos + 1;
  const int64_t S = decode_grid_splits(len),
                hpw = (heads / kv_heads + kMaxGroupWarps - 1) / kMaxGroupWarps;
  decode_hpw(hpw, hd, q, k_cache, v_cache, pos, d_pos, S, heads, kv_heads, hd, scale, out, scratch,
             prep, done, s);
  return true;
}

}  // namespace moetier::cuda
