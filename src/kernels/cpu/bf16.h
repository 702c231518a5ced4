// bf16 activations for bf16 weights: in the q8 mode (kernels/cpu/dispatch.h,
// MOETIER_CPU_ACT) on the avx512 path of a CPU with AVX-512 BF16, a bf16
// matmul rounds each row of X to bf16 (round to nearest even) once per call
// and multiplies it with the stored rows by vdpbf16ps (bf16_avx512.cpp: the
// order). Elsewhere, and with MOETIER_CPU_ACT=f32, bf16 weights take f32
// activations (kernels/cpu/tile.h).
#pragma once

#include <cstdint>

namespace moetier::cpu::detail {

// out [ld] = x [cols] rounded to bf16, zero past cols (ld a multiple of 32).
void to_bf16_avx512bf16(const float* x, int64_t cols, int64_t ld, uint16_t* out);

// 4 stored bf16 rows [cols] against n activation rows (x [n, ldx] from
// to_bf16_avx512bf16): out[t * 4 + i] = row i . row t of x.
void bf16act_tile4_avx512bf16(const uint16_t* const rows[4], int64_t cols, const uint16_t* x,
                              int64_t ldx, int64_t n, float* out);

}  // namespace moetier::cpu::detail
