// MXFP4 row dot products: a portable version (256-entry table of decoded code
// pairs) and, on x86-64, an AVX2+FMA version (pshufb table of 2x the e2m1
// values as int8, widened to f32). The AVX2 one is chosen at run time when the
// CPU has it.
#pragma once

#include <cstdint>

namespace moetier::cpu::detail {

// Values of the byte's two e2m1 codes: [low nibble (even column), high nibble].
struct Mxfp4PairTable {
  float v[256][2];
  constexpr Mxfp4PairTable() : v() {
    constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int b = 0; b < 256; ++b) {
      v[b][0] = kE2m1[b & 15];
      v[b][1] = kE2m1[b >> 4];
    }
  }
};
inline constexpr Mxfp4PairTable kMxfp4Pairs{};  // constant-initialized, 2 KiB

// One mxfp4 row: d [cols/2] code pairs, s [cols/32] e8m0 scales, x [cols].
using Mxfp4Dot = float (*)(const uint8_t* d, const uint8_t* s, const float* x, int64_t cols);
float dot_mxfp4_portable(const uint8_t* d, const uint8_t* s, const float* x, int64_t cols);
// The fastest version this CPU runs.
Mxfp4Dot best_mxfp4_dot();

}  // namespace moetier::cpu::detail
