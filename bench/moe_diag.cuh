// Diagnostic copies of decode_q8.cu's gate/up kernel (8 warps, as shipped at
// 59cf098: x's q8 block in registers once a pass) and split down kernel (4
// rows), for moe_probe only: where the MoE step's time goes, and candidates.
// MODE 0: the kernel as it is (moe_probe times the shipped one; mode 0 here is
// the base of the candidates below, and of the dot in mode 3); 1: the weight loads, no dot (the
// words xor-ed); 2: as 1 without the scale loads; 3: the dot, no weight loads (on whatever shared
// memory and registers hold); 4: neither (the kernel's frame: ids, table, waits, h's write). The
// outputs of modes 1-4 are meaningless. Gate/up candidates (mode 0, not in decode_q8.cu): MINB
// blocks an SM in the launch bounds (2: up to 128 registers, perhaps room to keep the magnitude
// table in a register, which the SASS rematerializes at 3) and SR, the dot by
// sign replication (1: word_dot_sr; 2: word_dot_pm; 3: word_dot_pm with the table read from
// memory) and NP, 2 passes a chunk of 4 rows each, 4 in flight. Down candidate: PM (1:
// word_dot_pm; 2: with the table read from memory). The figures of
// bench/results/h200-moe-step-diagnosis.json came from the copies as at
// 5481ac7 (dc8d8b9), before x was held in registers.
#pragma once

namespace moetier::cuda {

// A permute whose selector nibble has bit 3 set replicates the chosen byte's
// sign bit, and the e2m1 magnitudes are all below 128, so prmt(table, code)
// is the magnitude of a positive code and 0 of a negative one, prmt(table,
// code ^ 8) the reverse: dp4a of the first with x's codes plus dp4a of the
// second with their negations is word_dot's signed dot, with no selector to
// build (one xor and two shifts a word instead of six).
__device__ __forceinline__ int word_dot_sr(uint32_t w, int2 p, int2 n, int s) {
  constexpr uint32_t kMag0 = 0x03020100u, kMag1 = 0x0c080604u;
  const uint32_t x = w ^ 0x88888888u;
  s = __dp4a(prmt(kMag0, kMag1, w), p.x, s);
  s = __dp4a(prmt(kMag0, kMag1, x), n.x, s);
  s = __dp4a(prmt(kMag0, kMag1, w >> 16), p.y, s);
  return __dp4a(prmt(kMag0, kMag1, x >> 16), n.y, s);
}
// The dot without x's negations: with pos = prmt(table, code) (the magnitude
// of a positive code, 0 of a negative one, by sign replication as above) and
// mag = prmt(table, code & 7), the signed dot is 2 pos.x - mag.x. Per word 4
// permutes, one and, two shifts (7 ALU-pipe instructions, against 10 for
// word_dot) and 4 dp4a (FMA pipe). s.x sums pos.x, s.y mag.x.
// The magnitude table in memory: read into registers, which ptxas cannot
// rematerialize from a uniform register before each permute (SR 3, PM 2).
__device__ uint32_t g_mag_table[2] = {0x03020100u, 0x0c080604u};
__device__ __forceinline__ int2 word_dot_pm(uint32_t w, int2 p, int2 s,
                                            uint32_t kMag0 = 0x03020100u,
                                            uint32_t kMag1 = 0x0c080604u) {
  const uint32_t m = w & 0x77777777u;
  s.x = __dp4a(prmt(kMag0, kMag1, w), p.x, s.x);
  s.y = __dp4a(prmt(kMag0, kMag1, m), p.x, s.y);
  s.x = __dp4a(prmt(kMag0, kMag1, w >> 16), p.y, s.x);
  s.y = __dp4a(prmt(kMag0, kMag1, m >> 16), p.y, s.y);
  return s;
}
// dot_rows (q8.cuh) by word_dot_pm: only x's codes are read.
template <int R>
__device__ __forceinline__ void dot_rows_pm(const uint4 (&q)[R], const int2* xv, int (&is)[R],
                                            uint2 tb) {
  int2 s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = make_int2(0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int2 p = __ldg(xv + j);
#pragma unroll
    for (int r = 0; r < R; ++r)
      s[r] = word_dot_pm(j == 0   ? q[r].x
                         : j == 1 ? q[r].y
                         : j == 2 ? q[r].z
                                  : q[r].w,
                         p, s[r], tb.x, tb.y);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) is[r] = 2 * s[r].x - s[r].y;
}
// dot_chunk (q8.cuh) (SR 0), its sign-replicating form (1) or word_dot_pm's
// (2; 3: with the table tb read from g_mag_table).
template <int SR>
__device__ __forceinline__ int diag_dot(const uint4& w, const int4 (&x)[4], uint2 tb) {
  if (!SR) return dot_chunk(w, x);
  if (SR >= 2) {
    if (SR == 2) tb = make_uint2(0x03020100u, 0x0c080604u);
    int2 s = make_int2(0, 0);
    s = word_dot_pm(w.x, make_int2(x[0].x, x[0].y), s, tb.x, tb.y);
    s = word_dot_pm(w.y, make_int2(x[0].z, x[0].w), s, tb.x, tb.y);
    s = word_dot_pm(w.z, make_int2(x[1].x, x[1].y), s, tb.x, tb.y);
    s = word_dot_pm(w.w, make_int2(x[1].z, x[1].w), s, tb.x, tb.y);
    return 2 * s.x - s.y;
  }
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  int s = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int4 &p = x[j / 2], &n = x[2 + j / 2];
    s = word_dot_sr(ws[j], j % 2 ? make_int2(p.z, p.w) : make_int2(p.x, p.y),
                    j % 2 ? make_int2(n.z, n.w) : make_int2(n.x, n.y), s);
  }
  return s;
}

template <int MODE, int MINB = 3, int SR = 0, int NP = 1>
__global__ void __launch_bounds__(256, MINB)
    diag_gate_up(const ExpertPtrs* table, const int32_t* ids, const float* weights, const Q8x* xq,
                 const float* xd, int64_t hidden, int64_t inter, Q8x* hq, float* hd, int early) {
  // NP passes a chunk of RP rows each (1: the 8 rows; 2: gate's 4, then up's
  // 4), each in its own slot of NS: pass (c, h) (chunk i = lane + 32 c) in
  // slot NP (c & 1) + h, refilled with (c + 2, h) once (c, h) is computed.
  constexpr int NW = 8, R = 4, R2 = 8, RP = R2 / NP;
  extern __shared__ uint4 stage[];  // [2 NP][NW][RP][32]
  __shared__ float hs[32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), slot = int(blockIdx.y);
  const int64_t nb = hidden / 32, row0 = int64_t(blockIdx.x) * 32 + warp * R;
  const int nbi = int(nb);
  const uint4 *gw = nullptr, *uw = nullptr;
  const uint8_t *gs = nullptr, *us = nullptr;
  uint32_t sc[2] = {0x7f7f7f7fu, 0x7f7f7f7fu}, sn[2] = {0x7f7f7f7fu, 0x7f7f7f7fu};
  const uint2 tb = SR == 3 ? *reinterpret_cast<const uint2*>(g_mag_table) : make_uint2(0, 0);
  auto at = [&](int b, int r) { return stage + ((b * NW + warp) * RP + r) * 32 + lane; };
  auto issue = [&](int i, int b, int h) {  // rows h RP.. of chunk i -> slot b
    asm("" : "+r"(i));
    if (MODE != 3) {
#pragma unroll
      for (int r = 0; r < RP; ++r) {
        const int row = h * RP + r;
        cp_async16(at(b, r), (row < R ? gw : uw) + (row % R) * nbi + i);
      }
    }
    cp_async_commit();
  };
  auto scales = [&](int i) {  // of chunk i -> sn
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
    for (int c = 0; c < 2; ++c)  // in order (0, 0), (0, 1), (1, 0), (1, 1)
#pragma unroll
      for (int h = 0; h < NP; ++h)
        if (MODE != 4 && lane + 32 * c < nbi) issue(lane + 32 * c, NP * c + h, h);
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
    const bool more = i + 32 < nbi;
    if (more) scales(i + 32);
    int4 xr[4];
    float d = 0.0f;
    if (MODE != 1 && MODE != 2) {
#pragma unroll
      for (int j = 0; j < 4; ++j) xr[j] = __ldg(reinterpret_cast<const int4*>(xq + i) + j);
      d = __ldg(xd + i);
    }
#pragma unroll
    for (int h = 0; h < NP; ++h) {
      // passes issued after (c, h): the rest of chunk c, all of c + 1, and
      // (c + 2, h') for h' < h
      const int after = NP - 1 - h + (more ? NP : 0) + (i + 64 < nbi ? h : 0);
      if (after >= 3)
        cp_async_wait<3>();
      else if (after == 2)
        cp_async_wait<2>();
      else if (after == 1)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
      const int b = (c & 1) * NP + h;
#pragma unroll
      for (int r = 0; r < RP; ++r) {
        const int row = h * RP + r;
        const uint4 w = *at(b, r);
        if (MODE == 1 || MODE == 2)
          acc[row] += float((w.x ^ w.y ^ w.z ^ w.w ^ sc[row / R]) & 0xffu);
        else
          acc[row] += float(diag_dot<SR>(w, xr, tb)) *
                      (e8m0_half((sc[row / R] >> (8 * (row % R))) & 0xffu) * d);
      }
      if (i + 64 < nbi) issue(i + 64, b, h);
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

template <int U, int MODE, int PM = 0>
__global__ void __launch_bounds__(128)
    diag_down(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
              const Q8x* hq, const float* hd, int64_t hidden, int64_t inter, float* out,
              int accumulate, int early) {
  constexpr int NT = 128, NW = 4, R = 4;
  __shared__ RankedExperts rk;
  __shared__ float red[R][NW];
  const int t = int(threadIdx.x), lane = t & 31, warp = t / 32;
  const uint2 tb =
      PM == 2 ? *reinterpret_cast<const uint2*>(g_mag_table) : make_uint2(0x03020100u, 0x0c080604u);
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
        if (PM)
          dot_rows_pm<R>(q[u], reinterpret_cast<const int2*>(hq + hb), is, tb);
        else
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
