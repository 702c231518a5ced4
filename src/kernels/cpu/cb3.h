// CPU decoding of CB3 matrices (kernels/cb3.h): a row's 8 f16 centroids are
// turned into an 8-entry f32 table, and each group of 8 codes (3 bytes) is
// decoded through it. On x86-64 with AVX2+FMA+F16C the table is one ymm
// register and a group is decoded by a variable shift and a vpermps; the
// portable version does the same with scalar lookups. Both are exact (f16 ->
// f32), so they give the same values. cpu::matmul and cpu::get_row decode CB3
// rows here and dot them in the canonical order (kernels/cpu/tile.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moetier::cpu::detail {

// One CB3 row: codes [cb3_row_bytes(cols)], codebook [8] f16 (any alignment).
using Cb3Decode = void (*)(const uint8_t* codes, const uint8_t* codebook, int64_t cols, float* out);
void decode_cb3_portable(const uint8_t* codes, const uint8_t* codebook, int64_t cols, float* out);
// The fastest version this CPU runs.
Cb3Decode best_cb3_decode();
// out [cols] = row r of a CB3 w, by the selected kernel path's decoder.
void decode_cb3_row(const MatView& w, int64_t r, float* out);

}  // namespace moetier::cpu::detail
