// CPU kernels for CB3 matrices (kernels/cb3.h): a row's 8 f16 centroids are
// turned into an 8-entry f32 table, and each group of 8 codes (3 bytes) is
// decoded through it. On x86-64 with AVX2+FMA+F16C the table is one ymm
// register and a group is decoded by a variable shift and a vpermps; the
// portable version does the same with scalar lookups. The fastest version the
// CPU runs is chosen at run time. cpu::matmul and cpu::get_row dispatch here
// for WeightEncoding::CB3.
//
// Threading: as cpu::matmul (one OpenMP parallel region over row blocks).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moetier::cpu {

// Y [n, rows] = X [n, cols] W^T for a CB3 w.
void matmul_cb3(const MatView& w, const float* x, int64_t n, float* y);
// out [cols] = row r of a CB3 w decoded to f32.
void get_row_cb3(const MatView& w, int64_t r, float* out);

namespace detail {

// One CB3 row: codes [cb3_row_bytes(cols)], codebook [8] f16 (any alignment).
using Cb3Dot = float (*)(const uint8_t* codes, const uint8_t* codebook, const float* x,
                         int64_t cols);
using Cb3Decode = void (*)(const uint8_t* codes, const uint8_t* codebook, int64_t cols, float* out);
float dot_cb3_portable(const uint8_t* codes, const uint8_t* codebook, const float* x, int64_t cols);
void decode_cb3_portable(const uint8_t* codes, const uint8_t* codebook, int64_t cols, float* out);
// The fastest versions this CPU runs.
Cb3Dot best_cb3_dot();
Cb3Decode best_cb3_decode();

}  // namespace detail
}  // namespace moetier::cpu
