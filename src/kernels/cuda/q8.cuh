// The q8 activation format of the MXFP4 decode kernels (decode_q8.cu) and its device helpers: a q8
// block is 32 activations as int8 with one f32 scale d = amax / 127 (as kernels/cpu/q8.h).
#pragma once

#include <cstdint>

#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {

// One q8 block in memory: its 32 codes q as 2 x int4 (its scale d is stored
// apart, in an array of floats).
struct Q8x {
  int4 p0, p1;
};

__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xffu) | (uint32_t(b) & 0xffu) << 8 | (uint32_t(c) & 0xffu) << 16 |
         uint32_t(d) << 24;
}

// Quantizes v[32] (one lane's block) into dst; returns d (NaN if any v is
// not finite, whose codes are then 0).
__device__ __forceinline__ float quantize32(const float (&v)[32], Q8x* dst) {
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j])), finite = finite && isfinite(v[j]);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  uint32_t p[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    int q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = finite ? __float2int_rn(v[4 * w + j] * id) : 0;
    p[w] = pack4(q[0], q[1], q[2], q[3]);
  }
  dst->p0 = make_int4(int(p[0]), int(p[1]), int(p[2]), int(p[3]));
  dst->p1 = make_int4(int(p[4]), int(p[5]), int(p[6]), int(p[7]));
  return finite ? amax / 127.0f : __int_as_float(0x7fc00000);
}

// One q8 block from the 32 lanes' values (lane j holds v[j]): lane j writes
// byte j of the codes; every lane returns d.
__device__ __forceinline__ float quantize_warp(float v, Q8x* dst) {
  float amax = fabsf(v);
  bool finite = isfinite(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __shfl_xor_sync(0xffffffffu, int(finite), o) && finite;
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q = finite ? __float2int_rn(v * id) : 0;
  reinterpret_cast<int8_t*>(dst)[threadIdx.x & 31] = int8_t(q);
  return finite ? amax / 127.0f : __int_as_float(0x7fc00000);
}

// prmt without __byte_perm's masking of the selector: a nibble with bit 3 set
// gives the sign of the byte its bits 0-2 choose, replicated (0 or 0xff).
__device__ __forceinline__ int prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return int(d);
}
// The integer dot of the 8 codes of one word w of an MXFP4 chunk (nibble k =
// column 8j + k) with the q8 block's words 2j, 2j + 1 (p), as two sums added
// to s. A permute of the table of the 8 e2m1 magnitudes (doubled: 0 1 2 3 4 6
// 8 12, all below 128) by the codes themselves gives each positive code's
// magnitude and 0 for each negative one (sign bit 3 set: the magnitude's sign
// replicated), pos; by the codes & 7 every magnitude, mag. The signed dot is
// 2 pos.p - mag.p: s.x sums pos.p, s.y mag.p. Per word 4 permutes, an and,
// two shifts (ALU pipe) and 4 dp4a (FMA pipe).
__device__ __forceinline__ int2 word_dot(uint32_t w, int2 p, int2 s) {
  constexpr uint32_t kMag0 = 0x03020100u, kMag1 = 0x0c080604u;
  const uint32_t m = w & 0x77777777u;
  s.x = __dp4a(prmt(kMag0, kMag1, w), p.x, s.x);
  s.y = __dp4a(prmt(kMag0, kMag1, m), p.x, s.y);
  s.x = __dp4a(prmt(kMag0, kMag1, w >> 16), p.y, s.x);
  s.y = __dp4a(prmt(kMag0, kMag1, m >> 16), p.y, s.y);
  return s;
}
__device__ __forceinline__ int signed_dot(int2 s) { return 2 * s.x - s.y; }

// The integer dot of one 16-byte chunk w (32 codes) with a q8 block's codes
// held in registers (x: p0, p1).
__device__ __forceinline__ int dot_chunk(const uint4& w, const int4 (&x)[2]) {
  int2 s = word_dot(w.x, make_int2(x[0].x, x[0].y), make_int2(0, 0));
  s = word_dot(w.y, make_int2(x[0].z, x[0].w), s);
  s = word_dot(w.z, make_int2(x[1].x, x[1].y), s);
  return signed_dot(word_dot(w.w, make_int2(x[1].z, x[1].w), s));
}

// is[r] = integer dot of chunk q[r] (16 bytes: 32 columns) of R rows with one
// q8 block's codes xv [4] (as int2), read a word pair at a time.
template <int R>
__device__ __forceinline__ void dot_rows(const uint4 (&q)[R], const int2* xv, int (&is)[R]) {
  int2 s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = make_int2(0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int2 p = __ldg(xv + j);
#pragma unroll
    for (int r = 0; r < R; ++r)
      s[r] = word_dot(j == 0 ? q[r].x : j == 1 ? q[r].y : j == 2 ? q[r].z : q[r].w, p, s[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) is[r] = signed_dot(s[r]);
}

// Half the e8m0 scale (the codes hold 2 e2m1), without branches: 2^(e - 128),
// (e - 1) << 23 for e in [2, 254], the subnormals 2^-128 and 2^-127 for 0 and
// 1, NaN for 0xff (kernels/cpu/q8.h's e8m0_half).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  const uint32_t b = e <= 1 ? 0x00200000u << e : (e - 1) << 23;
  return __uint_as_float(e == 0xffu ? 0x7fc00000u : b);
}

}  // namespace moetier::cuda
