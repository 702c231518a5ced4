// bf16 activations for bf16 weights (kernels/cpu/bf16.h) with AVX-512 BF16:
// vdpbf16ps multiplies 32 bf16 pairs and adds each pair's two products into
// one of 16 f32 lanes, twice the work of an f32 FMA per instruction, on the
// stored rows as they are (no decoding).
//
// The order (the same for every n and tile, so batch-invariant): groups of 32
// columns (the weight's last group masked to its columns, the activations
// zero-padded), A(g mod 2) = dpbf16(A(g mod 2), W[32g..], X[32g..]) over g
// ascending, y = hsum16(A0 + A1) (tile_avx512.cpp's reduction).
// Compiled for its target by the pragma below; called only where
// cpu_has_avx512bf16() (kernels/cpu/dispatch.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/bf16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/hsum_avx512.h"

namespace moetier::cpu::detail {
namespace {

// Group g of a stored row of `cols` columns (the last group masked).
inline __m512bh wload(const uint16_t* row, int64_t g, int64_t cols) {
  const int64_t left = cols - 32 * g;
  const __mmask32 m = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
  return __m512bh(_mm512_maskz_loadu_epi16(m, row + 32 * g));
}

inline __m512bh xload(const uint16_t* x, int64_t g) {
  return __m512bh(_mm512_loadu_si512(x + 32 * g));
}

inline __m512 dp(__m512 a, __m512bh w, __m512bh x) { return _mm512_dpbf16_ps(a, w, x); }

// One row against one activation row, reading ahead of the row (decode: the
// rows of a tile one after another, as tile_avx512.cpp's dot1).
inline float dot1(const uint16_t* row, const uint16_t* x, int64_t groups, int64_t cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(row) + 4096;
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    _mm_prefetch(ahead + 64 * g, _MM_HINT_T0);
    _mm_prefetch(ahead + 64 * g + 64, _MM_HINT_T0);
    a0 = dp(a0, wload(row, g, cols), xload(x, g));
    a1 = dp(a1, wload(row, g + 1, cols), xload(x, g + 1));
  }
  if (g < groups) a0 = dp(a0, wload(row, g, cols), xload(x, g));
  return hsum16(_mm512_add_ps(a0, a1));
}

// 4 rows against 3 activation rows: each weight load serves 3 tokens; every
// output dot1's operations on the same values.
void tile4x3(const uint16_t* const rows[4], const uint16_t* x, int64_t ldx, int64_t groups,
             int64_t cols, float* out) {
  __m512 a[2][3][4];
  for (auto& p : a)
    for (auto& t : p)
      for (auto& v : t) v = _mm512_setzero_ps();
  auto step = [&](int p, int64_t g) {
    __m512bh w[4];
    for (int i = 0; i < 4; ++i) w[i] = wload(rows[i], g, cols);
    for (int t = 0; t < 3; ++t) {
      const __m512bh xt = xload(x + t * ldx, g);
      for (int i = 0; i < 4; ++i) a[p][t][i] = dp(a[p][t][i], w[i], xt);
    }
  };
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) step(0, g), step(1, g + 1);
  if (g < groups) step(0, g);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 4; ++i) out[4 * t + i] = hsum16(_mm512_add_ps(a[0][t][i], a[1][t][i]));
}

}  // namespace

void to_bf16_avx512bf16(const float* x, int64_t cols, int64_t ld, uint16_t* out) {
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c));
    _mm512_storeu_si512(out + c, __m512i(v));
  }
  for (; c < ld; c += 16) {  // the tail, zero-padded to ld (a multiple of 32)
    const int64_t left = std::max<int64_t>(0, cols - c);
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), __m256i(v));
  }
}

void bf16act_tile4_avx512bf16(const uint16_t* const rows[4], int64_t cols, const uint16_t* x,
                              int64_t ldx, int64_t n, float* out) {
  const int64_t groups = (cols + 31) / 32;
  int64_t t = 0;
  for (; t + 3 <= n; t += 3) tile4x3(rows, x + t * ldx, ldx, groups, cols, out + 4 * t);
  for (; t < n; ++t)
    for (int i = 0; i < 4; ++i) out[4 * t + i] = dot1(rows[i], x + t * ldx, groups, cols);
}

}  // namespace moetier::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
// Not x86-64: never selected (cpu_has_avx512bf16() is false).
namespace moetier::cpu::detail {
void to_bf16_avx512bf16(const float*, int64_t, int64_t, uint16_t*) {}
void bf16act_tile4_avx512bf16(const uint16_t* const[4], int64_t, const uint16_t*, int64_t, int64_t,
                              float*) {}
}  // namespace moetier::cpu::detail
#endif
