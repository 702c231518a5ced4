// The resident MoE decode step with int8 activations for MXFP4 experts (the
// q8 mode, as on the CPU: kernels/cpu/q8.h): the activations are cut into
// blocks of 32, each quantized to int8 with one f32 scale d = amax / 127
// (q = round-half-even(x * 127 / amax), a non-finite block gives d = NaN),
// and dotted with the weights' e2m1 codes as integers (2 x e2m1 in int8,
// four products per dp4a), each block's integer sum scaled by d times half
// the block's e8m0 scale. The CPU computes the same integer sums; the two
// differ only in the f32 order in which the scaled block sums are added.
//
// gate/up: a block owns 32 rows of one selected expert (16 warps x 2 rows),
// quantizes x into shared memory first, and quantizes its 32 outputs
// h = silu(gate x) * up x as one q8 block (hq, hd). down: a warp owns 1 row
// of the output and runs one dot product over the (expert, chunk) items of
// the k experts in ascending id order, weighted by the routing weights.
#include <cfloat>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

// 16 x 2 = 32 rows of h per block, at most 64 registers (two blocks per SM;
// ptxas spills 12 bytes): the SM holds 32 warps where 8 x 4 rows left it 11.
// The op time did not change with it (17.27 against 17.25 us, cuda_ops_bench).
constexpr int kGateWarps = 16, kGateRows = 2;
constexpr int kDownWarps = 4, kDownRows = 1;

// The 4 codes in the low 16 bits of v (nibble order) -> 4 int8 values 2 e2m1(code).
__device__ __forceinline__ int e2m1x2_i8(uint32_t v) {
  const uint32_t pos0 = 0x03020100u, pos1 = 0x0c080604u;  // codes 0..7: 0 1 2 3 4 6 8 12
  const uint32_t neg0 = 0xfdfeff00u, neg1 = 0xf4f8fafcu;  // codes 8..15: 0 -1 ... -12
  const uint32_t idx = v & 0x7777u;
  const uint32_t a = __byte_perm(pos0, pos1, idx), b = __byte_perm(neg0, neg1, idx);
  return int(__byte_perm(a, b, 0x3210u | ((v & 0x8888u) >> 1)));
}

// Integer dot of one MXFP4 chunk (16 bytes: 32 columns) with 32 int8 activations.
__device__ __forceinline__ int chunk_dot_i8(const uint4& w, const int4& x0, const int4& x1) {
  int s = 0;
  s = __dp4a(e2m1x2_i8(w.x), x0.x, s);
  s = __dp4a(e2m1x2_i8(w.x >> 16), x0.y, s);
  s = __dp4a(e2m1x2_i8(w.y), x0.z, s);
  s = __dp4a(e2m1x2_i8(w.y >> 16), x0.w, s);
  s = __dp4a(e2m1x2_i8(w.z), x1.x, s);
  s = __dp4a(e2m1x2_i8(w.z >> 16), x1.y, s);
  s = __dp4a(e2m1x2_i8(w.w), x1.z, s);
  s = __dp4a(e2m1x2_i8(w.w >> 16), x1.w, s);
  return s;
}

// Half the e8m0 scale (the weights hold 2 e2m1): 2^(e - 128); 0xff is NaN.
__device__ __forceinline__ float e8m0_half(uint32_t e) { return e8m0f(e) * 0.5f; }

// One q8 block from the 32 lanes' values: lane j stores q[j]; lane 0 returns d.
__device__ __forceinline__ float quantize_lane(float v, int8_t* q) {
  float amax = fabsf(v);
  bool finite = isfinite(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __shfl_xor_sync(0xffffffffu, int(finite), o) && finite;
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  q[threadIdx.x & 31] = finite ? int8_t(__float2int_rn(v * id)) : int8_t(0);
  return finite ? amax / 127.0f : __int_as_float(0x7fc00000);
}

// Grid: (inter / 32, k). Dynamic shared memory: xq [hidden] int8, xd [hidden / 32].
__global__ void __launch_bounds__(kGateWarps * 32, 2)
    moe_gate_up_q8_kernel(const ExpertPtrs* table, const int32_t* ids, const float* x,
                          int64_t hidden, int64_t inter, int8_t* hq, float* hd, int table_len) {
  extern __shared__ int4 smem[];
  auto* xq = reinterpret_cast<int8_t*>(smem);
  auto* xd = reinterpret_cast<float*>(xq + hidden);
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int slot = int(blockIdx.y);
  if (blockIdx.x == 0) prefetch_l2(table, int64_t(table_len) * int64_t(sizeof(ExpertPtrs)));
  grid_wait();  // ids and x come from earlier kernels
  grid_launch_dependents();
  const ExpertPtrs& ex = table[ids[slot]];  // loads in flight while x is quantized
  const auto* gw = static_cast<const uint4*>(ex.w[0]);
  const auto* uw = static_cast<const uint4*>(ex.w[1]);
  const uint8_t* gs = ex.s[0];
  const uint8_t* us = ex.s[1];
  const int64_t nb = hidden / 32;
  const int64_t row0 = int64_t(blockIdx.x) * 32 + warp * kGateRows;
  constexpr int R = kGateRows;
  uint4 q[2][2 * R];  // the weight chunks lane, lane + 32 of a pass of 64
  uint32_t s[2][2 * R];
  auto load = [&](int64_t i0) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t i = i0 + lane + 32 * u;
      if (i >= nb) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        q[u][r] = __ldg(gw + (row0 + r) * nb + i), s[u][r] = __ldg(gs + (row0 + r) * nb + i);
        q[u][R + r] = __ldg(uw + (row0 + r) * nb + i);
        s[u][R + r] = __ldg(us + (row0 + r) * nb + i);
      }
    }
  };
  load(0);  // in flight while x is quantized
#pragma unroll 4
  for (int64_t b = warp; b < nb; b += kGateWarps) {
    const float d = quantize_lane(x[32 * b + lane], xq + 32 * b);
    if (lane == 0) xd[b] = d;
  }
  __syncthreads();
  float acc[2 * R];
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = 0.0f;
  for (int64_t i0 = 0; i0 < nb; i0 += 64) {  // two chunks per lane per pass
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t i = i0 + lane + 32 * u;
      if (i >= nb) break;
      const int4 x0 = reinterpret_cast<const int4*>(xq)[2 * i];
      const int4 x1 = reinterpret_cast<const int4*>(xq)[2 * i + 1];
      const float d = xd[i];
#pragma unroll
      for (int r = 0; r < 2 * R; ++r)
        acc[r] += float(chunk_dot_i8(q[u][r], x0, x1)) * (e8m0_half(s[u][r]) * d);
    }
    if (i0 + 64 < nb) load(i0 + 64);
  }
  const float g = warp_rows_sum<2 * R>(acc);            // lane r: gate row r; lane R + r: up
  const float u = __shfl_down_sync(0xffffffffu, g, R);  // lane r: up row r
  if (lane < R) hs[warp * R + lane] = g / (1.0f + expf(-g)) * u;
  __syncthreads();
  if (warp == 0) {
    const float d = quantize_lane(hs[lane], hq + int64_t(slot) * inter + blockIdx.x * 32);
    if (lane == 0) hd[int64_t(slot) * (inter / 32) + blockIdx.x] = d;
  }
}

// out[row] = sum over the k experts in ascending id order of
// weights[j] * (down_{ids[j]} h[j])[row], h[j] as q8 blocks (hq, hd).
template <int U>
__global__ void __launch_bounds__(kDownWarps * 32)
    moe_down_q8_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                       const int8_t* hq, const float* hd, int64_t hidden, int64_t inter, float* out,
                       int table_len) {
  __shared__ RankedExperts rk;
  if (blockIdx.x == 0) prefetch_l2(table, int64_t(table_len) * int64_t(sizeof(ExpertPtrs)));
  grid_wait();  // ids, weights and h come from earlier kernels
  grid_launch_dependents();
  rank_experts(table, ids, weights, k, rk);
  constexpr int R = kDownRows;
  const int lane = int(threadIdx.x & 31);
  const int64_t row0 = (int64_t(blockIdx.x) * kDownWarps + threadIdx.x / 32) * R;
  if (row0 >= hidden) return;
  const int64_t nch = inter / 32, items = int64_t(k) * nch;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t base = 0; base < items; base += 32 * U) {
    uint4 q[U][R];
    uint32_t s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t it = base + lane + 32 * u;
      if (it >= items) break;
      const int e = int(it / nch);
      const int64_t i = it - e * nch;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < hidden)
          q[u][r] = __ldg(reinterpret_cast<const uint4*>(rk.w[e]) + (row0 + r) * nch + i),
          s[u][r] = __ldg(rk.s[e] + (row0 + r) * nch + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t it = base + lane + 32 * u;
      if (it >= items) break;
      const int e = int(it / nch);
      const int64_t i = it - e * nch;
      const int4* hx = reinterpret_cast<const int4*>(hq + int64_t(rk.slot[e]) * inter) + 2 * i;
      const int4 x0 = hx[0], x1 = hx[1];
      const float d = hd[int64_t(rk.slot[e]) * nch + i];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < hidden)
          acc[r] +=
              rk.weight[e] * (float(chunk_dot_i8(q[u][r], x0, x1)) * (e8m0_half(s[u][r]) * d));
    }
  }
  const float t = warp_rows_sum<R>(acc);
  if (lane < R && row0 + lane < hidden) out[row0 + lane] = t;
}

template <int U>
void down_q8(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
             const int8_t* hq, const float* hd, int64_t hidden, int64_t inter, float* out,
             int table_len, cudaStream_t s) {
  const unsigned g = unsigned((hidden + kDownWarps * kDownRows - 1) / (kDownWarps * kDownRows));
  launch(moe_down_q8_kernel<U>, g, kDownWarps * 32, 0, s, table, ids, weights, k, hq, hd, hidden,
         inter, out, table_len);
}

}  // namespace

size_t moe_q8_scratch_bytes(int64_t k, int64_t inter) {
  return size_t(k * inter) + size_t(k * (inter / 32)) * sizeof(float) + 16;
}

bool moe_decode_q8(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                   const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                   void* scratch, float* out, int table_len, cudaStream_t s) {
  if (!vec || enc != WeightEncoding::MXFP4 || hidden % 32 || inter % 32 || k < 1 || k > 32 ||
      hidden > 16384)
    return false;
  auto* hq = static_cast<int8_t*>(scratch);                              // [k, inter] int8
  auto* hd = reinterpret_cast<float*>(hq + (k * inter + 15) / 16 * 16);  // [k, inter / 32]
  const size_t smem = size_t(hidden) + size_t(hidden / 32) * sizeof(float);
  const dim3 g1(unsigned(inter / 32), unsigned(k));
  launch(moe_gate_up_q8_kernel, g1, kGateWarps * 32, smem, s, table, ids, x, hidden, inter, hq, hd,
         table_len);
  const int64_t per_lane = (int64_t(k) * (inter / 32) + 31) / 32;
  if (per_lane <= 2)
    down_q8<2>(table, ids, weights, k, hq, hd, hidden, inter, out, table_len, s);
  else if (per_lane <= 4)
    down_q8<4>(table, ids, weights, k, hq, hd, hidden, inter, out, table_len, s);
  else
    down_q8<8>(table, ids, weights, k, hq, hd, hidden, inter, out, table_len, s);
  return true;
}

}  // namespace moetier::cuda
