// CB3 matmul on the CPU (see kernels/cpu/cb3.h for the decoding scheme).
//
// Work split as cpu::matmul: rows in blocks of kBlock taken by OpenMP threads.
// n <= kDirectMax: each row is dotted with each token straight from its codes.
// Otherwise four rows are decoded to f32 into a per-thread scratch [4, cols]
// and every token's row of X is dotted against all four.
#include "kernels/cpu/cb3.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cb3.h"
#include "kernels/cpu/simd.h"
#include "kernels/matview.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MOETIER_X86 1
#endif

namespace moetier::cpu {
namespace detail {
namespace {

using kernels::cb3_code;
using kernels::cb3_group;

void lut_of(const uint8_t* codebook, float* lut /* [8] */) {
  for (int k = 0; k < kernels::kCb3Centroids; ++k)
    lut[k] = f16_to_f32(kernels::cb3_centroid_bits(codebook, 0, k));
}

}  // namespace

float dot_cb3_portable(const uint8_t* codes, const uint8_t* codebook, const float* x,
                       int64_t cols) {
  float lut[8];
  lut_of(codebook, lut);
  float acc[8] = {};
  const int64_t groups = cols / 8;
  for (int64_t g = 0; g < groups; ++g) {
    const uint32_t v = cb3_group(codes, g);
    const float* xg = x + 8 * g;
    for (int j = 0; j < 8; ++j) acc[j] += lut[(v >> (3 * j)) & 7u] * xg[j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t c = groups * 8; c < cols; ++c) s += lut[cb3_code(codes, c)] * x[c];
  return s;
}

void decode_cb3_portable(const uint8_t* codes, const uint8_t* codebook, int64_t cols, float* out) {
  float lut[8];
  lut_of(codebook, lut);
  const int64_t groups = cols / 8;
  for (int64_t g = 0; g < groups; ++g) {
    const uint32_t v = cb3_group(codes, g);
    for (int j = 0; j < 8; ++j) out[8 * g + j] = lut[(v >> (3 * j)) & 7u];
  }
  for (int64_t c = groups * 8; c < cols; ++c) out[c] = lut[cb3_code(codes, c)];
}

#ifdef MOETIER_X86
namespace {

#define MOETIER_CB3_TARGET __attribute__((target("avx2,fma,f16c")))

// The 8 codes of group g as int32 lanes. `wide`: the row has a byte after the
// group, so 4 bytes are loaded straight into a broadcast (a load-port op; the
// extra byte lands in bits 24..31, which no code uses), leaving the shuffle
// port to the vpermps.
template <bool wide>
MOETIER_CB3_TARGET inline __m256i group_codes(const uint8_t* codes, int64_t g) {
  const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  int32_t bits;
  if constexpr (wide)
    std::memcpy(&bits, codes + 3 * g, 4);
  else
    bits = int32_t(cb3_group(codes, g));
  const __m256i v = _mm256_set1_epi32(bits);
  return _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32(7));
}

MOETIER_CB3_TARGET float dot_cb3_avx2(const uint8_t* codes, const uint8_t* codebook, const float* x,
                                      int64_t cols) {
  const __m256 lut = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook)));
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  const int64_t groups = cols / 8;
  // Groups followed by another byte of the row take the wide load.
  const int64_t wide = cols % 8 ? groups : groups - 1;
  int64_t g = 0;
  for (; g + 2 <= wide; g += 2) {
    a0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(lut, group_codes<true>(codes, g)),
                         _mm256_loadu_ps(x + 8 * g), a0);
    a1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(lut, group_codes<true>(codes, g + 1)),
                         _mm256_loadu_ps(x + 8 * g + 8), a1);
  }
  for (; g < groups; ++g)
    a0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(lut, group_codes<false>(codes, g)),
                         _mm256_loadu_ps(x + 8 * g), a0);
  a0 = _mm256_add_ps(a0, a1);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  float s = _mm_cvtss_f32(r);
  if (groups * 8 < cols) {
    alignas(32) float l[8];
    _mm256_store_ps(l, lut);
    for (int64_t c = groups * 8; c < cols; ++c) s += l[cb3_code(codes, c)] * x[c];
  }
  return s;
}

MOETIER_CB3_TARGET void decode_cb3_avx2(const uint8_t* codes, const uint8_t* codebook, int64_t cols,
                                        float* out) {
  const __m256 lut = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook)));
  const int64_t groups = cols / 8;
  const int64_t wide = cols % 8 ? groups : groups - 1;
  int64_t g = 0;
  for (; g < wide; ++g)
    _mm256_storeu_ps(out + 8 * g, _mm256_permutevar8x32_ps(lut, group_codes<true>(codes, g)));
  for (; g < groups; ++g)
    _mm256_storeu_ps(out + 8 * g, _mm256_permutevar8x32_ps(lut, group_codes<false>(codes, g)));
  if (groups * 8 < cols) {
    alignas(32) float l[8];
    _mm256_store_ps(l, lut);
    for (int64_t c = groups * 8; c < cols; ++c) out[c] = l[cb3_code(codes, c)];
  }
}

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
}

}  // namespace
#endif

Cb3Dot best_cb3_dot() {
#ifdef MOETIER_X86
  if (have_avx2()) return dot_cb3_avx2;
#endif
  return dot_cb3_portable;
}

Cb3Decode best_cb3_decode() {
#ifdef MOETIER_X86
  if (have_avx2()) return decode_cb3_avx2;
#endif
  return decode_cb3_portable;
}

}  // namespace detail

namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kDirectMax = 2;
constexpr int64_t kParallelMin = int64_t(1) << 18;  // multiply-adds worth a parallel region

struct Cb3Rows {
  const uint8_t* codes;     // [rows, row_bytes]
  const uint8_t* codebook;  // [rows, 8] f16
  int64_t row_bytes;
  const uint8_t* row(int64_t r) const { return codes + r * row_bytes; }
  const uint8_t* book(int64_t r) const { return codebook + r * 16; }
};

void rows_direct(const MatView& w, const Cb3Rows& m, const float* x, int64_t n, float* y,
                 int64_t r0, int64_t r1) {
  const detail::Cb3Dot dot = detail::best_cb3_dot();
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < n; ++t)
      y[t * w.rows + r] = dot(m.row(r), m.book(r), x + t * w.cols, w.cols);
}

MOETIER_CLONES void tile4(const float* w, const float* x, int64_t n, int64_t cols, int64_t rows,
                          int64_t r, float* y) {
  const float *w0 = w, *w1 = w + cols, *w2 = w + 2 * cols, *w3 = w + 3 * cols;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t c = 0; c < cols; ++c) {
      a0 += w0[c] * xt[c];
      a1 += w1[c] * xt[c];
      a2 += w2[c] * xt[c];
      a3 += w3[c] * xt[c];
    }
    float* yt = y + t * rows + r;
    yt[0] = a0, yt[1] = a1, yt[2] = a2, yt[3] = a3;
  }
}

MOETIER_CLONES float dot_f32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

void rows_tiled(const MatView& w, const Cb3Rows& m, const float* x, int64_t n, float* y, int64_t r0,
                int64_t r1, float* scratch /* [4, cols] */) {
  const detail::Cb3Decode decode = detail::best_cb3_decode();
  const int64_t cols = w.cols;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int64_t i = 0; i < 4; ++i) decode(m.row(r + i), m.book(r + i), cols, scratch + i * cols);
    tile4(scratch, x, n, cols, w.rows, r, y);
  }
  for (; r < r1; ++r) {
    decode(m.row(r), m.book(r), cols, scratch);
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot_f32(scratch, x + t * cols, cols);
  }
}

Cb3Rows rows_of(const MatView& w) {
  return {static_cast<const uint8_t*>(w.data), w.scales, kernels::cb3_row_bytes(w.cols)};
}

}  // namespace

void matmul_cb3(const MatView& w, const float* x, int64_t n, float* y) {
  kernels::check_matview(w, "cpu::matmul");
  check(w.enc == WeightEncoding::CB3, "cpu::matmul_cb3: matrix is {}, not cb3",
        kernels::encoding_name(w.enc));
  if (n <= 0) return;
  const Cb3Rows m = rows_of(w);
  const int64_t blocks = (w.rows + kBlock - 1) / kBlock;
  const bool parallel = blocks > 1 && w.rows * w.cols * n >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch(n > kDirectMax ? size_t(4 * w.cols) : 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kBlock, r1 = std::min(w.rows, r0 + kBlock);
      if (n <= kDirectMax)
        rows_direct(w, m, x, n, y, r0, r1);
      else
        rows_tiled(w, m, x, n, y, r0, r1, scratch.data());
    }
  }
}

void get_row_cb3(const MatView& w, int64_t r, float* out) {
  kernels::check_matview(w, "cpu::get_row");
  check(w.enc == WeightEncoding::CB3, "cpu::get_row_cb3: matrix is {}, not cb3",
        kernels::encoding_name(w.enc));
  check(r >= 0 && r < w.rows, "cpu::get_row: row {} outside [0, {})", r, w.rows);
  const Cb3Rows m = rows_of(w);
  detail::best_cb3_decode()(m.row(r), m.book(r), w.cols, out);
}

}  // namespace moetier::cpu
