// The q8 mode (kernels/cpu/q8.h) in portable C++. This file is compiled with
// -ffp-contract=off: a multiply and an add, never fused.
#include <cfloat>
#include <cmath>

#include "kernels/cpu/q8.h"

namespace moetier::cpu::detail {

void quantize_q8_portable(const float* x, int64_t blocks, int8_t* q, float* d) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    int8_t* qb = q + 32 * b;
    float amax = 0.0f;
    bool bad = false;
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(xb[j]);
      bad |= !(a <= FLT_MAX);
      amax = a > amax ? a : amax;
    }
    if (bad) {
      d[b] = NAN;
      for (int j = 0; j < 32; ++j) qb[j] = 0;
      continue;
    }
    d[b] = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int k = 0; k < 16; ++k) {
      qb[k] = int8_t(std::nearbyint(xb[2 * k] * id));
      qb[16 + k] = int8_t(std::nearbyint(xb[2 * k + 1] * id));
    }
  }
}

void decode_mxfp4_q8_portable(const uint8_t* codes, const uint8_t* scales, int64_t blocks,
                              uint8_t* u, float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int k = 0; k < 16; ++k) {
      const uint8_t c = codes[16 * b + k];
      u[32 * b + k] = kMxfp4Q8Lut[c & 15];
      u[32 * b + 16 + k] = kMxfp4Q8Lut[c >> 4];
    }
    s[b] = e8m0_half(scales[b]);
  }
}

void q8_tile4_portable(const Q8Tile& w, const int8_t* q, const float* d, int64_t ldq, int64_t ldd,
                       int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    float acc[4][8] = {};
    for (int64_t b = 0; b < w.blocks; ++b) {
      const int8_t* qb = q + t * ldq + 32 * b;
      const float dx = d[t * ldd + b];
      for (int i = 0; i < 4; ++i) {
        const uint8_t* ub = w.u + i * w.ldu + 32 * b;
        const float sc = w.s[i * w.lds + b] * dx;
        for (int l = 0; l < 8; ++l) {
          int32_t lane = 0;
          for (int k = 4 * l; k < 4 * l + 4; ++k) lane += (int32_t(ub[k]) - 12) * int32_t(qb[k]);
          acc[i][l] = acc[i][l] + float(lane) * sc;
        }
      }
    }
    for (int i = 0; i < 4; ++i) {
      const float* a = acc[i];
      out[t * 4 + i] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    }
  }
}

}  // namespace moetier::cpu::detail
