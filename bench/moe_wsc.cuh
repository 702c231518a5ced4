// A probe copy of decode_q8.cu's gate/up kernel (moe_gate_up_q8_kernel<8>)
// whose e8m0 scales are read in word layout, for moe_probe only. Stop 40's ncu
// put 56% of gate/up's stall samples on the permutes that join a lane's 4
// scale bytes of a chunk (4 byte loads from 4 rows, one chunk ahead): a chain
// of dependent DRAM round trips, one a chunk, that staging the codes early
// does not shorten. In word layout the scales of rows 4g .. 4g + 3 at chunk i
// are the 4 bytes of word [g][i] (byte r: row 4g + r; `repack_scales_words`),
// so a warp's 4 rows of one chunk are one 32-bit load, coalesced over the
// lanes. ALL: every one of a lane's C chunks' words is loaded before the
// first dot (2C registers); else one chunk ahead, as the shipped kernel.
// Keep the rest in step with decode_q8.cu by hand.
#pragma once

namespace moetier::cuda {

// The probe's timeline (TR kernels): %globaltimer of each block's thread 0 at
// entry, once its first passes and scale words landed (it waits for them
// there: TR changes the kernel), after its wait, at its end; [block][4].
__device__ unsigned long long* g_wsc_trace;
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// dst [rows / 4][nb] words from src [rows][nb] bytes (rows a multiple of 4).
__global__ void repack_scales_words(const uint8_t* src, int64_t rows, int64_t nb, uint32_t* dst) {
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < rows / 4 * nb;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = w / nb, i = w % nb;
    uint32_t v = 0;
    for (int r = 0; r < 4; ++r) v |= uint32_t(src[(4 * g + r) * nb + i]) << (8 * r);
    dst[w] = v;
  }
}

// Grid (inter / 32, k), 256 threads, kGateSmem of dynamic shared memory, as
// moe_gate_up_q8_kernel<8>; table's s[0], s[1] in word layout; hidden / 32 <= 32 C.
template <int C, bool ALL, bool TR = false>
__global__ void __launch_bounds__(256, 3)
    gate_up_wsc(const ExpertPtrs* table, const int32_t* ids, const float* weights, const Q8x* xq,
                const float* xd, int64_t hidden, int64_t inter, Q8x* hq, float* hd, int early,
                const int32_t*, int) {
  constexpr int NW = 8, R = 4, R2 = 8;
  extern __shared__ uint4 stage[];  // [4][NW][R][32]
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), slot = int(blockIdx.y);
  const int64_t nb = hidden / 32, row0 = int64_t(blockIdx.x) * 32 + warp * R;
  const int nbi = int(nb);
  const uint4 *gw = nullptr, *uw = nullptr;
  const uint32_t *gs = nullptr, *us = nullptr;  // this warp's row group's words
  uint32_t sw[2][C] = {};                       // [gate, up][chunk c]: 4 rows' scales
  auto at = [&](int b, int r) { return stage + ((b * NW + warp) * R + r) * 32 + lane; };
  auto issue = [&](int i, int b, int h) {
    asm("" : "+r"(i));
    const uint4* w = h == 0 ? gw : uw;
#pragma unroll
    for (int r = 0; r < R; ++r) cp_async16(at(b, r), w + r * nbi + i);
    cp_async_commit();
  };
  auto words = [&](int c) {
    if (lane + 32 * c < nbi)
      sw[0][c] = __ldg(gs + lane + 32 * c), sw[1][c] = __ldg(us + lane + 32 * c);
  };
  auto prep = [&] {
    const ExpertPtrs& ex = table[__ldcg(ids + slot)];
    gw = static_cast<const uint4*>(ex.w[0]) + row0 * nb;
    uw = static_cast<const uint4*>(ex.w[1]) + row0 * nb;
    gs = reinterpret_cast<const uint32_t*>(ex.s[0]) + row0 / 4 * nb;
    us = reinterpret_cast<const uint32_t*>(ex.s[1]) + row0 / 4 * nb;
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (lane + 32 * c < nbi) issue(lane + 32 * c, 2 * c + h, h);
#pragma unroll
    for (int c = 0; c < (ALL ? C : 1); ++c) words(c);
  };
  const int64_t blk = blockIdx.y * int64_t(gridDim.x) + blockIdx.x;
  unsigned long long* tr = TR && threadIdx.x == 0 ? g_wsc_trace + 4 * blk : nullptr;
  if (tr) tr[0] = gtimer();
  if (early) prep();
  if (tr && early) {
    cp_async_wait<0>();
    tr[1] = gtimer() + (sw[0][C - 1] == 0x12345u ? 1 : 0);
  }
  grid_wait();
  grid_launch_dependents();
  if (tr) tr[2] = gtimer();
  if (!early) prep();
  float acc[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int i = lane + 32 * c;
    if (i >= nbi) break;
    const bool more = i + 32 < nbi, refill = i + 64 < nbi;
    if (!ALL && c + 1 < C) words(c + 1);
    int4 xr[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) xr[j] = __ldg(reinterpret_cast<const int4*>(xq + i) + j);
    const float d = __ldg(xd + i);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cp_async_wait_upto(1 - h + (more ? 2 : 0) + (refill ? h : 0));
      const int b = 2 * (c & 1) + h;
#pragma unroll
      for (int r = 0; r < R; ++r)
        acc[h * R + r] +=
            float(dot_chunk(*at(b, r), xr)) * (e8m0_half((sw[h][c] >> (8 * r)) & 0xffu) * d);
      if (refill) issue(i + 64, b, h);
    }
  }
  const float g = warp_rows_sum<R2>(acc);
  const float u = __shfl_down_sync(0xffffffffu, g, R);
  if (lane < R) hs[warp * R + lane] = g / (1.0f + expf(-g)) * u;
  __syncthreads();
  if (warp == 0) {
    const int64_t b = int64_t(slot) * (inter / 32) + blockIdx.x;
    const float dq = quantize_warp(hs[lane], hq + b);
    if (lane == 0) hd[b] = dq * __ldcg(weights + slot);
  }
  if (tr) tr[3] = gtimer();
}

}  // namespace moetier::cuda
