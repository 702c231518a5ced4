// Diagnostic copies of decode_q8.cu's gate/up kernel (8 warps, as shipped at
// f078181: the two-pass gate/up and the pos-minus-mag dot)
// and split down kernel (4 rows), for moe_probe only: where the MoE step's
// time goes. MODE 0: the kernel as it is (moe_probe times the shipped one);
// 1: the weight loads, no dot (the words xor-ed); 2: as 1 without the scale
// loads; 3: the dot, no weight loads (on whatever shared memory and registers
// hold); 4: neither (the kernel's frame: ids, table, waits, h's write). The
// outputs of modes 1-4 are meaningless. Keep them in step with decode_q8.cu
// by hand. The figures of bench/results/h200-moe-step-diagnosis.json came
// from the copies as at 5481ac7 (dc8d8b9).
#pragma once

namespace moetier::cuda {

template <int MODE>
__global__ void __launch_bounds__(256, 3)
    diag_gate_up(const ExpertPtrs* table, const int32_t* ids, const float* weights, const Q8x* xq,
                 const float* xd, int64_t hidden, int64_t inter, Q8x* hq, float* hd, int early,
                 const int32_t*, int) {
  constexpr int NW = 8, R = 4, R2 = 8;
  extern __shared__ uint4 stage[];  // [4][NW][R][32]
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), slot = int(blockIdx.y);
  const int64_t nb = hidden / 32, row0 = int64_t(blockIdx.x) * 32 + warp * R;
  const int nbi = int(nb);
  const uint4 *gw = nullptr, *uw = nullptr;
  const uint8_t *gs = nullptr, *us = nullptr;
  uint32_t sc[2] = {0x7f7f7f7fu, 0x7f7f7f7fu}, sn[2] = {0x7f7f7f7fu, 0x7f7f7f7fu};
  auto at = [&](int b, int r) { return stage + ((b * NW + warp) * R + r) * 32 + lane; };
  auto issue = [&](int i, int b, int h) {
    asm("" : "+r"(i));
    const uint4* w = h == 0 ? gw : uw;
    if (MODE != 3) {
#pragma unroll
      for (int r = 0; r < R; ++r) cp_async16(at(b, r), w + r * nbi + i);
    }
    cp_async_commit();
  };
  auto scales = [&](int i) {
    if (MODE == 0 || MODE == 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = (h == 0 ? gs : us) + i;
        sn[h] = 0;
#pragma unroll
        for (int r = 0; r < R; ++r) sn[h] |= uint32_t(__ldg(p + r * nbi)) << (8 * r);
      }
    }
  };
  auto prep = [&] {
    const ExpertPtrs& ex = table[__ldcg(ids + slot)];
    gw = static_cast<const uint4*>(ex.w[0]) + row0 * nb;
    uw = static_cast<const uint4*>(ex.w[1]) + row0 * nb;
    gs = ex.s[0] + row0 * nb, us = ex.s[1] + row0 * nb;
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (MODE != 4 && lane + 32 * c < nbi) issue(lane + 32 * c, 2 * c + h, h);
    if (MODE != 4 && lane < nbi) scales(lane), sc[0] = sn[0], sc[1] = sn[1];
  };
  if (early) prep();
  grid_wait();
  grid_launch_dependents();
  if (!early) prep();
  float acc[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r) acc[r] = 0.0f;
  int c = 0;
#pragma unroll 1
  for (int i = lane; MODE != 4 && i < nbi; i += 32, ++c) {
    const bool more = i + 32 < nbi, refill = i + 64 < nbi;
    if (more) scales(i + 32);
    int4 xr[2] = {};
    float d = 0.0f;
    if (MODE != 1 && MODE != 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) xr[j] = __ldg(reinterpret_cast<const int4*>(xq + i) + j);
      d = __ldg(xd + i);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cp_async_wait_upto(1 - h + (more ? 2 : 0) + (refill ? h : 0));
      const int b = 2 * (c & 1) + h;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 w = *at(b, r);
        if (MODE == 1 || MODE == 2)
          acc[h * R + r] += float((w.x ^ w.y ^ w.z ^ w.w ^ sc[h]) & 0xffu);
        else
          acc[h * R + r] += float(dot_chunk(w, xr)) * (e8m0_half((sc[h] >> (8 * r)) & 0xffu) * d);
      }
      if (refill) issue(i + 64, b, h);
    }
    sc[0] = sn[0], sc[1] = sn[1];
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
}

template <int U, int MODE>
__global__ void __launch_bounds__(128)
    diag_down(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
              const Q8x* hq, const float* hd, int64_t hidden, int64_t inter, float* out,
              int accumulate, int early) {
  constexpr int NT = 128, NW = 4, R = 4;
  __shared__ RankedExperts rk;
  __shared__ float red[R][NW];
  const int t = int(threadIdx.x), lane = t & 31, warp = t / 32;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int nch = int(inter / 32), items = k * nch;
  const int step_e = NT / nch, step_i = NT % nch;
  int e = t / nch, i = t % nch;
  uint4 q[U][R];
  uint32_t s[U][R];
  int ie[U], ii[U];
  auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ie[u] = e, ii[u] = i;
      if (base + t + NT * u < items)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t row = row0 + r < hidden ? row0 + r : row0;
          if (MODE == 3 || MODE == 4) {
            q[u][r] = make_uint4(uint32_t(t * 77 + r), uint32_t(i), uint32_t(e), uint32_t(u));
            s[u][r] = 120u + uint32_t(r);
          } else {
            q[u][r] = __ldg(reinterpret_cast<const uint4*>(rk.w[e]) + row * nch + i);
            s[u][r] = __ldg(rk.s[e] + row * nch + i);
          }
        }
      i += step_i, e += step_e;
      while (i >= nch) i -= nch, ++e;
    }
  };
  if (early) rank_experts(table, ids, weights, k, rk), load(0);
  grid_wait();
  grid_launch_dependents();
  if (!early) rank_experts(table, ids, weights, k, rk), load(0);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int base = 0; MODE != 4 && base < items; base += NT * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + t + NT * u >= items) break;
      const int64_t hb = int64_t(rk.slot[ie[u]]) * nch + ii[u];
      if (MODE == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r] += float((q[u][r].x ^ q[u][r].y ^ q[u][r].z ^ q[u][r].w ^ s[u][r]) & 0xffu);
      } else {
        const float d = __ldg(hd + hb);
        int is[R];
        dot_rows<R>(q[u], reinterpret_cast<const int2*>(hq + hb), is);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += float(is[r]) * (e8m0_half(s[u][r]) * d);
      }
    }
    if (base + NT * U < items) load(base + NT * U);
  }
  const float w = warp_rows_sum<R>(acc);
  if (lane < R) red[lane][warp] = w;
  __syncthreads();
  if (t < R && row0 + t < hidden) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NW; ++j) sum += red[t][j];
    out[row0 + t] = accumulate ? out[row0 + t] + sum : sum;
  }
}

}  // namespace moetier::cuda
