// The q8 mode (kernels/cpu/q8.h) with AVX-512 VNNI: two weight blocks per
// integer dot instruction (vpdpbusd: u8 x s8, four products a 32-bit lane,
// no saturation, so the lanes are q8.h's exact integers), then each block's 8
// lanes added into the same 8-lane accumulator as the AVX2 kernels do, block
// after block: the same operations on the same values, so the same bits as
// q8_avx2.cpp. Called only on the avx512 path (kernels/cpu/dispatch.h); every
// function here is compiled for that target by the pragma below, after the
// last header.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/q8.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
// GCC 12 reports its own _mm512_undefined_* operands inside the AVX-512
// headers as uninitialized when the intrinsics are inlined here (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moetier::cpu::detail {
namespace {

// hsum and mxfp4_u1 repeat q8_avx2.cpp's: each file's code is compiled for its
// own target (the pragma above), so nothing inline is shared through a header.
inline float hsum(__m256 v) {  // ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// 12 * the 4-column sums of q (blocks b, b + 1: 64 bytes).
inline __m512i corr2(__m512i q) {
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(12), q);
}

// Two MXFP4 blocks (32 code bytes) -> their u (each: low nibbles, then high).
inline __m512i mxfp4_u2(const uint8_t* codes) {
  const __m512i lut =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Q8Lut)));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  // [c0, c0, c1, c1] in 128-bit lanes, the second copy of each shifted by 4
  const __m512i cc = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                              _mm512_castsi256_si512(c));
  const __m512i sh = _mm512_srlv_epi64(cc, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
  return _mm512_shuffle_epi8(lut, _mm512_and_si512(sh, _mm512_set1_epi8(0x0f)));
}

// acc += the lanes of blocks b (low half) and b + 1 (high half), in that order.
inline __m256 add2(__m256 acc, __m512i lanes, float s0, float s1) {
  const __m512 f = _mm512_cvtepi32_ps(lanes);
  acc = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_set1_ps(s0), acc);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
  return _mm256_fmadd_ps(hi, _mm256_set1_ps(s1), acc);
}

// One block (the last of an odd count), 256 bits wide.
inline __m256 add1(__m256 acc, __m256i u, __m256i q, float s) {
  const __m256i corr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(12), q);
  const __m256i l = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q), corr);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(s), acc);
}

inline __m256i mxfp4_u1(const uint8_t* codes) {
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Q8Lut));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(c, m4));
  const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(c, 4), m4));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// 4 decoded rows against one activation row: out[i].
void tile4x1(const Q8Tile& w, const int8_t* q, const float* d, float* out) {
  __m256 acc[4];
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= w.blocks; b += 2) {
    const __m512i qq = load64(q + 32 * b), corr = corr2(qq);
    for (int i = 0; i < 4; ++i) {
      const __m512i u = load64(w.u + i * w.ldu + 32 * b);
      const __m512i l = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, qq), corr);
      const float* s = w.s + i * w.lds + b;
      acc[i] = add2(acc[i], l, s[0] * d[b], s[1] * d[b + 1]);
    }
  }
  if (b < w.blocks)
    for (int i = 0; i < 4; ++i)
      acc[i] = add1(acc[i], load32(w.u + i * w.ldu + 32 * b), load32(q + 32 * b),
                    w.s[i * w.lds + b] * d[b]);
  for (int i = 0; i < 4; ++i) out[i] = hsum(acc[i]);
}

}  // namespace

void q8_tile4_avx512(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                     int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) tile4x1(w, q + t * ldq, d + t * ldd, out + 4 * t);
}

namespace {

// 4 stored rows against T activation rows (q [T, ldq], d [T, ldd]): each block
// pair decoded once in registers for the T tokens; out[t * 4 + i]. Rows of a
// tile lie one after another, so the same row of the next tile is 4 rows
// ahead: each row asks for it (codes line by line, its scales once).
template <int T>
void direct4xT(const uint8_t* const codes[4], const uint8_t* const scales[4], const int8_t* q,
               const float* d, int64_t ldq, int64_t ldd, int64_t blocks, float* out) {
  __m256 acc[T][4];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const int64_t ahead = 4 * 16 * blocks;
  for (int i = 0; i < 4; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(scales[i] + 4 * blocks), _MM_HINT_T0);
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    __m512i qq[T], corr[T];
    for (int t = 0; t < T; ++t) qq[t] = load64(q + t * ldq + 32 * b), corr[t] = corr2(qq[t]);
    for (int i = 0; i < 4; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(codes[i] + 16 * b + ahead), _MM_HINT_T0);
      const __m512i u = mxfp4_u2(codes[i] + 16 * b);
      const float s0 = kHalfScales.v[scales[i][b]], s1 = kHalfScales.v[scales[i][b + 1]];
      for (int t = 0; t < T; ++t) {
        const __m512i l =
            _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, qq[t]), corr[t]);
        acc[t][i] = add2(acc[t][i], l, s0 * d[t * ldd + b], s1 * d[t * ldd + b + 1]);
      }
    }
  }
  if (b < blocks)
    for (int i = 0; i < 4; ++i) {
      const __m256i u = mxfp4_u1(codes[i] + 16 * b);
      for (int t = 0; t < T; ++t)
        acc[t][i] = add1(acc[t][i], u, load32(q + t * ldq + 32 * b),
                         kHalfScales.v[scales[i][b]] * d[t * ldd + b]);
    }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < 4; ++i) out[4 * t + i] = hsum(acc[t][i]);
}

}  // namespace

void q8_direct4_mxfp4_avx512(const uint8_t* const codes[4], const uint8_t* const scales[4],
                             const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                             int64_t blocks, int64_t n, float* out) {
  for (int64_t t = 0; t < n;) {
    const int64_t m = std::min<int64_t>(n - t, kQ8DirectTokens);
    const int8_t* qt = q + t * ldq;
    const float* dt = d + t * ldd;
    float* o = out + 4 * t;
    if (m == 4)
      direct4xT<4>(codes, scales, qt, dt, ldq, ldd, blocks, o);
    else if (m == 3)
      direct4xT<3>(codes, scales, qt, dt, ldq, ldd, blocks, o);
    else if (m == 2)
      direct4xT<2>(codes, scales, qt, dt, ldq, ldd, blocks, o);
    else
      direct4xT<1>(codes, scales, qt, dt, ldq, ldd, blocks, o);
    t += m;
  }
}

}  // namespace moetier::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
// Not x86-64: the AVX-512 path is never selected (cpu_has_avx512() is false).
namespace moetier::cpu::detail {
void q8_tile4_avx512(const Q8Tile&, const int8_t*, const float*, int64_t, int64_t, int64_t,
                     float*) {}
void q8_direct4_mxfp4_avx512(const uint8_t* const[4], const uint8_t* const[4], const int8_t*,
                             const float*, int64_t, int64_t, int64_t, int64_t, float*) {}
}  // namespace moetier::cpu::detail
#endif
