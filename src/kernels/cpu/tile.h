// The one dot-product order of every CPU matmul (the canonical order), so that
// a token's output does not depend on how many tokens were computed with it
// (batch invariance: chunked prefill == step-by-step decode, bit for bit):
//
//   y[t, r] = hsum(A0 + A1), where for each group g of 8 columns (the last
//   one zero-padded), A(g mod 2) = fma(W[r, 8g..8g+8), X[t, 8g..8g+8), A(g mod 2))
//   over g ascending, and hsum(v) = ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)).
//
// W's rows are first decoded exactly to f32 (bf16, e2m1 x e8m0 and f16
// centroids are all exact in f32). The AVX2 path computes this with FMA
// instructions; the portable path with a separate multiply and add
// (compiled with -ffp-contract=off), so the two paths differ in rounding but
// each is batch-invariant. The AVX-512 path has an order of its own: the
// same rule over groups of 16 columns (tile_avx512.cpp). Every kernel below
// computes 4 rows (or 2) against one row of X (or 3); a row's result does not
// depend on the others.
#pragma once

#include <cstdint>

namespace moetier::cpu::detail {

// w [4, ld] decoded rows (zero-padded to 8 * groups), x [8 * groups]
// (zero-padded), out [4].
void tile4_portable(const float* w, int64_t ld, const float* x, int64_t groups, float* out);
void tile4_avx2(const float* w, int64_t ld, const float* x, int64_t groups, float* out);
// Rows w, w + ld of the same scratch against 3 rows of X (x, x + ldx, x + 2 ldx):
// out [3][2] (token-major), each value tile4_avx2's bits.
void tile2x3_avx2(const float* w, int64_t ld, const float* x, int64_t ldx, int64_t groups,
                  float* out);

// The same result straight from the stored rows (no scratch), for one token.
// rows[i] -> row i; cols = 8 * groups exactly (no padding needed).
void direct4_f32_avx2(const float* const rows[4], const float* x, int64_t groups, float* out);
void direct4_bf16_avx2(const uint16_t* const rows[4], const float* x, int64_t groups, float* out);
// The AVX-512 path's order (tile_avx512.cpp): groups of 16 columns; groups
// counts those; x, w zero-padded to 16 * groups. tile4x3: out [3][4] token-major.
void tile4_avx512(const float* w, int64_t ld, const float* x, int64_t groups, float* out);
void tile4x3_avx512(const float* w, int64_t ld, const float* x, int64_t ldx, int64_t groups,
                    float* out);
void direct4_f32_avx512(const float* const rows[4], const float* x, int64_t groups, float* out);
void direct4_bf16_avx512(const uint16_t* const rows[4], const float* x, int64_t groups, float* out);
// MXFP4: codes[i] [cols/2] e2m1 pairs, scales[i] [cols/32] e8m0; groups % 4 == 0.
void direct4_mxfp4_avx2(const uint8_t* const codes[4], const uint8_t* const scales[4],
                        const float* x, int64_t groups, float* out);

}  // namespace moetier::cpu::detail
