// The q8 mode (kernels/cpu/q8.h) with AVX2 + FMA. Called only when the CPU
// has them (kernels/cpu/dispatch.h); every function here is compiled for that
// target by the pragma below, after the last header.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/q8.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace moetier::cpu::detail {
namespace {

inline float hsum(__m256 v) {  // ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline float hmax(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// 32 int32 lanes (columns 0..31 in order) -> 32 bytes, even columns first.
inline __m256i pack_even_odd(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i nat = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m256i eo = _mm256_shuffle_epi8(
      nat, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                            12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  return _mm256_permute4x64_epi64(eo, 0xd8);  // qwords 0, 2, 1, 3
}

// The 8 exact lane sums of q8.h for one weight block u against q, given
// corr = 12 * the 4-column sums of q.
inline __m256i lanes(__m256i u, __m256i q, __m256i corr) {
  const __m256i ones = _mm256_set1_epi16(1);
  return _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, q), ones), corr);
}

inline __m256i corr_of(__m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(12), q), _mm256_set1_epi16(1));
}

// One MXFP4 block (16 code bytes) -> u (low nibbles, then high nibbles).
inline __m256i mxfp4_u(const uint8_t* codes) {
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

}  // namespace

void quantize_q8_avx2(const float* x, int64_t blocks, int8_t* q, float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4], m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
      m = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), m);
    }
    const float amax = hmax(m);
    __m256i* qb = reinterpret_cast<__m256i*>(q + 32 * b);
    if (_mm256_movemask_ps(bad) != 0 || std::isinf(amax)) {
      d[b] = NAN;
      _mm256_storeu_si256(qb, _mm256_setzero_si256());
      continue;
    }
    d[b] = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
    _mm256_storeu_si256(qb, pack_even_odd(i[0], i[1], i[2], i[3]));
  }
}

void decode_mxfp4_q8_avx2(const uint8_t* codes, const uint8_t* scales, int64_t blocks, uint8_t* u,
                          float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 32 * b), mxfp4_u(codes + 16 * b));
    s[b] = kHalfScales.v[scales[b]];
  }
}

// Two activation rows at a time share each weight block's load and scale;
// every output keeps the q8 order (the same operations on the same values).
static void q8_tile4x2_avx2(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq,
                            int64_t ldd, float* out) {
  __m256 acc0[4], acc1[4];
  for (int i = 0; i < 4; ++i) acc0[i] = _mm256_setzero_ps(), acc1[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < w.blocks; ++b) {
    const __m256i q0 = load32(q + 32 * b), q1 = load32(q + ldq + 32 * b);
    const __m256i c0 = corr_of(q0), c1 = corr_of(q1);
    const __m256 d0 = _mm256_broadcast_ss(d + b), d1 = _mm256_broadcast_ss(d + ldd + b);
    for (int i = 0; i < 4; ++i) {
      const __m256i u = load32(w.u + i * w.ldu + 32 * b);
      const __m256 s = _mm256_broadcast_ss(w.s + i * w.lds + b);
      acc0[i] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes(u, q0, c0)), _mm256_mul_ps(s, d0), acc0[i]);
      acc1[i] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes(u, q1, c1)), _mm256_mul_ps(s, d1), acc1[i]);
    }
  }
  for (int i = 0; i < 4; ++i) out[i] = hsum(acc0[i]), out[4 + i] = hsum(acc1[i]);
}

void q8_tile4_avx2(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                   int64_t n, float* out) {
  int64_t t = 0;
  for (; t + 2 <= n; t += 2) q8_tile4x2_avx2(w, q + t * ldq, d + t * ldd, ldq, ldd, out + t * 4);
  for (; t < n; ++t) {
    __m256 acc[4];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t b = 0; b < w.blocks; ++b) {
      const __m256i qb = load32(q + t * ldq + 32 * b);
      const __m256i corr = corr_of(qb);
      const __m256 dx = _mm256_broadcast_ss(d + t * ldd + b);
      for (int i = 0; i < 4; ++i) {
        const __m256i l = lanes(load32(w.u + i * w.ldu + 32 * b), qb, corr);
        const __m256 sc = _mm256_mul_ps(_mm256_broadcast_ss(w.s + i * w.lds + b), dx);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sc, acc[i]);
      }
    }
    for (int i = 0; i < 4; ++i) out[t * 4 + i] = hsum(acc[i]);
  }
}

void q8_direct4_mxfp4_avx2(const uint8_t* const codes[4], const uint8_t* const scales[4],
                           const int8_t* q, const float* d, int64_t blocks, float* out) {
  __m256 acc[4];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i qb = load32(q + 32 * b);
    const __m256i corr = corr_of(qb);
    const __m256 dx = _mm256_broadcast_ss(d + b);
    for (int i = 0; i < 4; ++i) {
      const __m256i l = lanes(mxfp4_u(codes[i] + 16 * b), qb, corr);
      const __m256 sc = _mm256_mul_ps(_mm256_broadcast_ss(&kHalfScales.v[scales[i][b]]), dx);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sc, acc[i]);
    }
  }
  for (int i = 0; i < 4; ++i) out[i] = hsum(acc[i]);
}

}  // namespace moetier::cpu::detail

#pragma GCC pop_options
#else
// Not x86-64: the AVX2 path is never selected (cpu_has_avx2() is false).
namespace moetier::cpu::detail {
void quantize_q8_avx2(const float*, int64_t, int8_t*, float*) {}
void decode_mxfp4_q8_avx2(const uint8_t*, const uint8_t*, int64_t, uint8_t*, float*) {}
void q8_tile4_avx2(const Q8Tile&, const int8_t*, const float*, int64_t, int64_t, int64_t, float*) {}
void q8_direct4_mxfp4_avx2(const uint8_t* const*, const uint8_t* const*, const int8_t*,
                           const float*, int64_t, float*) {}
}  // namespace moetier::cpu::detail
#endif
