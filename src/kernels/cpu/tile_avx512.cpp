// The canonical dot order of the AVX-512 path (kernels/cpu/tile.h): groups of
// 16 columns (the last one zero-padded), A(g mod 2) = fma(W[r, 16g..16g+16),
// X[t, 16g..16g+16), A(g mod 2)) over g ascending, y = hsum16(A0 + A1) with
// hsum16(v) = hsum(low 8 lanes + high 8 lanes) and hsum tile_avx2.cpp's tree.
// Called only when the CPU has AVX-512F (kernels/cpu/dispatch.h); every
// function here is compiled for that target by the pragma below, after the
// last header.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/tile.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
// GCC 12 reports its own _mm512_undefined_* operands inside avx512fintrin.h
// as uninitialized when the intrinsics are inlined here (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/hsum_avx512.h"

namespace moetier::cpu::detail {
namespace {

inline __m512 bf16x16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 4 rows against one row of x; load(i, g) gives row i's group g.
template <class Load>
inline void dot4(Load load, const float* x, int64_t groups, float* out) {
  __m512 a0[4], a1[4];
  for (int i = 0; i < 4; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    const __m512 x0 = _mm512_loadu_ps(x + 16 * g), x1 = _mm512_loadu_ps(x + 16 * g + 16);
    for (int i = 0; i < 4; ++i) {
      a0[i] = _mm512_fmadd_ps(load(i, g), x0, a0[i]);
      a1[i] = _mm512_fmadd_ps(load(i, g + 1), x1, a1[i]);
    }
  }
  if (g < groups) {
    const __m512 xg = _mm512_loadu_ps(x + 16 * g);
    for (int i = 0; i < 4; ++i) a0[i] = _mm512_fmadd_ps(load(i, g), xg, a0[i]);
  }
  for (int i = 0; i < 4; ++i) out[i] = hsum16(_mm512_add_ps(a0[i], a1[i]));
}

}  // namespace

void tile4_avx512(const float* w, int64_t ld, const float* x, int64_t groups, float* out) {
  dot4([&](int i, int64_t g) { return _mm512_loadu_ps(w + i * ld + 16 * g); }, x, groups, out);
}

// 4 rows of scratch against 3 rows of x: 24 accumulators, each weight load
// serves 3 tokens; every output tile4_avx512's bits.
void tile4x3_avx512(const float* w, int64_t ld, const float* x, int64_t ldx, int64_t groups,
                    float* out) {
  __m512 a[2][3][4];
  for (auto& p : a)
    for (auto& t : p)
      for (auto& v : t) v = _mm512_setzero_ps();
  auto step = [&](int p, int64_t g) {
    __m512 wr[4];
    for (int i = 0; i < 4; ++i) wr[i] = _mm512_loadu_ps(w + i * ld + 16 * g);
    for (int t = 0; t < 3; ++t) {
      const __m512 xt = _mm512_loadu_ps(x + t * ldx + 16 * g);
      for (int i = 0; i < 4; ++i) a[p][t][i] = _mm512_fmadd_ps(wr[i], xt, a[p][t][i]);
    }
  };
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) step(0, g), step(1, g + 1);
  if (g < groups) step(0, g);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 4; ++i) out[4 * t + i] = hsum16(_mm512_add_ps(a[0][t][i], a[1][t][i]));
}

// One token against stored rows (decode): the rows one after the other, so
// that memory is read as a single stream (four rows side by side read four
// streams that each end at a 4 KB row and ran at about two thirds of the
// rate, kernels_bench BM_bf16/65536/2048/1), each iteration asking for the
// line kAhead bytes ahead (a 2048-column bf16 row ahead; past the tile's last
// row, the next rows). Each row's value is dot4's: the same accumulators in
// the same order.
constexpr int64_t kAhead = 4096;

template <class Load>
inline float dot1(const void* row, Load load, const float* x, int64_t groups, int64_t line_groups) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  const char* ahead = static_cast<const char*>(row) + kAhead;
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    for (int64_t l = 0; l < 2 / line_groups; ++l)  // the lines groups g, g + 1 span
      _mm_prefetch(ahead + 64 * (g / line_groups + l), _MM_HINT_T0);
    a0 = _mm512_fmadd_ps(load(g), _mm512_loadu_ps(x + 16 * g), a0);
    a1 = _mm512_fmadd_ps(load(g + 1), _mm512_loadu_ps(x + 16 * g + 16), a1);
  }
  if (g < groups) a0 = _mm512_fmadd_ps(load(g), _mm512_loadu_ps(x + 16 * g), a0);
  return hsum16(_mm512_add_ps(a0, a1));
}

void direct4_f32_avx512(const float* const rows[4], const float* x, int64_t groups, float* out) {
  for (int i = 0; i < 4; ++i)  // a group is one line
    out[i] = dot1(
        rows[i], [&](int64_t g) { return _mm512_loadu_ps(rows[i] + 16 * g); }, x, groups, 1);
}

void direct4_bf16_avx512(const uint16_t* const rows[4], const float* x, int64_t groups,
                         float* out) {
  for (int i = 0; i < 4; ++i)  // two groups are one line
    out[i] = dot1(
        rows[i], [&](int64_t g) { return bf16x16(rows[i] + 16 * g); }, x, groups, 2);
}

}  // namespace moetier::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
// Not x86-64: the AVX-512 path is never selected (cpu_has_avx512() is false).
namespace moetier::cpu::detail {
void tile4_avx512(const float*, int64_t, const float*, int64_t, float*) {}
void tile4x3_avx512(const float*, int64_t, const float*, int64_t, int64_t, float*) {}
void direct4_f32_avx512(const float* const[4], const float*, int64_t, float*) {}
void direct4_bf16_avx512(const uint16_t* const[4], const float*, int64_t, float*) {}
}  // namespace moetier::cpu::detail
#endif
