// The canonical dot order (kernels/cpu/tile.h) with AVX2 + FMA. Called only
// when the CPU has them (kernels/cpu/dispatch.h). Every function here is
// compiled for that target by the pragma below; nothing inline from a header
// is defined after it, so no AVX2 code leaks into other translation units.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace moetier::cpu::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// The canonical order over 4 rows. load4(i, b, w) gives row i's groups
// 4b..4b+3 (32 columns); load1(i, g) gives group g (used past the last
// complete 32-column block). Each accumulator receives its groups in
// ascending order, whatever the blocking.
template <class Load4, class Load1>
inline void dot4(Load4 load4, Load1 load1, const float* x, int64_t groups, float* out) {
  __m256 a0[4], a1[4];
  for (int i = 0; i < 4; ++i) a0[i] = a1[i] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 4 <= groups; g += 4) {
    const __m256 x0 = _mm256_loadu_ps(x + 8 * g), x1 = _mm256_loadu_ps(x + 8 * g + 8);
    const __m256 x2 = _mm256_loadu_ps(x + 8 * g + 16), x3 = _mm256_loadu_ps(x + 8 * g + 24);
    for (int i = 0; i < 4; ++i) {
      __m256 w[4];
      load4(i, g / 4, w);
      a0[i] = _mm256_fmadd_ps(w[0], x0, a0[i]);
      a1[i] = _mm256_fmadd_ps(w[1], x1, a1[i]);
      a0[i] = _mm256_fmadd_ps(w[2], x2, a0[i]);
      a1[i] = _mm256_fmadd_ps(w[3], x3, a1[i]);
    }
  }
  for (; g < groups; ++g) {
    const __m256 xg = _mm256_loadu_ps(x + 8 * g);
    for (int i = 0; i < 4; ++i) {
      __m256& a = (g & 1) ? a1[i] : a0[i];
      a = _mm256_fmadd_ps(load1(i, g), xg, a);
    }
  }
  for (int i = 0; i < 4; ++i) out[i] = hsum(_mm256_add_ps(a0[i], a1[i]));
}

inline __m256 bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float e8m0_half(uint8_t e) {  // 0.5 * 2^(e - 127), exact; 0xff is NaN
  uint32_t bits = e == 0xff ? 0x7fc00000u
                  : e >= 2  ? uint32_t(e - 1) << 23
                            : (e == 1 ? 0x00400000u : 0x00200000u);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Eight int8 lanes as f32.
inline __m256 i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// One 32-column MXFP4 block: 16 code bytes, scale byte -> 4 x 8 exact f32.
inline void mxfp4_block(const uint8_t* d, uint8_t s, __m256* w) {
  // 2 x e2m1 value of each code: integers in [-12, 12].
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d));
  const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
  const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
  const __m128i v0 = _mm_unpacklo_epi8(lo, hi);  // columns 0..15 in order
  const __m128i v1 = _mm_unpackhi_epi8(lo, hi);  // columns 16..31
  const __m256 sc = _mm256_set1_ps(e8m0_half(s));
  w[0] = _mm256_mul_ps(i8x8(v0), sc);
  w[1] = _mm256_mul_ps(i8x8(_mm_srli_si128(v0, 8)), sc);
  w[2] = _mm256_mul_ps(i8x8(v1), sc);
  w[3] = _mm256_mul_ps(i8x8(_mm_srli_si128(v1, 8)), sc);
}

}  // namespace

void tile4_avx2(const float* w, int64_t ld, const float* x, int64_t groups, float* out) {
  auto load4 = [&](int i, int64_t b, __m256* v) {
    const float* p = w + i * ld + 32 * b;
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(p + 8 * j);
  };
  auto load1 = [&](int i, int64_t g) { return _mm256_loadu_ps(w + i * ld + 8 * g); };
  dot4(load4, load1, x, groups, out);
}

// Rows w, w + ld against tokens x, x + ldx, x + 2 ldx: each output in the
// canonical order (a0 takes the even groups, a1 the odd ones, ascending), so
// its bits are tile4_avx2's; 12 accumulators, each weight load serves 3 tokens.
void tile2x3_avx2(const float* w, int64_t ld, const float* x, int64_t ldx, int64_t groups,
                  float* out) {
  __m256 a[2][2][3];
  for (auto& p : a)
    for (auto& r : p)
      for (auto& v : r) v = _mm256_setzero_ps();
  auto step = [&](int p, int64_t g) {
    const __m256 w0 = _mm256_loadu_ps(w + 8 * g), w1 = _mm256_loadu_ps(w + ld + 8 * g);
    for (int t = 0; t < 3; ++t) {
      const __m256 xt = _mm256_loadu_ps(x + t * ldx + 8 * g);
      a[p][0][t] = _mm256_fmadd_ps(w0, xt, a[p][0][t]);
      a[p][1][t] = _mm256_fmadd_ps(w1, xt, a[p][1][t]);
    }
  };
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) step(0, g), step(1, g + 1);
  if (g < groups) step(0, g);
  for (int t = 0; t < 3; ++t)
    for (int r = 0; r < 2; ++r) out[2 * t + r] = hsum(_mm256_add_ps(a[0][r][t], a[1][r][t]));
}

void direct4_f32_avx2(const float* const rows[4], const float* x, int64_t groups, float* out) {
  auto load4 = [&](int i, int64_t b, __m256* v) {
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(rows[i] + 32 * b + 8 * j);
  };
  auto load1 = [&](int i, int64_t g) { return _mm256_loadu_ps(rows[i] + 8 * g); };
  dot4(load4, load1, x, groups, out);
}

void direct4_bf16_avx2(const uint16_t* const rows[4], const float* x, int64_t groups, float* out) {
  auto load4 = [&](int i, int64_t b, __m256* v) {
    for (int j = 0; j < 4; ++j) v[j] = bf16x8(rows[i] + 32 * b + 8 * j);
  };
  auto load1 = [&](int i, int64_t g) { return bf16x8(rows[i] + 8 * g); };
  dot4(load4, load1, x, groups, out);
}

void direct4_mxfp4_avx2(const uint8_t* const codes[4], const uint8_t* const scales[4],
                        const float* x, int64_t groups, float* out) {
  auto load4 = [&](int i, int64_t b, __m256* v) {
    mxfp4_block(codes[i] + 16 * b, scales[i][b], v);
  };
  auto load1 = [&](int i, int64_t g) {  // unused: groups % 4 == 0
    __m256 v[4];
    mxfp4_block(codes[i] + 16 * (g / 4), scales[i][g / 4], v);
    return v[g % 4];
  };
  dot4(load4, load1, x, groups, out);
}

}  // namespace moetier::cpu::detail

#pragma GCC pop_options
#else
// Not x86-64: the AVX2 path is never selected (cpu_has_avx2() is false).
namespace moetier::cpu::detail {
void tile2x3_avx2(const float*, int64_t, const float*, int64_t, int64_t, float*) {}
void tile4_avx2(const float*, int64_t, const float*, int64_t, float*) {}
void direct4_f32_avx2(const float* const*, const float*, int64_t, float*) {}
void direct4_bf16_avx2(const uint16_t* const*, const float*, int64_t, float*) {}
void direct4_mxfp4_avx2(const uint8_t* const*, const uint8_t* const*, const float*, int64_t,
                        float*) {}
}  // namespace moetier::cpu::detail
#endif
