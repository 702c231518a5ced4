// The canonical dot order (kernels/cpu/tile.h) in portable C++. This file is
// compiled with -ffp-contract=off: a multiply and an add, never fused.
#include "kernels/cpu/tile.h"

namespace moetier::cpu::detail {

void tile4_portable(const float* w, int64_t ld, const float* x, int64_t groups, float* out) {
  float a0[4][8] = {}, a1[4][8] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + 8 * g;
    for (int i = 0; i < 4; ++i) {
      const float* wg = w + i * ld + 8 * g;
      float* a = (g & 1) ? a1[i] : a0[i];
      for (int l = 0; l < 8; ++l) a[l] = a[l] + wg[l] * xg[l];
    }
  }
  for (int i = 0; i < 4; ++i) {
    float v[8];
    for (int l = 0; l < 8; ++l) v[l] = a0[i][l] + a1[i][l];
    out[i] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  }
}

}  // namespace moetier::cpu::detail
