// CB3 row decoding on the CPU (see kernels/cpu/cb3.h); cpu::matmul dots the
// decoded rows in the canonical order (kernels/cpu/tile.h).
#include "kernels/cpu/cb3.h"

#include <cstring>

#include "core/dtype.h"
#include "kernels/cb3.h"
#include "kernels/cpu/dispatch.h"

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

}  // namespace
#endif

Cb3Decode best_cb3_decode() {
#ifdef MOETIER_X86
  if (cpu_has_avx2()) return decode_cb3_avx2;
#endif
  return decode_cb3_portable;
}

void decode_cb3_row(const MatView& w, int64_t r, float* out) {
  const int64_t row_bytes = kernels::cb3_row_bytes(w.cols);
  const uint8_t* codes = static_cast<const uint8_t*>(w.data) + r * row_bytes;
  const uint8_t* book = w.scales + r * 16;
  if (vector_path(kernel_path()))
    best_cb3_decode()(codes, book, w.cols, out);
  else
    decode_cb3_portable(codes, book, w.cols, out);
}

}  // namespace detail
}  // namespace moetier::cpu
