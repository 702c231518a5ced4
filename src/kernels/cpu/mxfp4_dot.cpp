#include "kernels/cpu/mxfp4_dot.h"

#include <cstring>

#include "core/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MOETIER_X86 1
#endif

namespace moetier::cpu::detail {

float dot_mxfp4_portable(const uint8_t* d, const uint8_t* s, const float* x, int64_t cols) {
  float acc = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    float w[32];  // the block decoded (without its scale)
    for (int j = 0; j < 16; ++j) std::memcpy(w + 2 * j, kMxfp4Pairs.v[d[b * 16 + j]], 8);
    const float* xb = x + b * 32;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int j = 0; j < 32; ++j) part += w[j] * xb[j];
    acc += part * e8m0_to_f32(s[b]);
  }
  return acc;
}

#ifdef MOETIER_X86
namespace {

// Eight int8 lanes of v as f32.
#define MOETIER_I8_F32(v) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))

__attribute__((target("avx2,fma"))) float dot_mxfp4_avx2(const uint8_t* d, const uint8_t* s,
                                                         const float* x, int64_t cols) {
  // 2 x e2m1 value of each code: integers in [-12, 12].
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + b * 16));
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    const __m128i v0 = _mm_unpacklo_epi8(lo, hi);  // columns 0..15 in order
    const __m128i v1 = _mm_unpackhi_epi8(lo, hi);  // columns 16..31
    const float* xb = x + b * 32;
    __m256 p = _mm256_mul_ps(MOETIER_I8_F32(v0), _mm256_loadu_ps(xb));
    p = _mm256_fmadd_ps(MOETIER_I8_F32(_mm_srli_si128(v0, 8)), _mm256_loadu_ps(xb + 8), p);
    p = _mm256_fmadd_ps(MOETIER_I8_F32(v1), _mm256_loadu_ps(xb + 16), p);
    p = _mm256_fmadd_ps(MOETIER_I8_F32(_mm_srli_si128(v1, 8)), _mm256_loadu_ps(xb + 24), p);
    acc = _mm256_fmadd_ps(p, _mm256_set1_ps(0.5f * e8m0_to_f32(s[b])), acc);
  }
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

}  // namespace
#endif

Mxfp4Dot best_mxfp4_dot() {
#ifdef MOETIER_X86
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return dot_mxfp4_avx2;
#endif
  return dot_mxfp4_portable;
}

}  // namespace moetier::cpu::detail
