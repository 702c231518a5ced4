// hsum16: the sum of a __m512's 16 floats in one fixed order (the avx512
// kernels' reductions; tile_avx512.cpp, bf16_avx512.cpp). Include it after
// the including file's `#pragma GCC target` with avx512f: it is compiled
// with that file's target (internal linkage, so each file keeps its own).
#pragma once

#include <immintrin.h>

namespace moetier::cpu::detail {
namespace {

inline float hsum16(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

}  // namespace
}  // namespace moetier::cpu::detail
